"""examples/deprel: reading trees from CoNLL-U, labelling, and training on a made-up corpus."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from examples.deprel import __main__ as cli
from examples.deprel.conll import fill_deprel, read_deprel
from examples.deprel.labeller import DeprelConfig, Labeller
from examples.pos_tagging.features import Featurizer
from tests.examples.trees import conllu, sentence, write_trees
from tests.hang import limit
from unroll.tools.conllu import CoNLLUError
from unroll.tools.ewt import DEV_FILE, TRAIN_FILE


def test_the_reader_reads_heads_and_relations_past_multiword_and_empty_node_lines(tmp_path):
    path = tmp_path / "dev.conllu"
    rng = np.random.default_rng(1)
    sentences = [sentence(rng) for _ in range(3)]
    path.write_text(conllu(sentences, multiword=True))
    read = read_deprel(path)
    assert [s.heads for s in read] == [[h for _, _, h, _ in rows] for rows in sentences]
    assert [s.deprels for s in read] == [[d for _, _, _, d in rows] for rows in sentences]
    assert all(s.tree.parents[s.heads.index(0)] == -1 for s in read)


BAD = {
    "cycle": ("1\ta\t_\tDET\t_\t_\t2\tdet\t_\t_\n2\tb\t_\tNOUN\t_\t_\t1\tnsubj\t_\t_\n"
              "3\tc\t_\tVERB\t_\t_\t0\troot\t_\t_\n", 2, r"not a tree: .*nodes \[0, 1\] form a "
                                                        r"cycle"),
    "head out of range": ("1\ta\t_\tNOUN\t_\t_\t0\troot\t_\t_\n2\tb\t_\tNOUN\t_\t_\t7\tdep\t_"
                          "\t_\n", 3, r"HEAD 7 is not a word of the sentence \(words 1\.\.2"),
    "several roots": ("1\ta\t_\tNOUN\t_\t_\t0\troot\t_\t_\n2\tb\t_\tNOUN\t_\t_\t0\troot\t_\t_\n",
                      2, r"not a tree: .*several roots"),
    "no head": ("1\ta\t_\tNOUN\t_\t_\t_\troot\t_\t_\n", 2, r"HEAD \(column 7\) must be a word "
                                                         r"number or 0, found '_'"),
    # int() would read each of these as a number
    **{f"head {head!r}": (f"1\ta\t_\tNOUN\t_\t_\t0\troot\t_\t_\n2\tb\t_\tNOUN\t_\t_\t{head}\tdep"
                          f"\t_\t_\n", 3, rf"HEAD \(column 7\) must be a word number or 0, "
                                          rf"found {re.escape(repr(head))}")
       for head in ("0_1", "\uff11", " 1", "1 ", "01", "+1")},
    "no relation": ("1\ta\t_\tNOUN\t_\t_\t0\t_\t_\t_\n", 2, r"missing DEPREL"),
    "head 0_1": ("1\ta\t_\tNOUN\t_\t_\t0_1\troot\t_\t_\n", 2,
              r"HEAD \(column 7\) must be a word number or 0, found '0_1'"),
    "head fullwidth": ("1\ta\t_\tNOUN\t_\t_\t０\troot\t_\t_\n", 2,
                    r"HEAD \(column 7\) must be a word number or 0, found '０'"),
    "head padded": ("1\ta\t_\tNOUN\t_\t_\t 0\troot\t_\t_\n", 2,
                 r"HEAD \(column 7\) must be a word number or 0, found ' 0'"),
    "multiword range past the end": ("1-3\tab\t_\t_\t_\t_\t_\t_\t_\t_\n1\ta\t_\tNOUN\t_\t_\t0\t"
                                     "root\t_\t_\n", 2, r"multiword range ends at word 3"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_trees_name_the_file_and_line(tmp_path, case):
    text, line, message = BAD[case]
    path = tmp_path / "bad.conllu"
    path.write_text("# sent_id = x\n" + text + "\n")
    with pytest.raises(CoNLLUError, match=rf"bad\.conllu:{line}: {message}"):
        read_deprel(path)


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
@pytest.mark.parametrize("bom", ["", "\ufeff"], ids=["", "BOM"])
def test_label_fill_keeps_every_other_byte(tmp_path, end, bom):
    rng = np.random.default_rng(2)
    sentences = [sentence(rng) for _ in range(2)]
    text = conllu(sentences, multiword=True).replace("\n", end)
    text = bom + text.replace("\tdet\t", "\t_\t")
    src = tmp_path / "in.conllu"
    src.write_bytes(text.encode())
    sents = read_deprel(src, labelled=False)
    assert [s.heads for s in sents] == [[h for _, _, h, _ in rows] for rows in sentences]
    out = tmp_path / "out.conllu"
    fill_deprel(src, [["L"] * len(s.forms) for s in sents], out)
    got, want = out.read_bytes().split(end.encode()), text.encode().split(end.encode())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        gc, wc = g.split(b"\t"), w.split(b"\t")
        if len(wc) == 10 and wc[0].lstrip(b"\xef\xbb\xbf").isdigit():
            assert gc[:7] + gc[8:] == wc[:7] + wc[8:] and gc[7] == b"L"
        else:
            assert g == w


@pytest.fixture(scope="module", params=["tree", "baseline"])
def trained(tmp_path_factory, request):
    """A labeller of each model trained on the made-up corpus (once a module: seconds)."""
    data = write_trees(tmp_path_factory.mktemp("corpus"), n_train=80, n_dev=30)
    model_dir = tmp_path_factory.mktemp("runs") / request.param
    status = cli.main(["train", "--model-dir", str(model_dir), "--data", str(data),
                       "--model", request.param, "--epochs", "12", "--lr", "0.01",
                       "--hidden", "16", "--quiet"])
    assert status == 0
    return data, model_dir


@pytest.mark.slow
def test_training_lowers_the_loss_and_beats_the_majority_label(trained):
    from examples.deprel.train import majority_accuracy

    data, model_dir = trained
    log = json.loads((model_dir / "log.json").read_text())
    assert log[-1]["train_loss"] < 0.5 * log[0]["train_loss"]
    majority = majority_accuracy(read_deprel(data / TRAIN_FILE), read_deprel(data / DEV_FILE))
    best = max(e["dev_accuracy"] for e in log)
    assert best > majority + 0.3, (best, majority)
    assert {"tokens_per_s", "nets_built", "padding_fraction"} <= set(log[0])


@pytest.mark.slow
def test_label_writes_the_predicted_relations_into_column_8(trained, tmp_path, capsys):
    data, model_dir = trained
    out = tmp_path / "labelled.conllu"
    assert cli.main(["label", "--model-dir", str(model_dir), "--conllu",
                     str(data / DEV_FILE), "-o", str(out)]) == 0
    gold = read_deprel(data / DEV_FILE)
    got = read_deprel(out)
    assert [s.heads for s in got] == [s.heads for s in gold]
    right = sum(a == b for s, t in zip(got, gold) for a, b in zip(s.deprels, t.deprels))
    assert right / sum(len(s.forms) for s in gold) > 0.8
    assert cli.main(["evaluate", "--model-dir", str(model_dir), "--data", str(data)]) == 0
    assert "label accuracy" in capsys.readouterr().out


def test_a_bad_input_file_is_one_line_naming_it(tmp_path, capsys):
    bad = tmp_path / "bad.conllu"
    bad.write_text("1\ta\t_\tNOUN\t_\t_\t5\troot\t_\t_\n\n")
    (tmp_path / "m").mkdir()
    assert cli.main(["label", "--model-dir", str(tmp_path / "m"), "--conllu", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.conllu:1: HEAD 5 is not a word" in err


def test_divergence_exits_1_with_one_line(tmp_path, capsys):
    data = write_trees(tmp_path / "data", n_train=20, n_dev=5)
    model_dir = tmp_path / "m"
    assert cli.main(["train", "--model-dir", str(model_dir), "--data", str(data),
                     "--epochs", "2", "--lr", "1e38", "--hidden", "8", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "training diverged at epoch " in err and "loss nan" in err and "Lower --lr" in err


@pytest.mark.parametrize("model", ["tree", "baseline"])
def test_ranks_share_every_epoch_in_equal_disjoint_parts(tmp_path, model):
    sents = read_deprel(write_trees(tmp_path, n_train=40, n_dev=1) / TRAIN_FILE)
    labels = sorted({d for s in sents for d in s.deprels})
    labeller = Labeller(Featurizer.build([s.forms for s in sents]),
                        DeprelConfig(model=model, labels=labels, batch=4, hidden=4))
    encoded = labeller.encode(sents)
    whole = labeller.epoch_plan(labeller.sampler(encoded, seed=3), 1)
    shares = [labeller.epoch_plan(labeller.sampler(encoded, seed=3, rank=rank, size=3), 1)
              for rank in range(3)]
    assert len({len(share) for share in shares}) == 1 and len(shares[0]) == len(whole) // 3
    dealt = [b for k in range(len(shares[0])) for b in (s[k] for s in shares)]
    assert dealt == whole[:len(dealt)]  # each batch with the key of its net


def test_resume_with_another_model_names_it_in_one_line(tmp_path, capsys):
    data = write_trees(tmp_path / "data", n_train=12, n_dev=4)
    argv = ["train", "--model-dir", str(tmp_path / "m"), "--data", str(data), "--hidden",
            "8", "--quiet"]
    assert cli.main([*argv, "--epochs", "1"]) == 0
    capsys.readouterr()
    assert cli.main([*argv, "--epochs", "2", "--resume", "--model", "baseline"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model 'baseline' (the folder has 'tree')" in err, err
    assert cli.main([*argv, "--epochs", "2", "--resume"]) == 0
    assert len(json.loads((tmp_path / "m" / "log.json").read_text())) == 2


@pytest.mark.parametrize("lr", ["0", "-1", "nan"])
def test_a_bad_learning_rate_is_refused_before_the_folder_is_made(tmp_path, lr, capsys):
    data = write_trees(tmp_path / "data", n_train=4, n_dev=2)
    with pytest.raises(SystemExit) as stop:
        cli.main(["train", "--model-dir", str(tmp_path / "m"), "--data", str(data),
                  f"--lr={lr}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --lr: expected a finite number > 0" in err
    assert not (tmp_path / "m").exists()


def _mpiexec() -> str | None:
    """mpiexec beside this Python (the mpich wheel's), else on PATH, where mpi4py is too."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    return shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which(
        "mpiexec")


