"""The tagger on packed rows: each sentence scored as alone, and tags mapped back to sentences."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from examples.pos_tagging.features import Featurizer
from examples.pos_tagging.packing import (
    batch_inputs,
    packed_inputs,
    predict_packed,
    training_sampler,
)
from examples.pos_tagging.tagger import IGNORE, Tagger, TaggerConfig
from unroll.engine.backend import to_numpy
from unroll.train.bucketing import BucketSampler, unpack_time_major

WORDS = "The cat sat on a mat . Dogs ran in 1999 , USA Today reported it quickly !".split()


@pytest.fixture(scope="module")
def tagger():
    featurizer = Featurizer.build([WORDS[:9], WORDS[7:]])
    config = TaggerConfig(embed=6, hidden=5, batch=3,
                          chars={"embed": 3, "hidden": 3, "length": 5})
    tagger = Tagger(featurizer, config)
    rng = np.random.default_rng(0)
    for p in tagger.train_model.learnable_params:  # not the fillers' zero biases
        p.blob.data[...] = rng.uniform(-0.5, 0.5, p.blob.shape)
    return tagger


def scores(tagger, inputs):
    tagger.test_model.forward(**inputs)
    return to_numpy(tagger.test_model.active.blobs["scores"].data).copy()


sentences_st = st.lists(st.lists(st.sampled_from(WORDS + ["unseen", "Zebra"]), min_size=1,
                                 max_size=5), min_size=2, max_size=6)


@given(sentences=sentences_st, data=st.data())
def test_packed_sentences_score_as_alone(tagger, sentences, data):
    encoded = tagger.encode(sentences)
    order = data.draw(st.permutations(range(len(sentences))))
    cut = data.draw(st.integers(1, len(order)))
    rows = [list(order[:cut]), list(order[cut:])] if cut < len(order) else [list(order)]
    length = max(sum(len(sentences[i]) for i in row) for row in rows) + data.draw(
        st.integers(0, 2))
    inputs, spans = packed_inputs(tagger, encoded, rows, length)
    packed = unpack_time_major(scores(tagger, inputs), spans)
    for i, got in zip([i for row in rows for i in row], packed):
        alone = scores(tagger, tagger.inputs([encoded[i]], len(sentences[i])))[:, 0]
        np.testing.assert_allclose(got, alone, rtol=1e-4, atol=1e-5,
                                   err_msg=f"sentence {i}: {sentences[i]}")


def test_predict_packed_gives_the_tags_of_predict(tagger):
    rng = np.random.default_rng(1)
    sentences = [list(rng.choice(WORDS, rng.integers(1, 9))) for _ in range(20)] + [[]]
    encoded = tagger.encode(sentences)
    expected = tagger.predict_encoded(encoded)
    got = predict_packed(tagger, encoded, batch_size=2, row_lengths=[6])
    assert [len(t) for t in got] == [len(s) for s in sentences]
    for i, (a, b) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(a, b, err_msg=f"sentence {i}")


def test_batch_inputs_of_a_packed_sampler_carry_each_sentences_labels(tagger):
    rng = np.random.default_rng(2)
    sentences = [list(rng.choice(WORDS, rng.integers(1, 6))) for _ in range(9)]
    tags = [rng.integers(0, 17, len(s)) for s in sentences]
    encoded = tagger.encode(sentences)
    sampler = BucketSampler([len(s) for s in sentences], batch_size=2, pack=True, seed=3)
    seen = 0
    for batch in sampler:
        inputs, tokens = batch_inputs(tagger, encoded, tags, batch, sampler)
        _, spans = packed_inputs(tagger, encoded, batch, sampler.bucket_length(batch))
        assert inputs["words"].shape == (sampler.bucket_length(batch), len(batch))
        flat = [i for row in batch for i in row]
        assert tokens == sum(len(sentences[i]) for i in flat)
        for i, labels in zip(flat, unpack_time_major(inputs["labels"], spans)):
            np.testing.assert_array_equal(labels, tags[i])
        assert (inputs["labels"] != IGNORE).sum() == tokens
        seen += len(flat)
    assert seen == len(sentences)


def test_batch_inputs_of_a_bucketed_sampler_are_padded_sentences(tagger):
    sentences = [WORDS[:3], WORDS[3:4], WORDS[4:7]]
    tags = [np.arange(len(s)) for s in sentences]
    sampler = BucketSampler([len(s) for s in sentences], 3, boundaries=[3], shuffle=False)
    (batch,) = list(sampler)
    inputs, tokens = batch_inputs(tagger, tagger.encode(sentences), tags, batch, sampler)
    assert tokens == 7 and inputs["words"].shape == (3, 3)
    assert inputs["cont"].T.tolist() == [[0, 1, 1], [0, 0, 0], [0, 1, 1]]
    assert (inputs["labels"] != IGNORE).sum(axis=0).tolist() == [3, 1, 3]



@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=200), batch=st.integers(1, 16),
       epoch=st.integers(0, 3))
def test_packed_training_batches_are_rows_of_mean_length_doubled(lengths, batch, epoch):
    sampler = training_sampler(lengths, batch, seed=1)
    mean = max(1, round(np.mean(lengths)))
    # rows of the mean length, doubled while under half the longest, and the longest
    expected = [mean * 2**k for k in range(8) if mean * 2 ** (k + 1) < max(lengths)]
    assert list(sampler.boundaries) == [*expected, max(lengths)]
    seen = []
    for rows in sampler.epoch_batches(epoch):
        length = sampler.bucket_length(rows)
        assert 1 <= len(rows) <= batch
        assert all(sum(lengths[i] for i in row) <= length for row in rows)
        seen += [i for row in rows for i in row]
    assert sorted(seen) == list(range(len(lengths)))


def test_unpacked_training_batches_are_length_buckets():
    lengths = [3, 9, 3, 4, 9, 1]
    sampler = training_sampler(lengths, 2, pack=False)
    batches = sampler.epoch_batches(0)
    assert not sampler.pack and sampler.bucket_lengths == (3, 9)
    assert sorted(i for batch in batches for i in batch) == list(range(6))
    for batch in batches:  # sentences, each batch padded to its bucket's longest
        assert len(batch) <= 2 and max(lengths[i] for i in batch) <= sampler.bucket_length(batch)
