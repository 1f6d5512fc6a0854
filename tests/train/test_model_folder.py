"""The model folder of the library (design: 8. Trust), driven as any application drives it:
declare the files (ModelFiles), claim the folder, commit epochs, read it back.

Every file the folder reads is vouched for by log.json or refused in one line; a FIFO, a
device or a link to one in place of any of them is refused at once; a folder that a kill
left before its first logged epoch holds no model and trains again.
"""

import json
import os
from pathlib import Path

import pytest

from tests.hang import at_once
from unroll.core.errors import FileFormatError
from unroll.core.json_files import count, finite
from unroll.train import model_folder as folder
from unroll.train.model_folder import ModelFiles, ModelFolderError

LABELS = ["nsubj", "obj", "root"]
CONFIG_SCHEMA = {"type": "object", "additionalProperties": False,
                 "properties": {"hidden": count(64),
                                "labels": {"type": "array", "items": {"type": "string"}}}}
FEATURES_SCHEMA = {"type": "object", "additionalProperties": False,
                   "properties": {"tokens": {"type": "array", "items": {"type": "string"}}}}
FILES = ModelFiles(folder.epoch_log_schema({"dev_accuracy": finite(1)}, ["dev_accuracy"]),
                   {folder.CONFIG: CONFIG_SCHEMA, folder.FEATURES: FEATURES_SCHEMA})


class Solver:
    """What commit_epoch asks of a solver: its iteration, and a snapshot of two files."""

    def __init__(self):
        self.iter = 0

    def snapshot(self, prefix: Path):
        state, weights = (Path(f"{prefix}_iter_{self.iter}{s}")
                          for s in (".solverstate", ".caffemodel"))
        weights.write_bytes(f"weights at {self.iter}".encode())
        state.write_bytes(f"state at {self.iter}".encode())
        return weights, state


def describe(model_dir: Path) -> None:
    folder.write_json(model_dir / folder.CONFIG, {"hidden": 8, "labels": LABELS})
    folder.write_json(model_dir / folder.FEATURES, {"tokens": ["<pad>", "<unk>", "the", "a"]})


def train(model_dir: Path, epochs: int = 2, resume: bool = False) -> list:
    solver = Solver()
    with folder.claimed(model_dir, resume, False, FILES):
        log = folder.read_log(model_dir, FILES) if resume else []
        if not log:
            describe(model_dir)
        for epoch in range(len(log) + 1, len(log) + epochs + 1):
            solver.iter = 10 * epoch
            entry = {"epoch": epoch, "iter": solver.iter, "dev_accuracy": 0.5}
            folder.commit_epoch(model_dir, solver, log, entry, is_best=epoch == 1, files=FILES)
    return log


def read_back(model_dir: Path):
    """Everything an application reads from its folder to use the model."""
    log = folder.read_log(model_dir, FILES)
    described = [folder.read_json(model_dir, FILES, name, log) for name in FILES.json]
    weights = [folder.verified(model_dir / folder.checkpoint_name(c),
                               folder.checkpoint_checksums(log, c)) for c in folder.CHECKPOINTS]
    return log, described, weights


@pytest.fixture
def model(tmp_path) -> Path:
    model_dir = tmp_path / "m"
    train(model_dir)
    return model_dir


def test_a_committed_folder_reads_back_and_its_log_checksums_every_file(model):
    log, (config, features), weights = read_back(model)
    assert [e["epoch"] for e in log] == [1, 2]
    assert config["labels"] == LABELS and features["tokens"][2] == "the"
    assert weights == [b"weights at 10", b"weights at 20"]  # best (epoch 1), last
    assert set(log[-1]["sha256"]) == {folder.CONFIG, folder.FEATURES, "best.caffemodel",
                                      "last.caffemodel", "snapshot_iter_20.caffemodel",
                                      "snapshot_iter_20.solverstate"}
    assert folder.resumable_log(model, FILES) == log


def _rewrite_json(name, change):
    def damage(model_dir):
        value = json.loads((model_dir / name).read_text())
        change(value)
        (model_dir / name).write_text(json.dumps(value))
    return damage


def _flip(name):
    def damage(model_dir):
        data = bytearray((model_dir / name).read_bytes())
        data[-1] ^= 1
        (model_dir / name).write_bytes(bytes(data))
    return damage


