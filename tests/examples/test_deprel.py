"""examples/deprel: reading trees from CoNLL-U, labelling, and training on a made-up corpus."""

import json

import numpy as np
import pytest

from examples.deprel import __main__ as cli
from examples.deprel.conll import fill_deprel, read_deprel
from examples.deprel.train import DEV_FILE, TRAIN_FILE
from unroll.tools.conllu import CoNLLUError

WORDS = {"DET": ["the", "a"], "ADJ": ["big", "red", "old"], "NOUN": ["dog", "cat", "park",
         "man", "ball"], "VERB": ["sees", "likes", "kicks"], "ADP": ["in", "near"]}


def _sentence(rng) -> list[tuple]:
    """(form, upos, head, deprel) rows of "DET (ADJ) NOUN VERB DET (ADJ) NOUN (ADP DET (ADJ)
    NOUN)": subject, object and oblique are all nouns under the verb; only their side and
    their dependents tell them apart."""
    rows = []  # (upos, head, deprel), heads 1-based

    def phrase(rel, head, case=False):
        """Append [ADP] DET [ADJ] NOUN, the noun under ``head``; return the noun's id."""
        first = len(rows) + 1
        adj = bool(rng.random() < 0.5)
        noun = first + case + 1 + adj
        if case:
            rows.append(("ADP", noun, "case"))
        rows.append(("DET", noun, "det"))
        if adj:
            rows.append(("ADJ", noun, "amod"))
        rows.append(("NOUN", head, rel))
        return noun

    # the verb follows the subject phrase: 3 words, or 4 with an adjective
    verb = 3 + bool(rng.random() < 0.5)
    rows.append(("DET", verb - 1, "det"))
    if verb == 4:
        rows.append(("ADJ", verb - 1, "amod"))
    rows.append(("NOUN", verb, "nsubj"))
    rows.append(("VERB", 0, "root"))
    phrase("obj", verb)
    if rng.random() < 0.5:
        phrase("obl", verb, case=True)
    return [(str(rng.choice(WORDS[u])), u, h, d) for u, h, d in rows]


def _conllu(sentences, multiword=False) -> str:
    out = []
    for k, rows in enumerate(sentences):
        out.append(f"# sent_id = {k + 1}\n")
        if multiword:
            out.append(f"1-2\t{rows[0][0]}{rows[1][0]}\t_\t_\t_\t_\t_\t_\t_\t_\n")
        for i, (form, upos, head, rel) in enumerate(rows, start=1):
            out.append(f"{i}\t{form}\t{form}\t{upos}\t_\t_\t{head}\t{rel}\t_\t_\n")
        if multiword:
            out.append(f"{len(rows)}.1\tx\t_\t_\t_\t_\t_\t_\t{len(rows)}:dep\t_\n")
        out.append("\n")
    return "".join(out)


def _corpus(folder, n_train=80, n_dev=30, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(exist_ok=True)
    (folder / TRAIN_FILE).write_text(_conllu([_sentence(rng) for _ in range(n_train)]))
    (folder / DEV_FILE).write_text(_conllu([_sentence(rng) for _ in range(n_dev)],
                                           multiword=True))
    return folder


def test_the_reader_reads_heads_and_relations_past_multiword_and_empty_node_lines(tmp_path):
    path = tmp_path / "dev.conllu"
    rng = np.random.default_rng(1)
    sentences = [_sentence(rng) for _ in range(3)]
    path.write_text(_conllu(sentences, multiword=True))
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
    "no relation": ("1\ta\t_\tNOUN\t_\t_\t0\t_\t_\t_\n", 2, r"missing DEPREL"),
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


def test_label_fill_keeps_every_other_byte(tmp_path):
    rng = np.random.default_rng(2)
    text = _conllu([_sentence(rng) for _ in range(2)], multiword=True).replace("\n", "\r\n")
    text = "\ufeff" + text.replace("\tdet\t", "\t_\t")
    src = tmp_path / "in.conllu"
    src.write_bytes(text.encode())
    sents = read_deprel(src, labelled=False)
    out = tmp_path / "out.conllu"
    fill_deprel(src, [["L"] * len(s.forms) for s in sents], out)
    got, want = out.read_bytes().split(b"\r\n"), text.encode().split(b"\r\n")
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
    data = _corpus(tmp_path_factory.mktemp("corpus"))
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
    assert {"words_per_s", "nets_built", "padding_fraction"} <= set(log[0])


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
    data = _corpus(tmp_path / "data", n_train=20, n_dev=5)
    model_dir = tmp_path / "m"
    assert cli.main(["train", "--model-dir", str(model_dir), "--data", str(data),
                     "--epochs", "2", "--lr", "1e38", "--hidden", "8", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "training diverged at epoch " in err and "loss nan" in err and "Lower --lr" in err
