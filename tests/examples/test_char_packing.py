"""The character nets on the batch's real words only, packed into columns, scattered back.

The reference is the full-grid character model the tagger ran before: every
cell of the (T, N) grid its own column of C characters, right-aligned, a
padding cell an empty word (character 0, cont 0), each column's output read
after its last step. Fed to the same net (``chars_at`` = the cell at step
C - 1, -1 elsewhere), that is exactly the old computation; the packed inputs
must give the real words the same scores, the same loss and the same
gradient for every param (float64).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from examples.pos_tagging.features import Featurizer
from examples.pos_tagging.packing import packed_inputs
from examples.pos_tagging.tagger import Tagger, TaggerConfig, pack_columns, tag_ids
from unroll.engine.backend import to_numpy
from unroll.train.bucketed_model import BucketedModel

WORDS = "The cat sat on a mat . Dogs ran in 1999 , USA Today reported it quickly !".split()
CHARS = {"embed": 3, "hidden": 3, "length": 5}
TAGS = ["DET", "NOUN", "VERB", "ADP", "PUNCT"]


@pytest.fixture(scope="module")
def tagger():
    featurizer = Featurizer.build([WORDS[:9], WORDS[7:]])
    return Tagger(featurizer, TaggerConfig(embed=4, hidden=3, batch=3, dropout=0.0,
                                           word_dropout=0.0, chars=CHARS))


def float64_model(tagger) -> BucketedModel:
    model = BucketedModel(tagger.net_param, dtype="float64", steps_from="words")
    rng = np.random.default_rng(0)
    for p in model.learnable_params:  # not the fillers' zero biases
        p.blob.data[...] = rng.uniform(-0.5, 0.5, p.blob.shape)
    return model


def full_grid(inputs: dict, encoded: list[dict]) -> dict:
    """The same batch as the old model read it: every grid cell a word, padding cells empty."""
    T, N = inputs["words"].shape
    C = CHARS["length"]
    grid = dict(inputs, chars_at=np.full((C, T * N), -1))
    grid["chars_at"][C - 1] = np.arange(T * N)
    for k, name in enumerate(("chars_fw", "chars_bw", "chars_cont")):
        cells = np.zeros((T, N, C), inputs[name].dtype)
        for n, e in enumerate(encoded):
            cells[: len(e["word"]), n] = e["chars"][k]
        grid[name] = cells.reshape(T * N, C).T
    return grid


def run(model, inputs):
    """Scores, loss and every param's gradient of one forward and backward."""
    model.clear_param_diffs()
    scores = to_numpy(model.forward(blobs=["scores"], **inputs)["scores"]).copy()
    model.backward()
    grads = [to_numpy(p.blob.diff).copy() for p in model.learnable_params]
    return scores, float(model.loss), grads


sentences_st = st.lists(st.lists(st.sampled_from(WORDS + ["unseen", "Zebras"]), min_size=0,
                                 max_size=5), min_size=1, max_size=4)


@pytest.mark.slow
@given(sentences=sentences_st, extra=st.integers(0, 2), seed=st.integers(0, 9))
def test_packed_words_give_the_full_grid_scores_loss_and_gradients(tagger, sentences, extra,
                                                                   seed):
    model = float64_model(tagger)
    rng = np.random.default_rng(seed)
    tags = tag_ids([list(rng.choice(TAGS, len(s))) for s in sentences])
    T = max(1, max(len(s) for s in sentences)) + extra
    encoded = tagger.encode(sentences)
    inputs = tagger.inputs(encoded, T, tags)
    assert (inputs["chars_at"] >= 0).sum() == sum(len(s) for s in sentences)
    packed, grid = run(model, inputs), run(model, full_grid(inputs, encoded))
    real = inputs["labels"] != -1
    np.testing.assert_allclose(packed[0][real], grid[0][real], rtol=1e-12, atol=1e-12)
    assert packed[1] == pytest.approx(grid[1], rel=1e-12, abs=1e-12)
    for p, a, b in zip(model.learnable_params, packed[2], grid[2]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=p.name)


def test_padding_cells_get_zero_character_vectors(tagger):
    model = float64_model(tagger)
    inputs = tagger.inputs(tagger.encode([["The", "cat", "sat", "."], ["Dogs"]]), 5)
    chars = to_numpy(model.forward(blobs=["char_vec"], **inputs)["char_vec"])
    assert chars.shape == (5, 2, 2 * CHARS["hidden"])
    real = np.zeros((5, 2), bool)
    real[:4, 0] = real[0, 1] = True
    np.testing.assert_array_equal(chars[~real], 0)
    assert np.all(np.abs(chars[real]).sum(axis=1) > 0)


def test_packed_rows_read_each_word_once(tagger):
    sentences = [["The", "cat", "."], ["Dogs", "ran"], ["it"]]
    inputs, _ = packed_inputs(tagger, tagger.encode(sentences), [[0, 2], [1]], 4)
    # row 0 holds sentences 0 and 2 (4 words), row 1 sentence 1 (2 words): N = 2
    at = inputs["chars_at"]
    assert sorted(at[at >= 0].tolist()) == [0, 1, 2, 3, 4, 6]
    # 16 characters in columns of 5: 4 columns (4 + 1, 3, 3, 3 + 2), not T * N = 8; the
    # rest of the 16 that a (T, N) batch is padded to stay empty
    assert at.shape == (CHARS["length"], 16)
    assert (inputs["chars_cont"].any(axis=0) | (at >= 0).any(axis=0)).sum() == 4


def test_columns_per_grid_only_grow(tagger):
    def columns(sentences, T):
        return tagger.inputs(tagger.encode(sentences), T)["chars_at"].shape[1]

    long = [["quickly"] * 12]  # 7 characters a word: one word a column of 5 (truncated)
    assert columns(long, 13) == 16
    assert columns([["a"]], 13) == 16  # a (T, N) keeps its width: the net does not reshape
    assert columns(long * 2, 13) == 32  # another N is another grid
    assert columns(long, 13) == 16
    assert columns([["quickly"] * 13 + ["a"] * 4], 20) == 16
    assert columns([["quickly"] * 17], 20) == 32


def test_pack_columns_puts_each_word_in_the_fullest_column_it_fits_the_latest_of_equals():
    """The placement is part of the results: the character nets' weight gradients sum over
    the columns in their order, so training is bit-identical only while it stays."""
    column, start = pack_columns(np.array([3, 3, 2, 2, 1, 1, 4]), 4)
    assert column.tolist() == [1, 2, 3, 3, 2, 1, 0]
    assert start.tolist() == [0, 0, 0, 2, 3, 3, 0]


@given(st.lists(st.integers(1, 6), max_size=30))
def test_pack_columns_fills_each_slot_at_most_once(lengths):
    lengths = np.array(lengths, np.int64)
    column, start = pack_columns(lengths, 6)
    used = np.zeros((len(lengths), 6), int)
    for c, s, n in zip(column, start, lengths):
        used[c, s : s + n] += 1
    assert used.max(initial=0) <= 1 and (start + lengths <= 6).all()
    # best fit, longest first: at most one column is half empty or worse
    assert (used.sum(axis=1)[: len(set(column.tolist()))] <= 3).sum() <= 1
