"""The lemmatizer's model folder: the library's (unroll/train/model_folder.py), --resume
included (design: 8. Trust).

A resumed run trains the model an uninterrupted one trains, bit for bit; a
folder it cannot continue is refused in one line, naming what is wrong and the
way out, and keeps every byte.
"""

import json
import os
import shutil
from pathlib import Path

import pytest

from examples.lemmatize import __main__ as cli
from examples.lemmatize.model import LEMMATIZER_FILES, Lemmatizer
from examples.lemmatize.train import TrainOptions, train
from examples.pos_tagging.__main__ import main as tagger_main
from tests.cli_helpers import one_line_error
from tests.examples.conftest import TINY_ARGS
from tests.examples.test_lemmatize import write_lemma_corpus
from unroll.train import model_folder as folder

pytestmark = pytest.mark.slow

#: a lemmatizer that trains an epoch of the made-up corpus in well under a second
TINY = {"hidden": 8, "embed": 8, "dropout": 0.2, "batch": 8}
TINY_OPTIONS = ["--hidden", "8", "--embed", "8", "--dropout", "0.2", "--batch", "8"]
#: the log's fields that time the run, the only ones two runs may differ in
TIMINGS = ("seconds", "tokens_per_s")


def fresh(data, model_dir, epochs) -> dict:
    return train(TrainOptions(model_dir=model_dir, data=data, epochs=epochs, lr=1e-2, limit=30,
                              quiet=True, sizes=TINY))


def resume(data, model_dir, *options, epochs=3) -> int:
    return cli.main(["train", "--model-dir", str(model_dir), "--data", str(data), "--epochs",
                     str(epochs), "--lr", "1e-2", "--limit", "30", "--quiet", "--resume",
                     *options])


def contents(root: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())
            if p.is_file() and p.name != folder.LOCK}


def log_of(model_dir: Path) -> list:
    return json.loads((model_dir / folder.LOG).read_text())


