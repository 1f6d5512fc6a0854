"""The character nets on the batch's real words only, scattered back into the (T, N) grid.

The reference is the full-grid character model the tagger ran before: every
cell of the grid read as a word, a padding cell as an empty one (character 0,
cont 0), the W = T * N results in cell order. Fed to the same net with
``chars_at`` = every cell, that is exactly the old computation; the packed
inputs must give the real words the same scores, the same loss and the same
gradient for every param (float64).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from examples.pos_tagging.features import Featurizer
from examples.pos_tagging.packing import packed_inputs
from examples.pos_tagging.tagger import Tagger, TaggerConfig, tag_ids
from unroll.backend import to_numpy
from unroll.bucketed_model import BucketedModel

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


def full_grid(inputs: dict) -> dict:
    """The same batch as the old model read it: every grid cell a word, padding cells empty."""
    T, N = inputs["words"].shape
    grid = dict(inputs, chars_at=np.arange(T * N))
    for name in ("chars_fw", "chars_bw", "chars_cont"):
        packed = inputs[name]
        grid[name] = np.zeros((packed.shape[0], T * N), packed.dtype)
        grid[name][:, inputs["chars_at"]] = packed
    return grid


def run(model, inputs):
    """Scores, loss and every param's gradient of one forward and backward."""
    model.clear_param_diffs()
    model.forward(**inputs)
    model.backward()
    grads = [to_numpy(p.blob.diff).copy() for p in model.learnable_params]
    return to_numpy(model.active.blobs["scores"].data).copy(), float(model.loss), grads


sentences_st = st.lists(st.lists(st.sampled_from(WORDS + ["unseen", "Zebras"]), min_size=0,
                                 max_size=5), min_size=1, max_size=4)


@given(sentences=sentences_st, extra=st.integers(0, 2), seed=st.integers(0, 9))
def test_packed_words_give_the_full_grid_scores_loss_and_gradients(tagger, sentences, extra,
                                                                   seed):
    model = float64_model(tagger)
    rng = np.random.default_rng(seed)
    tags = tag_ids([list(rng.choice(TAGS, len(s))) for s in sentences])
    T = max(1, max(len(s) for s in sentences)) + extra
    inputs = tagger.inputs(tagger.encode(sentences), T, tags)
    assert inputs["chars_fw"].shape[1] == sum(len(s) for s in sentences)
    packed, grid = run(model, inputs), run(model, full_grid(inputs))
    real = inputs["labels"] != -1
    np.testing.assert_allclose(packed[0][real], grid[0][real], rtol=1e-12, atol=1e-12)
    assert packed[1] == pytest.approx(grid[1], rel=1e-12, abs=1e-12)
    for p, a, b in zip(model.learnable_params, packed[2], grid[2]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=p.name)


def test_padding_cells_get_zero_character_vectors(tagger):
    model = float64_model(tagger)
    inputs = tagger.inputs(tagger.encode([["The", "cat", "sat", "."], ["Dogs"]]), 5)
    model.forward(**inputs)
    chars = to_numpy(model.active.blobs["char_vec"].data)
    assert chars.shape == (5, 2, 2 * CHARS["hidden"])
    real = np.zeros((5, 2), bool)
    real[:4, 0] = real[0, 1] = True
    np.testing.assert_array_equal(chars[~real], 0)
    assert np.all(np.abs(chars[real]).sum(axis=1) > 0)


def test_packed_rows_read_each_word_once(tagger):
    sentences = [["The", "cat", "."], ["Dogs", "ran"], ["it"]]
    inputs, _ = packed_inputs(tagger, tagger.encode(sentences), [[0, 2], [1]], 4)
    # row 0 holds sentences 0 and 2 (4 words), row 1 sentence 1 (2 words): N = 2
    np.testing.assert_array_equal(inputs["chars_at"], [0, 2, 4, 6, 1, 3])
    assert inputs["chars_fw"].shape == (CHARS["length"], 6)
