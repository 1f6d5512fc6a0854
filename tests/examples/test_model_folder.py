"""The trainer's model folder: write order, refusal, lock, divergence, resume."""

import json
import os

import numpy as np
import pytest

from examples.pos_tagging import train as train_module
from examples.pos_tagging.features import Featurizer
from examples.pos_tagging.schemas import TAGGER_FILES
from examples.pos_tagging.tagger import Tagger, TaggerConfig
from examples.pos_tagging.train import train
from unroll.core.errors import FileFormatError, NetError
from unroll.engine.net import Net
from unroll.train import model_folder as folder
from unroll.train.model_folder import ModelFolderError
from unroll.train.trainer import TrainingDiverged

pytestmark = pytest.mark.slow


def weights(path):
    return path.read_bytes()


def test_a_trained_folder_holds_what_its_log_names_and_loads(options, corpus, tmp_path):
    model_dir = tmp_path / "m"
    train(options(corpus, model_dir))
    log = folder.read_log(model_dir, TAGGER_FILES)
    assert [e["epoch"] for e in log] == [1, 2]
    names = {p.name for p in model_dir.iterdir()}
    assert folder.snapshot_files(log[-1]) <= names
    assert not [n for n in names if n.startswith("snapshot_iter_") and
                n not in folder.snapshot_files(log[-1])]  # the first epoch's snapshot is gone
    for checkpoint in folder.CHECKPOINTS:
        tagged = Tagger.load(model_dir, checkpoint).predict([["the", "cat", "sees", "."]])
        assert tagged[0].shape == (4,)


def test_a_folder_holding_a_model_is_refused_without_resume_or_overwrite(options, corpus, tmp_path):
    model_dir = tmp_path / "m"
    train(options(corpus, model_dir, epochs=1))
    best = weights(model_dir / "best.caffemodel")
    with pytest.raises(ModelFolderError, match="already holds a model.*--resume.*--overwrite"):
        train(options(corpus, model_dir, epochs=1, seed=5))
    assert weights(model_dir / "best.caffemodel") == best
    train(options(corpus, model_dir, epochs=1, seed=5, overwrite=True))
    assert weights(model_dir / "best.caffemodel") != best
    assert [e["epoch"] for e in folder.read_log(model_dir, TAGGER_FILES)] == [1]


def test_a_second_trainer_on_one_folder_is_refused(options, corpus, tmp_path):
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    with folder.claimed(model_dir, False, False, TAGGER_FILES), pytest.raises(
            ModelFolderError, match="in use by another"):
        train(options(corpus, model_dir, epochs=1))
    assert not (model_dir / "config.json").exists()


def test_resume_with_other_sizes_names_them(options, corpus, tmp_path):
    model_dir = tmp_path / "m"
    train(options(corpus, model_dir, epochs=1))
    opts = options(corpus, model_dir, epochs=2, resume=True)
    opts.sizes = {"hidden": 64, "embed": 8}
    with pytest.raises(ModelFolderError, match="hidden 64 \\(the folder has 8\\)"):
        train(opts)
    opts.sizes = {"embed": 8}  # agreeing sizes are fine
    opts.seed = 5  # the folder's seed is 0: its shuffles and dropout would not continue
    with pytest.raises(ModelFolderError, match="seed 5 \\(the folder has 0\\)"):
        train(opts)
    opts.seed = None
    assert train(opts)["epoch"] == 2


def test_an_empty_train_file_is_an_error_and_leaves_no_folder(options, corpus, tmp_path):
    (corpus / train_module.TRAIN_FILE).write_text("")
    with pytest.raises(FileFormatError, match="en_ewt-ud-train.conllu: holds no sentences"):
        train(options(corpus, tmp_path / "m"))
    assert not (tmp_path / "m").exists()


def test_divergence_stops_before_anything_is_written(options, corpus, tmp_path, monkeypatch):
    model_dir = tmp_path / "m"
    train(options(corpus, model_dir, epochs=1))
    before = {p.name: p.read_bytes() for p in model_dir.iterdir()}
    backward = Net.backward

    def overflowing(net):  # NaN gradients, as a resumed run that diverges gives
        backward(net)
        net.store.diff[...] = np.nan

    with monkeypatch.context() as patch:
        patch.setattr(Net, "backward", overflowing)
        with pytest.raises(TrainingDiverged, match="epoch 2.*nan.*keeps epoch 1.*--resume"):
            train(options(corpus, model_dir, epochs=3, resume=True))
    assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == before
    tagger = Tagger.load(model_dir, "last")
    assert all(np.isfinite(p.blob.data).all() for p in tagger.train_model.learnable_params)
    assert train(options(corpus, model_dir, epochs=2, resume=True))["epoch"] == 2


def test_divergence_in_a_fresh_run_leaves_a_folder_that_holds_no_model(
        options, corpus, tmp_path, capsys):
    model_dir = tmp_path / "m"
    with pytest.raises(TrainingDiverged, match="no epoch had ended"):
        train(options(corpus, model_dir, lr=1e38))
    assert not list(model_dir.glob("*.caffemodel"))
    # no epoch was logged: --resume starts from the first, saying so (design: 8. Trust)
    assert train(options(corpus, model_dir, epochs=1, resume=True))["epoch"] == 1
    assert "holds no finished epoch yet; starting from epoch 1" in capsys.readouterr().err