#: (damage, the name the refusal gives, whether the resume refuses too: it copies a damaged
#: last.caffemodel again from the verified snapshot, as after a kill in mid-copy)
TAMPERED = {
    "config: labels reversed": (_rewrite_json(folder.CONFIG, lambda c: c["labels"].reverse()),
                                folder.CONFIG, True),
    "features: a reordered vocabulary": (
        _rewrite_json(folder.FEATURES, lambda f: f["tokens"].reverse()), folder.FEATURES, True),
    "log: the checksums of best": (
        _rewrite_json(folder.LOG, lambda log: [e["sha256"].update(
            {"best.caffemodel": "0" * 64}) for e in log]), "best.caffemodel", True),
    "log: an unknown key": (_rewrite_json(folder.LOG, lambda log: log[0].update(lr=0.1)),
                            folder.LOG, True),
    "weights: best": (_flip("best.caffemodel"), "best.caffemodel", True),
    "weights: last": (_flip("last.caffemodel"), "last.caffemodel", False),
}


@pytest.mark.parametrize("damage, named, resume_refuses", TAMPERED.values(), ids=TAMPERED)
def test_each_tampered_file_is_refused_in_one_line_naming_it(model, damage, named,
                                                             resume_refuses):
    damage(model)
    with pytest.raises(FileFormatError) as e:
        read_back(model)
    assert "\n" not in str(e.value) and named in str(e.value)
    if resume_refuses:
        with pytest.raises(ModelFolderError) as e:
            folder.resumable_log(model, FILES)
        assert "\n" not in str(e.value) and named in str(e.value)
    else:
        folder.resumable_log(model, FILES)
        assert read_back(model)[2][1] == b"weights at 20"


def test_a_damaged_snapshot_refuses_the_resume(model):
    _flip("snapshot_iter_20.caffemodel")(model)
    with pytest.raises(ModelFolderError, match="snapshot_iter_20.caffemodel: its checksum"):
        folder.resumable_log(model, FILES)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _link_to_fifo_inside(path: Path) -> None:
    os.mkfifo(path.with_name("pipe"))
    path.symlink_to("pipe")


READ = [folder.LOG, folder.CONFIG, folder.FEATURES, "best.caffemodel", "last.caffemodel",
        "snapshot_iter_20.caffemodel", "snapshot_iter_20.solverstate"]


@pytest.mark.parametrize("name", READ)
@pytest.mark.parametrize("replace", [_fifo, _device, _link_to_fifo_inside])
def test_a_fifo_a_device_or_a_link_to_one_in_place_of_a_file_is_refused_at_once(
        model, name, replace):
    (model / name).unlink()
    replace(model / name)
    if not name.startswith("snapshot"):
        with pytest.raises(FileFormatError, match=name):
            at_once(read_back, model)
    try:
        at_once(folder.resumable_log, model, FILES)
    except ModelFolderError as e:
        assert "\n" not in str(e) and name in str(e)
        assert any(kind in str(e) for kind in ("FIFO", "device", "leading out of"))
    else:  # a resume writes last.caffemodel (in the folder) again, from the verified snapshot
        assert name == "last.caffemodel"
        assert (model / name).is_file() and not (model / name).is_symlink()


def test_a_folder_killed_before_its_first_logged_epoch_trains_without_overwrite(tmp_path):
    model_dir = tmp_path / "m"
    with folder.claimed(model_dir, False, False, FILES):
        describe(model_dir)
        Solver().snapshot(model_dir / folder.SNAPSHOT_PREFIX)  # killed before log.json
    assert not folder.holds_model(folder.model_files(model_dir, FILES))
    assert [e["epoch"] for e in train(model_dir, epochs=1)] == [1]


def test_resume_on_a_folder_without_a_model_starts_from_epoch_1_saying_so(tmp_path, capsys):
    model_dir = tmp_path / "m"
    with folder.claimed(model_dir, False, False, FILES):
        describe(model_dir)
    assert [e["epoch"] for e in train(model_dir, epochs=1, resume=True)] == [1]
    assert "holds no finished epoch yet; starting from epoch 1" in capsys.readouterr().err
    assert [e["epoch"] for e in train(model_dir, epochs=1, resume=True)] == [1, 2]


def test_a_folder_that_holds_a_model_is_refused_without_resume_or_overwrite(model):
    with pytest.raises(ModelFolderError, match="already holds a model.*--resume.*--overwrite"):
        train(model)
    with folder.claimed(model, False, True, FILES):
        assert not folder.model_files(model, FILES)  # --overwrite: the model is gone


@pytest.mark.parametrize("name", [folder.LOG, folder.LOCK, "../config.json", "last.caffemodel",
                                  "snapshot_iter_3.solverstate"])
def test_an_application_cannot_declare_a_file_of_the_trainer_or_outside_the_folder(name):
    with pytest.raises(ValueError, match="cannot be an application's file"):
        ModelFiles(FILES.log_schema, {name: CONFIG_SCHEMA})
