"""examples/lemmatize: reading and writing column 3, training on a made-up corpus, and
decoding with attention through unroll.train.decoding (docs/design.md, "Stepping": the
search functions have their own tests in tests/train/test_decoding.py).
"""

import numpy as np
import pytest

from examples.lemmatize import __main__ as cli
from examples.lemmatize.conll import fill_lemmas, read_lemmas
from examples.lemmatize.model import LEMMATIZER_FILES, Lemmatizer, LemmatizerConfig
from examples.lemmatize.train import TrainOptions, scores, train, words_of
from tests.cli_helpers import one_line_error
from unroll import Net
from unroll.tools.ewt import DEV_FILE, TRAIN_FILE
from unroll.train import model_folder as folder
from unroll.train.decoding import beam_search, greedy

# -- a made-up corpus: regular inflections of made-up stems ------------------------------

TRAIN_SENTENCES = 120


def _stem(rng) -> str:
    return "".join(rng.choice(list("bdkmst")) + rng.choice(list("aio"))
                   for _ in range(int(rng.integers(1, 4))))


def _word(rng) -> tuple[str, str, str]:
    stem = _stem(rng)
    kind = int(rng.integers(4))
    if kind == 0:
        return stem + "s", "NOUN", stem
    if kind == 1:
        return stem + "ed", "VERB", stem
    if kind == 2:
        return stem + "ing", "VERB", stem
    return stem, "ADJ", stem


def _conllu(sentences, extras=False) -> str:
    out = []
    for k, words in enumerate(sentences):
        out.append(f"# sent_id = {k + 1}\n")
        if extras:
            out.append(f"1-2\t{words[0][0]}{words[1][0]}\t_\t_\t_\t_\t_\t_\t_\t_\n")
        for i, (form, upos, lemma) in enumerate(words, start=1):
            out.append(f"{i}\t{form}\t{lemma}\t{upos}\t_\t_\t0\tdep\t_\t_\n")
        if extras:
            out.append(f"{len(words)}.1\tx\t_\t_\t_\t_\t_\t_\t{len(words)}:dep\t_\n")
        out.append("\n")
    return "".join(out)