def test_bad_batches_are_skipped_up_to_the_limit(options, corpus, tmp_path, monkeypatch):
    calls = []
    backward = Net.backward

    def second_is_bad(net):
        backward(net)
        calls.append(1)
        if len(calls) == 2:  # a NaN gradient, as an overflowing batch gives
            net.store.diff[...] = np.nan

    monkeypatch.setattr(Net, "backward", second_is_bad)
    with pytest.raises(TrainingDiverged, match="batch 2 .*gradient norm nan"):
        train(options(corpus, tmp_path / "a", epochs=1))
    calls.clear()
    result = train(options(corpus, tmp_path / "b", epochs=1, skip_bad_batches=1))
    # the skipped batch counts as an iteration; had its update been applied, the weights
    # would be NaN and the epoch's end would have stopped training
    assert result["iter"] == len(calls) >= 3


def test_resume_continues_exactly_where_the_run_stopped(options, corpus, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(options(corpus, straight, epochs=2))
    train(options(corpus, split, epochs=1))
    train(options(corpus, split, epochs=2, resume=True))
    for name in ("last.caffemodel", folder.read_log(split, TAGGER_FILES)[-1]["snapshot"]):
        assert weights(split / name) == weights(straight / name)


def test_a_killed_epoch_leaves_orphans_that_the_next_run_removes(options, corpus, tmp_path):
    model_dir = tmp_path / "m"
    train(options(corpus, model_dir, epochs=1))
    orphans = [model_dir / "snapshot_iter_99.caffemodel", model_dir / ".log.json.abcd1234.tmp"]
    for path in orphans:
        path.write_bytes(b"half")
    train(options(corpus, model_dir, epochs=2, resume=True))
    assert not any(p.exists() for p in orphans)


def test_model_files_are_written_atomically(tmp_path, monkeypatch):
    f = Featurizer.build([["a", "b"]])
    config = TaggerConfig()
    f.save(tmp_path / "features.json")
    config.save(tmp_path / "config.json")

    def crash(src, dst):
        raise OSError("killed")

    monkeypatch.setattr(os, "replace", crash)
    for save, name in ((f.save, "features.json"), (config.save, "config.json")):
        with pytest.raises(OSError, match="killed"):
            save(tmp_path / name)
    monkeypatch.undo()
    assert Featurizer.load(tmp_path / "features.json").sizes == f.sizes
    assert TaggerConfig.load(tmp_path / "config.json") == config
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "features.json"]


@pytest.mark.parametrize("text, problem", [
    ("", "not valid JSON"),
    ("[1, 2]", "expected an object"),
    ('{"hidden": 8, "colour": 1}', "unknown key.*colour"),
    ('{"hidden": -3}', "hidden must be an integer >= 1"),
    ('{"cell": "/tmp/elsewhere.prototxt.j2"}', "cell .* neither a built-in"),
    ('{"cell": "../lstm.prototxt.j2"}', "cell .* neither a built-in"),
])
def test_a_bad_config_json_names_the_file(tiny, tmp_path, text, problem):
    model_dir = tmp_path / "m"
    Tagger(Featurizer.build([["a"]]), TaggerConfig(**tiny)).save(model_dir, "best")
    (model_dir / "config.json").write_text(text)
    with pytest.raises(FileFormatError, match=f"config.json: {problem}"):
        Tagger.load(model_dir, "best")


def test_a_folder_template_loads_from_the_folder_only(options, corpus, tmp_path):
    from unroll.frontend.unroller import builtin_template_dir

    mine = tmp_path / "mycell.prototxt.j2"
    mine.write_text((builtin_template_dir() / "rnn.prototxt.j2").read_text())
    model_dir = tmp_path / "m"
    opts = options(corpus, model_dir, epochs=1)
    opts.sizes["cell"] = str(mine)
    train(opts)
    assert json.loads((model_dir / "config.json").read_text())["cell"] == "mycell.prototxt.j2"
    mine.unlink()  # the folder keeps its own copy
    assert Tagger.load(model_dir, "best").predict([["a", "dog"]])[0].shape == (2,)


@pytest.mark.parametrize("damage, error, problem", [
    (lambda b: b"", FileFormatError, "best.caffemodel: holds no weights"),
    (lambda b: b"\xff" * 64, FileFormatError, "best.caffemodel: not a .caffemodel"),
    (lambda b: b[: len(b) // 3], (FileFormatError, NetError), "best.caffemodel"),
])
def test_damaged_weights_never_load_silently(tiny, tmp_path, damage, error, problem):
    model_dir = tmp_path / "m"
    Tagger(Featurizer.build([["a"]]), TaggerConfig(**tiny)).save(model_dir, "best")
    path = model_dir / "best.caffemodel"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(error, match=problem):
        Tagger.load(model_dir, "best")


def test_resume_from_an_empty_snapshot_is_an_error_naming_it(options, corpus, tmp_path):
    model_dir = tmp_path / "m"
    train(options(corpus, model_dir, epochs=1))
    entry = folder.read_log(model_dir, TAGGER_FILES)[-1]
    snapshot = (model_dir / entry["snapshot"]).with_suffix(".caffemodel")
    snapshot.write_bytes(b"")
    # the log's checksum finds it before the solver reads it
    with pytest.raises(ModelFolderError, match=f"{snapshot.name}: its checksum.*--overwrite"):
        train(options(corpus, model_dir, epochs=2, resume=True))