@pytest.mark.slow
@pytest.mark.skipif(_mpiexec() is None, reason="needs mpi4py and mpiexec: pip install -e '.[mpi]'")
def test_two_ranks_share_the_batches_and_resume_exactly(tmp_path):
    data = write_trees(tmp_path / "data", n_train=40, n_dev=8)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg")

    def ranks(model_dir, epochs, *extra):
        run = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-m", "examples.deprel",
                              "train", "--model-dir", str(model_dir), "--data", str(data),
                              "--hidden", "8", "--epochs", str(epochs), "--quiet", *extra],
                             env=env, capture_output=True, text=True, timeout=limit(300))
        assert run.returncode == 0, run.stderr

    ranks(tmp_path / "whole", 3)
    ranks(tmp_path / "resumed", 1)
    ranks(tmp_path / "resumed", 3, "--resume")
    whole, resumed = (json.loads((tmp_path / m / "log.json").read_text())
                      for m in ("whole", "resumed"))
    times = ("seconds", "tokens_per_s")
    assert [{k: v for k, v in e.items() if k not in times} for e in resumed] == [
        {k: v for k, v in e.items() if k not in times} for e in whole]
    assert ((tmp_path / "whole" / "last.caffemodel").read_bytes()
            == (tmp_path / "resumed" / "last.caffemodel").read_bytes())
    sents = read_deprel(data / TRAIN_FILE)
    labeller = Labeller(Featurizer.build([s.forms for s in sents]),
                        DeprelConfig(labels=sorted({d for s in sents for d in s.deprels})))
    steps = len(labeller.sampler(labeller.encode(sents))) // 2
    assert [e["iter"] for e in whole] == [steps, 2 * steps, 3 * steps]  # each rank half