def untimed(log: list) -> list:
    return [{k: v for k, v in entry.items() if k not in TIMINGS} for entry in log]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(corpus, folder, the first epoch's last.caffemodel) of a tiny lemmatizer trained two
    epochs: never changed, copy it."""
    root = tmp_path_factory.mktemp("lemma_folder")
    data = write_lemma_corpus(root / "data")
    fresh(data, root / "m", 1)
    first = (root / "m" / "last.caffemodel").read_bytes()
    assert resume(data, root / "m", epochs=2) == 0
    return data, root / "m", first


@pytest.fixture
def model(trained, tmp_path):
    shutil.copytree(trained[1], tmp_path / "m")
    return tmp_path / "m"


def test_resume_trains_what_an_uninterrupted_run_trains_bit_for_bit(tmp_path, capsys):
    """With dropout, shuffles and the Adam history to carry over, and the best epoch an
    earlier one than the last; the resumed leg takes its sizes from the folder."""
    data = write_lemma_corpus(tmp_path / "data")
    fresh(data, tmp_path / "straight", 4)
    fresh(data, tmp_path / "split", 2)
    assert resume(data, tmp_path / "split", epochs=4) == 0
    straight, split = log_of(tmp_path / "straight"), log_of(tmp_path / "split")
    assert [e["epoch"] for e in split] == [1, 2, 3, 4]
    assert untimed(split) == untimed(straight)
    names = ("last.caffemodel", "best.caffemodel", *folder.snapshot_files(straight[-1]))
    for name in names:
        assert (tmp_path / "split" / name).read_bytes() == \
            (tmp_path / "straight" / name).read_bytes(), name
    # the previous snapshot went once the log committed the next
    assert set(contents(tmp_path / "split")) == {"config.json", "features.json", "log.json",
                                                 folder.CURVE, *names}


def test_the_log_is_the_folders_and_names_the_snapshot(trained):
    _, model_dir, _ = trained
    log = folder.read_log(model_dir, LEMMATIZER_FILES)
    assert [e["epoch"] for e in log] == [1, 2]
    assert folder.snapshot_files(log[-1]) <= set(contents(model_dir))
    assert log[-1]["sha256"]["last.caffemodel"] == \
        log[-1]["sha256"][folder.committed_weights(log[-1])]
    for checkpoint in folder.CHECKPOINTS:
        assert Lemmatizer.load(model_dir, checkpoint).predict([("dogs", "NOUN")])[0]


def _flip(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))


def _snapshot(model_dir: Path, suffix: str) -> Path:
    return (model_dir / folder.read_log(model_dir, LEMMATIZER_FILES)[-1]["snapshot"]).with_suffix(
        suffix)


def _without_snapshot(model_dir: Path) -> None:  # a log as this trainer wrote it before
    log = log_of(model_dir)
    for entry in log:
        del entry["snapshot"]
    (model_dir / folder.LOG).write_text(json.dumps(log))


def _set_config(model_dir: Path, **changes) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | changes))


@pytest.mark.parametrize(("damage", "part"), [
    (lambda m: (m / "log.json").unlink(), "log.json is missing"),
    (lambda m: (m / "log.json").write_text("[]"), "names no finished epoch"),
    (lambda m: (m / "features.json").unlink(), "features.json is missing"),
    (lambda m: _snapshot(m, ".solverstate").unlink(), "solverstate, which log.json names, is "
                                                      "missing"),
    (lambda m: _flip(_snapshot(m, ".caffemodel")), ".caffemodel: its checksum"),
    (lambda m: _flip(_snapshot(m, ".solverstate")), ".solverstate: its checksum"),
    (_without_snapshot, "lacks the key 'snapshot'"),
    (lambda m: _set_config(m, hidden=0), "config.json: its checksum is not the one log.json"),
    (lambda m: (m / "features.json").write_text('{"chars": 3}'), "features.json:"),
])
def test_resume_refuses_a_folder_it_cannot_continue(trained, model, damage, part, capsys):
    damage(model)
    before = contents(model)
    assert resume(trained[0], model) == 2
    one_line_error(capsys, "--resume:", part, "--overwrite")
    assert contents(model) == before  # nothing deleted, nothing started over


@pytest.mark.parametrize(("options", "part"), [
    (["--hidden", "16"], "hidden 16 (the folder has 8)"),
    (["--dropout", "0.5", "--batch", "8"], "dropout 0.5 (the folder has 0.2)"),
    (["--seed", "5"], "seed 5 (the folder has 0)"),
    (["--attention", "none"], "attention 'none' (the folder has 'dot')"),
])
def test_resume_with_other_settings_names_them(trained, model, options, part, capsys):
    before = contents(model)
    assert resume(trained[0], model, *options) == 2
    one_line_error(capsys, "--resume:", "other settings", part)
    assert contents(model) == before


def test_resume_with_the_folders_own_settings_continues(trained, model):
    assert resume(trained[0], model, *TINY_OPTIONS, "--seed", "0") == 0
    assert [e["epoch"] for e in log_of(model)] == [1, 2, 3]


def test_a_taggers_folder_and_a_lemmatizers_are_refused_by_each_other(trained, model, options,
                                                                      corpus, tmp_path, capsys):
    tagger_dir = tmp_path / "tagger"
    from examples.pos_tagging.train import train as train_tagger

    train_tagger(options(corpus, tagger_dir, epochs=1))
    before = contents(tagger_dir)
    assert resume(trained[0], tagger_dir) == 2
    one_line_error(capsys, "--resume:", "log.json", "unknown key", "--overwrite")
    assert contents(tagger_dir) == before
    before = contents(model)
    assert tagger_main(["train", "--data", str(corpus), "--model-dir", str(model), "--quiet",
                        "--resume", "--epochs", "3", *TINY_ARGS]) == 2
    one_line_error(capsys, "--resume:", "log.json", "--overwrite")
    assert contents(model) == before


def test_resume_and_overwrite_together_is_a_usage_error(trained, model, capsys):
    with pytest.raises(SystemExit) as stop:
        resume(trained[0], model, "--overwrite")
    assert stop.value.code == 2
    assert "not allowed with argument --resume" in capsys.readouterr().err


def test_resume_of_an_empty_folder_starts_from_the_first_epoch(trained, tmp_path):
    assert resume(trained[0], tmp_path / "new", *TINY_OPTIONS, epochs=1) == 0
    assert [e["epoch"] for e in log_of(tmp_path / "new")] == [1]


def test_a_kill_between_log_and_checkpoint_copy_still_loads_and_is_repaired(trained, model):
    """log.json commits an epoch before last is replaced: the previous epoch's copy is
    vouched for by the previous entry, and the resumed run finishes the copy."""
    _, _, first = trained
    log = log_of(model)
    assert log[0]["sha256"]["last.caffemodel"] != log[1]["sha256"]["last.caffemodel"]
    (model / "last.caffemodel").write_bytes(first)  # as if killed before replacing it
    Lemmatizer.load(model, "last")
    assert resume(trained[0], model, epochs=2) == 0  # nothing to train: only the repair
    assert folder.sha256((model / "last.caffemodel").read_bytes()) == \
        log[-1]["sha256"]["last.caffemodel"]


def test_a_killed_epochs_orphans_are_removed_and_the_named_snapshot_kept(trained, model):
    orphans = [model / "snapshot_iter_99999.caffemodel", model / ".log.json.abcd1234.tmp"]
    for path in orphans:
        path.write_bytes(b"half")
    assert resume(trained[0], model) == 0
    assert not [p for p in orphans if os.path.lexists(p)]
    assert folder.snapshot_files(log_of(model)[-1]) <= set(contents(model))