def write_lemma_corpus(folder, seed=0, n_train=TRAIN_SENTENCES):
    """An EWT-like train and dev split of made-up regular inflections in ``folder``."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    train_sents = [[_word(rng) for _ in range(5)] for _ in range(n_train)]
    dev_sents = [[_word(rng) for _ in range(5)] for _ in range(20)]
    (folder / TRAIN_FILE).write_text(_conllu(train_sents))
    (folder / DEV_FILE).write_text(_conllu(dev_sents, extras=True))
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("lemma")
    data = write_lemma_corpus(root / "data")
    model_dir = root / "model"
    train(TrainOptions(model_dir=model_dir, data=data, epochs=60, lr=1e-2, quiet=True,
                       sizes={"hidden": 32, "embed": 16, "dropout": 0.2, "batch": 16}))
    return data, model_dir, folder.read_log(model_dir, LEMMATIZER_FILES)


def test_the_reader_reads_lemmas_past_multiword_and_empty_node_lines(tmp_path):
    rng = np.random.default_rng(3)
    sents = [[_word(rng) for _ in range(4)] for _ in range(3)]
    path = tmp_path / "dev.conllu"
    path.write_text(_conllu(sents, extras=True))
    assert words_of(read_lemmas(path)) == [w for s in sents for w in s]


@pytest.mark.slow
def test_the_lemmatizer_learns_and_beats_the_dictionary(trained):
    data, model_dir, log = trained
    assert log[-1]["train_loss"] < 0.5 * log[0]["train_loss"]
    lemmatizer = Lemmatizer.load(model_dir)
    dev = words_of(read_lemmas(data / DEV_FILE))
    greedy_scores, beam_scores = scores(lemmatizer, dev), scores(lemmatizer, dev, beam=4)
    # the dev stems are new: the dictionary knows few of them and leaves the rest as they are
    assert greedy_scores["combined"] > greedy_scores["dictionary"] + 0.2
    assert beam_scores["combined"] > greedy_scores["dictionary"] + 0.2


@pytest.mark.slow
def test_beam_one_through_the_stepper_is_greedy(trained):
    _, model_dir, _ = trained
    lemmatizer = Lemmatizer.load(model_dir)
    assert lemmatizer.config.attention == "dot"
    words = [("kaing", "VERB"), ("tomis", "NOUN"), ("dokit", "ADJ")]  # one length
    encoded = lemmatizer.encode(words)
    found = greedy(lemmatizer.decoder(encoded), 3, lemmatizer.bos, lemmatizer.eos, 12)
    beamed = beam_search(lemmatizer.decoder(encoded), 3, lemmatizer.bos, lemmatizer.eos, 12, 1)
    assert [t for t, _ in beamed] == [t for t, _ in found]
    np.testing.assert_allclose([s for _, s in beamed], [s for _, s in found], rtol=1e-6)


@pytest.mark.parametrize("attention", ["dot", "general", "none"])
def test_greedy_decoding_is_the_teacher_forced_nets_argmax_on_the_same_weights(attention):
    """Fed its own greedy tokens, the unrolled net (test phase) picks each of them, and EOS
    after the last, at every step up to EOS: the Stepper with the memory as a static input
    computes what the unrolled decoder with attention computes."""
    words = [("dogs", "NOUN", "dog"), ("cats", "NOUN", "cat"), ("runs", "VERB", "run")]
    lemmatizer = Lemmatizer.build(words, LemmatizerConfig(embed=6, hidden=5, batch=3,
                                                           attention=attention), seed=2)
    pairs = [(f, u) for f, u, _ in words]
    steps = 7
    found = greedy(lemmatizer.decoder(lemmatizer.encode(pairs)), 3, lemmatizer.bos,
                   lemmatizer.eos, steps)
    tgt_in = np.zeros((steps, 3))
    for j, (tokens, _) in enumerate(found):
        tgt_in[:len(tokens) + 1, j] = [lemmatizer.bos, *tokens][:steps]
    net = Net(lemmatizer.net("train", 5, steps), phase="test",
              param_store=lemmatizer.train_model.store)
    [(_, inputs)] = lemmatizer.batches(words)  # the three in their order: one length
    inputs |= {"tgt_in": tgt_in, "tgt_cont": np.ones((steps, 3)), "tgt_out": np.zeros((steps, 3))}
    picked = np.asarray(net.forward(**inputs, blobs=["scores"])["scores"]).argmax(axis=2)
    for j, (tokens, _) in enumerate(found):
        expected = [*tokens, lemmatizer.eos][:steps]
        assert picked[:len(expected), j].tolist() == expected


@pytest.mark.slow
def test_lemmatize_conllu_fills_column_three_and_keeps_every_other_byte(trained, tmp_path,
                                                                        capsys):
    data, model_dir, _ = trained
    text = (data / DEV_FILE).read_bytes().replace(b"\n", b"\r\n")
    lines = text.split(b"\r\n")
    blanked = [b"\t".join([*c[:2], b"_", *c[3:]]) if len(c := line.split(b"\t")) == 10
               and c[0].isdigit() else line for line in lines]
    source = tmp_path / "in.conllu"
    source.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(blanked))
    out = tmp_path / "out.conllu"
    assert cli.main(["lemmatize", "--model-dir", str(model_dir), "--conllu", str(source),
                     "-o", str(out)]) == 0
    written = out.read_bytes()
    assert written.startswith(b"\xef\xbb\xbf")
    got = written[3:].split(b"\r\n")
    assert len(got) == len(blanked)
    for before, after in zip(blanked, got):
        a, b = before.split(b"\t"), after.split(b"\t")
        if len(a) == 10 and a[0].isdigit():
            assert a[:2] + a[3:] == b[:2] + b[3:] and b[2] not in (b"", b"_")
        else:
            assert before == after
    lemmatizer = Lemmatizer.load(model_dir)
    words = [(f, u) for forms, upos, _ in read_lemmas(source, labelled=False)
             for f, u in zip(forms, upos)]
    assert [lemma for forms, _, lemmas in read_lemmas(out) for lemma in lemmas] == \
        lemmatizer.lemmatize(words)


def test_fill_lemmas_writes_one_lemma_per_word(tmp_path):
    source = tmp_path / "in.conllu"
    source.write_text(_conllu([[("dogs", "NOUN", "_"), ("ran", "VERB", "_")]], extras=True))
    out = tmp_path / "out.conllu"
    fill_lemmas(source, [["dog", "run"]], out)
    assert words_of(read_lemmas(out)) == [("dogs", "NOUN", "dog"), ("ran", "VERB", "run")]


@pytest.mark.slow
def test_a_folder_with_a_model_is_refused_and_a_damaged_weight_file_is_an_error(trained,
                                                                                  capsys):
    data, model_dir, _ = trained
    assert cli.main(["train", "--model-dir", str(model_dir), "--data", str(data),
                     "--epochs", "1"]) == 2
    assert "already holds a model" in capsys.readouterr().err
    best = model_dir / "best.caffemodel"
    kept = best.read_bytes()
    try:
        best.write_bytes(kept[:-1] + bytes([kept[-1] ^ 1]))
        assert cli.main(["evaluate", "--model-dir", str(model_dir), "--data", str(data),
                         "--split", "dev"]) == 2
        assert "checksum" in capsys.readouterr().err
    finally:
        best.write_bytes(kept)


def test_the_config_is_schema_checked(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"embed": 8, "hidden": 0, "dropout": 0, "batch": 4, "max_chars": 9, '
                    '"attention": "dot"}')
    with pytest.raises(Exception, match="hidden"):
        LemmatizerConfig.load(path)
    path.write_text('{"embed": 8, "hidden": 8, "dropout": 0, "batch": 4, "max_chars": 9, '
                    '"attention": "concat"}')
    with pytest.raises(Exception, match="attention must be one of"):
        LemmatizerConfig.load(path)


def test_divergence_exits_1_with_one_line(tmp_path, capsys):
    data = write_lemma_corpus(tmp_path / "data")
    model_dir = tmp_path / "m"
    assert cli.main(["train", "--model-dir", str(model_dir), "--data", str(data),
                     "--epochs", "2", "--lr", "1e38", "--hidden", "8", "--embed", "4",
                     "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "training diverged at epoch " in err and "loss nan" in err and "Lower --lr" in err


@pytest.mark.parametrize("option, value, part", [
    ("--dropout", "nan", "argument --dropout: expected a number in [0, 1)"),
    ("--dropout", "1", "argument --dropout: expected a number in [0, 1)"),
    ("--dropout", "inf", "argument --dropout: expected a number in [0, 1)"),
    ("--hidden", "9000", "--hidden must be at most 8192, found 9000"),
])
def test_a_size_config_json_could_not_hold_is_refused_before_the_folder(option, value, part,
                                                                       tmp_path, capsys):
    data = write_lemma_corpus(tmp_path / "data", n_train=4)
    model_dir = tmp_path / "m"
    try:
        status = cli.main(["train", "--model-dir", str(model_dir), "--data", str(data),
                           option, value, "--quiet"])
    except SystemExit as stop:  # refused by the parser
        status = stop.code
    assert status == 2
    one_line_error(capsys, "python -m examples.lemmatize train: error: ", part)
    assert not model_dir.exists()
