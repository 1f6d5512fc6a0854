"""What every application's command line guarantees, parametrized over tests/examples/apps.py.

docs/design.md, 10. Training: the options every application shares refuse a bad value
in one line; Ctrl-C ends a training in one line with status 130, and ``--resume`` then
gives the uninterrupted run's files bit for bit; a folder killed before its first epoch
is trained again without ``--overwrite``; ``fetch`` and ``-o`` work for every one. Each interrupt waits for an event in
the folder (the lock taken, a temp file of an atomic write, log.json committing an
epoch), never for a number of seconds; they come in an order drawn by a seeded generator.
"""

import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_helpers import one_line_error
from tests.examples.apps import APPS
from tests.hang import limit
from unroll.train import model_folder as folder

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 3
#: where Ctrl-C lands: as soon as the trainer holds the folder; at the first temp file of an
#: atomic write once n epochs are committed (n = 0: the application's own files, before any
#: epoch); right after epoch n is committed
EVENTS = [("locked", 0), ("writing", 0), ("committed", 1), ("writing", 1), ("committed", 2),
          ("writing", 2)]


def python(app, *args, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]), MPLBACKEND="Agg")
    return subprocess.run([sys.executable, *app.command(*args)], cwd=REPO, env=env,
                          capture_output=True, timeout=limit(200), **kwargs)


def train_argv(app, data: Path, model_dir: Path, *extra: str) -> list[str]:
    return ["train", "--data", str(data), "--model-dir", str(model_dir), "--epochs",
            str(EPOCHS), "--quiet", *app.train, *extra]


@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
@pytest.mark.parametrize("option, value", [("--epochs", "0"), ("--limit", "-1"),
                                           ("--limit", "0"), ("--max-minutes", "-1"),
                                           ("--seed", "-2"), ("--threads", "0")])
def test_a_bad_count_is_refused_in_one_line_and_leaves_no_folder(app, option, value, tmp_path,
                                                                 capsys):
    model_dir = tmp_path / "m"
    main = importlib.import_module(f"{app.module}.__main__").main
    with pytest.raises(SystemExit) as stop:
        main(train_argv(app, app.corpus(tmp_path / "data"), model_dir, option, value))
    assert stop.value.code == 2
    one_line_error(capsys, f"python -m {app.module} train: error: argument {option}: expected")
    assert not model_dir.exists()


def committed(model_dir: Path) -> int:
    try:
        return len(json.loads((model_dir / folder.LOG).read_text()))
    except (OSError, ValueError):  # log.json is replaced by a rename: a reader sees either
        return 0


def temps(model_dir: Path) -> set[str]:
    try:
        return {p.name for p in model_dir.iterdir() if p.name.endswith(".tmp")}
    except FileNotFoundError:
        return set()


def holds_lock(model_dir: Path, pid: int) -> bool:
    try:
        return (model_dir / folder.LOCK).read_text().strip() == str(pid)
    except FileNotFoundError:
        return False


def wait_for(event: str, n: int, run: subprocess.Popen, model_dir: Path) -> bool:
    """Poll the folder until ``event`` (after ``n`` commits); False if the run ended first."""
    started = time.monotonic()
    while True:
        if run.poll() is not None:
            return False
        assert time.monotonic() - started < limit(200), f"no {event!r} event"
        if holds_lock(model_dir, run.pid) and (
            event == "locked" or (event == "committed" and committed(model_dir) >= n)
            or (event == "writing" and committed(model_dir) >= n and temps(model_dir))
        ):
            return True
        time.sleep(0.001)


def final_files(model_dir: Path) -> dict:
    """The bytes of the last epoch's weights, solver state and average, and the log without
    its times."""
    log = json.loads((model_dir / folder.LOG).read_text())
    names = sorted(folder.snapshot_files(log[-1]) | {"last.caffemodel", "best.caffemodel"})
    kept = {name: (model_dir / name).read_bytes() for name in names}
    kept[folder.LOG] = [{k: v for k, v in e.items() if k not in ("seconds", "tokens_per_s")}
                        for e in log]
    return kept


@pytest.mark.slow
@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_ctrl_c_anywhere_is_one_line_130_and_resume_gives_the_uninterrupted_run(app, tmp_path):
    data = app.corpus(tmp_path / "data")
    whole = tmp_path / "whole"
    done = python(app, *train_argv(app, data, whole))
    assert done.returncode == 0, done.stderr.decode()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]), MPLBACKEND="Agg")
    for k, (event, n) in enumerate(random.Random(33).sample(EVENTS, len(EVENTS))):
        model_dir = tmp_path / f"interrupted-{k}"
        run = subprocess.Popen([sys.executable, *app.command(*train_argv(app, data, model_dir))],
                               cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        try:
            if wait_for(event, n, run, model_dir):
                run.send_signal(signal.SIGINT)
            _, err = run.communicate(timeout=limit(200))
        finally:
            run.kill()
        err = err.decode()
        if run.returncode != 0:  # else the run ended before the event
            assert run.returncode == 130, err
            assert err.strip().splitlines() == [
                f"python -m {app.module} train: interrupted; resume with --resume"], err
        resumed = python(app, *train_argv(app, data, model_dir, "--resume"))
        assert resumed.returncode == 0, (event, n, resumed.stderr.decode())
        assert final_files(model_dir) == final_files(whole), (event, n)


@pytest.mark.slow
@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_a_folder_killed_before_its_first_epoch_is_trained_without_overwrite(app, tmp_path):
    data, model_dir = app.corpus(tmp_path / "data"), tmp_path / "m"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]), MPLBACKEND="Agg")
    run = subprocess.Popen([sys.executable, *app.command(*train_argv(app, data, model_dir))],
                           cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_for("writing", 0, run, model_dir), run.communicate()[1].decode()
        run.kill()
        run.communicate(timeout=limit(200))
    finally:
        run.kill()
    assert committed(model_dir) == 0
    again = python(app, *train_argv(app, data, model_dir))
    assert again.returncode == 0, again.stderr.decode()
    whole = tmp_path / "whole"
    assert python(app, *train_argv(app, data, whole)).returncode == 0
    assert final_files(model_dir) == final_files(whole)


@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_every_application_fetches_and_says_in_one_line_why_it_could_not(app, capsys):
    main = importlib.import_module(f"{app.module}.__main__").main
    # conftest points the mirror at a closed port on 127.0.0.1
    assert main(["fetch", "--quiet"]) == 2
    one_line_error(capsys, f"python -m {app.module} fetch: error: ", "127.0.0.1")


@pytest.mark.slow
@pytest.mark.parametrize("app", APPS, ids=lambda a: a.name)
def test_o_writes_what_standard_output_gets(app, tmp_path, capsys):
    from unroll.tools.ewt import DEV_FILE

    main = importlib.import_module(f"{app.module}.__main__").main
    data = app.corpus(tmp_path / "data")
    model_dir = tmp_path / "m"
    assert main([*train_argv(app, data, model_dir), "--epochs", "1"]) == 0  # the last counts
    folder_args = ["--model-dir", str(model_dir)]
    for command in (app.predict, app.evaluate):
        argv = [a.replace("{input}", str(data / DEV_FILE)) for a in command] + folder_args
        if command is app.evaluate:
            argv += ["--data", str(data)]
        capsys.readouterr()
        assert main(argv) == 0
        printed = capsys.readouterr().out.encode()
        out = tmp_path / f"{command[0]}.out"
        assert main([*argv, "-o", str(out)]) == 0
        assert capsys.readouterr().out == "" and out.read_bytes() == printed and printed
