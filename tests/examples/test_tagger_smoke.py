"""A short real training run of the POS tagger, then `evaluate` and `tag` on its checkpoint."""

from collections import Counter

import numpy as np
import pytest

from examples.pos_tagging.__main__ import main
from examples.pos_tagging.packing import training_sampler
from examples.pos_tagging.train import DEV_FILE, TRAIN_FILE, TrainOptions, train
from unroll.tools.conllu import read_conllu, write_conllu
from unroll.tools.ewt import DATA_ENV, data_dir

pytestmark = pytest.mark.slow

EWT = data_dir()
needs_ewt = pytest.mark.skipif(
    not (EWT / TRAIN_FILE).is_file(),
    reason=f"UD English EWT not found at {EWT} (set {DATA_ENV} to its folder)",
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    train_sents = [s for _, s in zip(range(320), read_conllu(EWT / TRAIN_FILE))]
    dev_sents = [s for _, s in zip(range(120), read_conllu(EWT / DEV_FILE))]
    for name, sents in ((TRAIN_FILE, train_sents), (DEV_FILE, dev_sents)):
        write_conllu([f for f, _ in sents], [t for _, t in sents], data / name)
    model_dir = tmp_path_factory.mktemp("model")
    train(TrainOptions(data=data, model_dir=model_dir, epochs=3, quiet=True, lr=5e-3))
    return data, model_dir, train_sents, dev_sents


@needs_ewt
def test_training_lowers_the_loss_and_beats_the_majority_tag(trained):
    import json

    data, model_dir, train_sents, dev_sents = trained
    log = json.loads((model_dir / "log.json").read_text())
    assert [e["epoch"] for e in log] == [1, 2, 3]
    # packed rows of 32 a batch (the default), every sentence once an epoch
    lengths = [len(forms) for forms, _ in train_sents]
    assert log[-1]["iter"] == 3 * len(training_sampler(lengths, batch=32)) >= 15
    assert log[-1]["train_loss"] < 0.8 * log[0]["train_loss"]
    majority = Counter(t for _, tags in train_sents for t in tags).most_common(1)[0][0]
    dev_tags = [t for _, tags in dev_sents for t in tags]
    baseline = np.mean([t == majority for t in dev_tags])
    assert max(e["dev_accuracy"] for e in log) > baseline + 0.1
    for name in ("best.caffemodel", "features.json", "config.json", "curve.png",
                 log[-1]["snapshot"]):
        assert (model_dir / name).is_file(), name


@needs_ewt
def test_evaluate_and_tag_run_on_the_checkpoint(trained, tmp_path, capsys):
    data, model_dir, _, _ = trained
    assert main(["evaluate", "--model-dir", str(model_dir), str(data / DEV_FILE)]) == 0
    out = capsys.readouterr().out
    assert "UPOS accuracy" in out and "NOUN" in out and "confusions" in out

    text = tmp_path / "raw.txt"
    text.write_text("The cat sat on the mat .\nI like green tea\n")
    assert main(["tag", "--model-dir", str(model_dir), str(text)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert [tok.rsplit("/", 1)[0] for tok in lines[0].split()] == "The cat sat on the mat .".split()

    assert main(["tag", "--model-dir", str(model_dir), "--conllu", str(data / DEV_FILE)]) == 0
    tagged = tmp_path / "tagged.conllu"
    tagged.write_text(capsys.readouterr().out)
    assert len(list(read_conllu(tagged))) == 120


@needs_ewt
def test_resume_continues_from_the_last_snapshot(trained, tmp_path):
    import json
    import shutil

    data, model_dir, _, _ = trained
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    train(TrainOptions(data=data, model_dir=copy, epochs=4, quiet=True, lr=5e-3, resume=True))
    log = json.loads((copy / "log.json").read_text())
    assert [e["epoch"] for e in log] == [1, 2, 3, 4]
    assert log[3]["iter"] > log[2]["iter"]


def test_missing_data_says_what_to_download(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path), "--model-dir", str(tmp_path / "m")]) == 2
    assert "UD_English-EWT" in capsys.readouterr().err
