"""--max-minutes: no limit unless given, and a run it stops says so (train.py, __main__.py).

A limit of 0 minutes with a resumed run stops before the next epoch whatever the
machine's speed: the time already logged is counted.
"""

import itertools
import json

from examples.pos_tagging.__main__ import build_parser, main
from examples.pos_tagging.train import TrainOptions, train


def test_there_is_no_time_limit_unless_one_is_given(corpus, tmp_path, options):
    assert TrainOptions(data=corpus, model_dir=tmp_path).max_minutes is None
    assert build_parser().parse_args(["train"]).max_minutes is None
    result = train(options(corpus, tmp_path / "m", epochs=2))
    assert result["epoch"] == 2 and "stopped" not in result
    assert all("stopped" not in e for e in json.loads((tmp_path / "m" / "log.json").read_text()))


def test_a_run_the_limit_stops_says_so_in_the_log_and_on_the_last_line(corpus, tmp_path,
                                                                        capsys, tiny_args):
    model_dir = tmp_path / "m"
    argv = ["train", "--data", str(corpus), "--model-dir", str(model_dir), "--quiet", *tiny_args]
    assert main([*argv, "--epochs", "1"]) == 0
    capsys.readouterr()
    assert main([*argv, "--epochs", "3", "--resume", "--max-minutes", "0"]) == 0
    stopped = "stopped by --max-minutes after 1 of 3 epochs"
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"done: {stopped}, last dev UPOS "), last
    log = json.loads((model_dir / "log.json").read_text())
    assert [e["epoch"] for e in log] == [1] and log[-1]["stopped"] == stopped

    assert main([*argv, "--epochs", "2", "--resume"]) == 0  # no limit: it trains on
    log = json.loads((model_dir / "log.json").read_text())
    assert [e["epoch"] for e in log] == [1, 2] and "stopped" not in log[-1]
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("done: 2 epochs")


def test_a_limit_reached_before_the_first_epoch_says_so(corpus, tmp_path, options, monkeypatch):
    import time

    # the data reading alone takes longer than the limit: the clock jumps a minute per read
    # (the Trainer reads time.perf_counter unless given a clock)
    clock = itertools.count(0, 60)
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    result = train(options(corpus, tmp_path / "m", epochs=3, max_minutes=0.5))
    assert result == {"stopped": "stopped by --max-minutes after 0 of 3 epochs"}
    assert not (tmp_path / "m" / "log.json").exists()
