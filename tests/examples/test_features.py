import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from examples.pos_tagging.features import (
    FEATURES,
    PAD_ID,
    UNK_ID,
    Featurizer,
    Vocab,
    caps_class,
    decode_tags,
    encode_tags,
    normalize,
    token_features,
    word_dropout,
    word_shape,
)
from unroll.tools.conllu import UPOS_TAGS

TRAIN = [
    ["The", "cat", "sat", "on", "the", "mat", "."],
    ["The", "dogs", "ran", "in", "1999", "."],
    ["USA", "Today", "reported", "it", "."],
]


def test_vocab_specials_unknowns_and_order():
    v = Vocab.build(["b", "a", "b", "c", "a", "b", "d"], min_count=2)
    assert v.itos == ["<pad>", "<unk>", "b", "a"]  # most frequent first
    assert v["<pad>"] == PAD_ID == 0 and v["<unk>"] == UNK_ID == 1
    assert v["b"] == 2 and v["c"] == UNK_ID and v.lookup("zzz") == UNK_ID
    assert "a" in v and "c" not in v and len(v) == 4
    assert v.encode(["a", "c", "b"]).tolist() == [3, 1, 2]
    assert v.encode([]).dtype == np.int64
    assert v.decode([2, 3, 1, 0]) == ["b", "a", "<unk>", "<pad>"]
    assert v.counts.tolist() == [0, 0, 3, 2]


def test_vocab_ties_sorted_and_max_size_and_counter_input():
    assert Vocab.build(["z", "y", "x"]).itos[2:] == ["x", "y", "z"]
    assert Vocab.build({"x": 5, "y": 9, "z": 1}, max_size=2).itos[2:] == ["y", "x"]
    assert Vocab.build(["<unk>", "<pad>", "a"]).itos == ["<pad>", "<unk>", "a"]
    with pytest.raises(ValueError, match="min_count must be >= 1, got 0"):
        Vocab.build(["a"], min_count=0)
    with pytest.raises(ValueError, match="'a' twice"):
        Vocab(["a", "a"])


def test_vocab_json_round_trip_and_bad_json():
    v = Vocab.build(["héllo", "wörld", "héllo", '"q"'])
    text = v.to_json()
    assert json.loads(text)["tokens"][0] == "héllo"
    w = Vocab.from_json(text)
    assert w == v and w["wörld"] == v["wörld"] and w.counts.tolist() == v.counts.tolist()
    with pytest.raises(ValueError, match="not a vocabulary"):
        Vocab.from_json("[1, 2]")
    with pytest.raises(ValueError, match="list of strings"):
        Vocab.from_json('{"tokens": [1]}')
    with pytest.raises(ValueError, match="2 tokens but 1 counts"):
        Vocab.from_json('{"tokens": ["a", "b"], "counts": [1]}')


@given(st.lists(st.text(max_size=4), max_size=30), st.integers(1, 3))
def test_vocab_round_trip_property(items, min_count):
    v = Vocab.build(items, min_count=min_count)
    assert Vocab.from_json(v.to_json()) == v
    for t in set(items):
        assert v.decode([v[t]])[0] == (t if t in v else "<unk>")


@pytest.mark.parametrize(
    "word, shape, caps",
    [
        ("Hello", "Xx", "title"),
        ("hello", "x", "lower"),
        ("USA", "X", "upper"),
        ("I", "X", "title"),
        ("iPhone", "xXx", "mixed"),
        ("McDonald's", "XxXx'x", "mixed"),
        ("1999", "d", "none"),
        ("3.14", "d.d", "none"),
        ("e-mail", "x-x", "lower"),
        ("...", "...", "none"),
        ("Zürich", "Xx", "title"),
        ("日本", "a", "none"),
        ("A1", "Xd", "title"),
    ],
)
def test_shape_and_caps(word, shape, caps):
    assert word_shape(word) == shape and caps_class(word) == caps


def test_token_features_use_normalized_word_for_affixes():
    f = token_features("Running42")
    assert normalize("Running42") == f["word"] == "running00"
    assert (f["prefix1"], f["prefix2"]) == ("r", "ru")
    assert (f["suffix1"], f["suffix2"], f["suffix3"]) == ("0", "00", "g00")
    assert set(f) == set(FEATURES)
    short = token_features("a")
    assert short["suffix3"] == short["prefix2"] == "a"


