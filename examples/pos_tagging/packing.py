"""Packed batches for the tagger: sentences back to back in rows, and tags back to sentences.

A packed batch (``BucketSampler(pack=True)``) is a list of rows of sentence
indices. Each row's sentences are joined into one token sequence, so the
tagger's own :meth:`~examples.pos_tagging.tagger.Tagger.host_inputs` builds
every input (words with word dropout, extra features, characters, labels) as
for one long sentence; only ``cont`` changes: it is 0 at each sentence's first
token, so every sentence is tagged exactly as it would be alone in a row. The
batch then goes to the device in one transfer (:meth:`Tagger.send`).
"""

from __future__ import annotations

import numpy as np

from unroll.engine.backend import to_numpy
from unroll.train.bucketing import (
    BucketSampler,
    choose_row_lengths,
    time_major_packed,
    unpack_time_major,
)


def _join(parts):
    """Arrays (or tuples of arrays, like a sentence's spelled characters) one after another."""
    if isinstance(parts[0], tuple):
        return tuple(np.concatenate(column) for column in zip(*parts))
    return np.concatenate(parts)


def join_rows(encoded: list[dict], rows) -> list[dict]:
    """Per row, its sentences' encoded features (``Tagger.encode``) one after another."""
    return [{name: _join([encoded[i][name] for i in row]) for name in encoded[row[0]]}
            for row in rows]


def packed_inputs(tagger, encoded: list[dict], rows, length: int, tags=None, train=False):
    """The tagger's inputs for a packed batch of ``rows`` of length ``length``, and the spans.

    Returns ``(inputs, spans)``: ``spans[k]`` is where the k-th sentence of
    ``[i for row in rows for i in row]`` lies (:func:`unroll.train.bucketing.unpack_time_major`).
    ``tags`` are the gold tag ids of every sentence (training), or None.
    """
    joined_tags = None if tags is None else [_join([tags[i] for i in row]) for row in rows]
    host = tagger.host_inputs(join_rows(encoded, rows), length, joined_tags, train=train)
    # the rows' own cont replaces the one-sentence cont on the host, so the batch still
    # goes to the device in one transfer
    # the batch's own sentences, renumbered in row order: not a list of every sentence's
    words, local = [], []
    for row in rows:
        local.append(list(range(len(words), len(words) + len(row))))
        words += [encoded[i]["word"] for i in row]
    _, host["cont"], spans = time_major_packed(local, words, length)
    return tagger.send(host, length, labelled=tags is not None), spans


def training_sampler(lengths, batch: int, seed: int = 0, rank: int = 0, size: int = 1,
                     pack: bool = True) -> BucketSampler:
    """The training batches: ``batch`` rows of whole sentences back to back, or (``pack=False``)
    ``batch`` sentences of one length bucket each.

    Packed rows are as long as the mean sentence (16 tokens on EWT), doubled for longer
    sentences ([16, 32, 64, 159] on EWT), so a batch keeps ``batch`` rows in every
    timestep's GEMMs and runs about as many timesteps as it has tokens per row: on EWT
    1.13-1.31x the training tokens/s of length buckets, 4 nets instead of 27, no padding.
    A row holds about 2.2 sentences, so an epoch takes 188 Adam steps instead of 405,
    each averaging more tokens; training's packed learning rate, 2x the bucketed one
    (``train.TrainOptions``), makes up for it. (A budget of ``batch`` sentences' tokens
    a batch kept the step count, but ran 13 rows of 39 tokens at a time: 0.75x the speed.)

    >>> s = training_sampler([4, 4, 2, 9, 3, 1], batch=2, seed=0)
    >>> s.bucket_lengths, len(s)
    ((4, 9), 3)
    """
    if not pack:
        return BucketSampler(lengths, batch_size=batch, seed=seed, rank=rank, size=size)
    rows = choose_row_lengths(lengths, shortest=max(1, round(float(np.mean(lengths)))))
    return BucketSampler(lengths, batch_size=batch, boundaries=rows, seed=seed, rank=rank,
                         size=size, pack=True)


def batch_inputs(tagger, encoded: list[dict], tags, batch, sampler: BucketSampler):
    """``(inputs, real tokens)`` of a training batch of ``sampler``, packed or not."""
    length = sampler.bucket_length(batch)
    if sampler.pack:
        inputs, spans = packed_inputs(tagger, encoded, batch, length, tags, train=True)
        return inputs, sum(span.length for span in spans)
    inputs = tagger.inputs([encoded[i] for i in batch], length, [tags[i] for i in batch],
                           train=True)
    return inputs, sum(len(tags[i]) for i in batch)


def predict_packed(tagger, encoded: list[dict], batch_size: int | None = None,
                   row_lengths=None) -> list[np.ndarray]:
    """Tag ids per sentence, the sentences packed into rows (``batch_size`` rows a batch).

    ``row_lengths`` are the rows' lengths (None: ``choose_row_lengths`` of
    these sentences); pass the training sampler's ``bucket_lengths`` to reuse
    its nets. The same tags as ``Tagger.predict_encoded``, with fewer nets.

    >>> from examples.pos_tagging.features import Featurizer
    >>> from examples.pos_tagging.tagger import Tagger, TaggerConfig
    >>> tagger = Tagger(Featurizer.build([["A", "cat", "."]]), TaggerConfig(embed=4, hidden=4))
    >>> [t.shape for t in predict_packed(tagger, tagger.encode([["A", "cat"], ["."]]))]
    [(2,), (1,)]
    """
    result = [np.zeros(0, np.int64) for _ in encoded]
    tagged = [i for i, e in enumerate(encoded) if len(e["word"])]
    if not tagged:
        return result
    sampler = BucketSampler([len(encoded[i]["word"]) for i in tagged], pack=True, shuffle=False,
                            batch_size=batch_size or tagger.config.batch, boundaries=row_lengths)
    chosen = [encoded[i] for i in tagged]
    for batch in sampler:
        inputs, spans = packed_inputs(tagger, chosen, batch, sampler.bucket_length(batch))
        tagger.test_model.forward(**inputs)
        best = to_numpy(tagger.test_model.active.blobs["scores"].data).argmax(axis=2)
        for k, tags in zip([k for row in batch for k in row], unpack_time_major(best, spans)):
            result[tagged[k]] = tags
    return result