def test_featurizer_encode_shapes_and_unknowns():
    f = Featurizer.build(TRAIN, min_count=1, char_min_count=1)
    ids = f.encode(["The", "cats", "Sat", "."])
    assert list(ids) == list(FEATURES)
    assert all(a.shape == (4,) and a.dtype == np.int64 for a in ids.values())
    word = f.vocabs["word"]
    assert word.decode(ids["word"]) == ["the", "<unk>", "sat", "."]  # lower-cased lookup
    # an unknown word still gets known suffix, shape and caps ids
    assert f.vocabs["suffix1"].decode(ids["suffix1"][1:2]) == ["s"]
    assert f.vocabs["shape"].decode(ids["shape"]) == ["Xx", "x", "Xx", "."]
    assert f.vocabs["caps"].decode(ids["caps"]) == ["title", "lower", "title", "none"]
    assert f.encode([])["word"].shape == (0,)
    assert f.vocabs["word"].counts[word["the"]] == 3


def test_featurizer_default_min_counts():
    f = Featurizer.build(TRAIN)
    assert "reported" in f.vocabs["word"]  # words: min_count 1
    assert "ted" not in f.vocabs["suffix3"]  # seen once: <unk> for other features
    assert "he" in f.vocabs["suffix2"]  # "the" x3
    assert f.char_ids("T") != [UNK_ID] and f.char_ids("Q") == [UNK_ID]  # T x2, Q never
    g = Featurizer.build(TRAIN, min_count={"suffix3": 1})
    assert "ted" in g.vocabs["suffix3"] and "reported" in g.vocabs["word"]
    with pytest.raises(ValueError, match="unknown features"):
        Featurizer.build(TRAIN, min_count={"lemma": 1})


def test_char_ids_keep_case():
    f = Featurizer.build(TRAIN, char_min_count=1)
    assert f.chars.decode(f.char_ids("Tt€")) == ["T", "t", "<unk>"]
    assert f.char_ids("") == []


def test_featurizer_json_and_file_round_trip(tmp_path):
    f = Featurizer.build(TRAIN, min_count=1)
    g = Featurizer.from_json(f.to_json())
    assert g.sizes == f.sizes and set(g.sizes) == set(FEATURES) | {"chars"}
    sent = ["The", "unknown", "USA", "1999", "."]
    for name, ids in f.encode(sent).items():
        np.testing.assert_array_equal(g.encode(sent)[name], ids)
    f.save(tmp_path / "vocab.json")
    h = Featurizer.load(tmp_path / "vocab.json")
    assert all(h.vocabs[n] == f.vocabs[n] for n in FEATURES) and h.chars == f.chars
    broken = json.loads(f.to_json())
    del broken["features"]["shape"]
    with pytest.raises(ValueError, match=r"missing \['shape'\]"):
        Featurizer.from_json(json.dumps(broken))
    with pytest.raises(ValueError, match="not a Featurizer"):
        Featurizer.from_json("{}")


def test_word_dropout_only_touches_rare_words():
    v = Vocab.build(["a"] * 5 + ["b", "c", "c"])  # a:5 -> 2, c:2 -> 3, b:1 -> 4
    ids = np.array([0, 1, 2, 3, 4] * 200)
    rng = np.random.default_rng(0)
    out = word_dropout(ids, v, rng, p=0.5)
    assert out.dtype == ids.dtype and out.shape == ids.shape
    assert (ids == np.array([0, 1, 2, 3, 4] * 200)).all()  # input untouched
    keep = ids != 4
    np.testing.assert_array_equal(out[keep], ids[keep])  # pad, unk and frequent words stay
    dropped = out[ids == 4] == UNK_ID
    assert 0.3 < dropped.mean() < 0.7
    assert set(out[ids == 4].tolist()) <= {4, UNK_ID}
    everything = word_dropout(ids, v, rng, p=1.0, max_count=2)
    assert everything[ids == 3].tolist() == [UNK_ID] * 200
    np.testing.assert_array_equal(word_dropout(ids, v, rng, p=0.0), ids)
    a = word_dropout(ids, v, np.random.default_rng(7), p=0.5)
    b = word_dropout(ids, v, np.random.default_rng(7), p=0.5)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="p must be in"):
        word_dropout(ids, v, rng, p=1.5)


def test_tags():
    assert encode_tags(UPOS_TAGS).tolist() == list(range(17))
    assert decode_tags(encode_tags(["VERB", "X"])) == ["VERB", "X"]
    with pytest.raises(ValueError, match="unknown UPOS tag 'VB'"):
        encode_tags(["NOUN", "VB"])
