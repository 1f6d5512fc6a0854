"""Synthetic tagger batches for counting and timing a training step (no data files).

:func:`tagger_setup` is the default tagger on padded sentences, a workload of
:mod:`unroll.train.step_counts`; :func:`packed_tagger` makes packed batches of
rows of given lengths, and :func:`packed_step` counts the training command's
own step (its solver, :func:`examples.pos_tagging.train.training_solver`, and
``solver.step``) on one, with the gradient pass replayed as a CUDA graph where
the command replays it.
"""

from __future__ import annotations

import numpy as np

from unroll.engine.backend import get_array_module

__all__ = ["packed_step", "packed_tagger", "synthetic_sentences", "tagger_setup"]


def synthetic_sentences(lengths, seed: int = 0):
    """(sentences, tags): made-up words and tags, one sentence per length."""
    from unroll.tools.conllu import UPOS_TAGS

    rng = np.random.default_rng(seed)
    words = [f"{stem}{k}" for stem in ("Word", "run", "x-", "Ab") for k in range(50)]
    sentences = [[words[j] for j in rng.integers(0, len(words), n)] for n in lengths]
    tags = [[UPOS_TAGS[j] for j in rng.integers(0, len(UPOS_TAGS), n)] for n in lengths]
    return sentences, tags


def tagger_setup(device: str, T: int = 21, N: int = 32, seed: int = 0):
    """The default tagger on ``device``, its Adam solver and a synthetic batch of up to T words.

    Returns ``(model, solver, feed, tokens)``: ``feed(k)`` packs the batch and sends it
    to the device, as the training command does; ``tokens`` counts the real (unpadded) words.
    """
    from examples.pos_tagging.features import Featurizer
    from examples.pos_tagging.tagger import Tagger, TaggerConfig, tag_ids
    from unroll import Solver

    rng = np.random.default_rng(seed)
    lengths = [T] + rng.integers(1, T + 1, N - 1).tolist()
    sentences, tags = synthetic_sentences(lengths, seed)
    tagger = Tagger(Featurizer.build(sentences), TaggerConfig(batch=N), device=device,
                    seed=seed)
    encoded, labels = tagger.encode(sentences), tag_ids(tags)
    solver = Solver(tagger.train_model, type="Adam", base_lr=2e-3, momentum=0.9,
                    momentum2=0.999, clip_gradients=5.0, nonfinite="skip", max_skipped=0)
    return (tagger.train_model, solver, lambda k: tagger.inputs(encoded, T, labels, train=True),
            sum(lengths))


def packed_tagger(row_lengths, config=None, device: str = "trace", seed: int = 0):
    """A tagger on ``device`` and, per row length T in ``row_lengths``, a packed batch of
    ``config.batch`` rows, each sentences of 1 to T words back to back that fill it.

    Returns ``(tagger, feeds)``: ``feeds[T]()`` makes that batch's inputs on the device as
    the training command does (:func:`~examples.pos_tagging.packing.packed_inputs`: word
    dropout drawn anew, one transfer). ``config`` is a :class:`TaggerConfig` (None: the
    default).
    """
    from examples.pos_tagging.features import Featurizer
    from examples.pos_tagging.packing import packed_inputs
    from examples.pos_tagging.tagger import Tagger, TaggerConfig, tag_ids

    config = config or TaggerConfig()
    rng = np.random.default_rng(seed)
    lengths, batches = [], {}
    for T in row_lengths:
        batches[T] = []
        for _ in range(config.batch):
            batches[T].append([])
            left = T
            while left:
                batches[T][-1].append(len(lengths))
                lengths.append(int(rng.integers(1, left + 1)))
                left -= lengths[-1]
    sentences, tags = synthetic_sentences(lengths, seed)
    tagger = Tagger(Featurizer.build(sentences), config, device=device, seed=seed)
    encoded, gold = tagger.encode(sentences), tag_ids(tags)

    def feed(T):
        return lambda: packed_inputs(tagger, encoded, batches[T], T, gold, train=True)[0]

    return tagger, {T: feed(T) for T in row_lengths}


def packed_step(T: int, config=None, graphs: bool = True, steps: int = 3,
                seed: int = 0):
    """The counts of one training-command step on device "trace" at row length ``T``: the
    packed batch to the device, then ``solver.step(1)`` with the training command's solver
    (:func:`~examples.pos_tagging.train.training_solver`: its non-finite check, its graphs;
    ``graphs=False``: eager, as on the CPU).
    ``steps`` steps run first (warm-up and capture); ``config`` is the
    :class:`TaggerConfig` (None: the default). Returns the step's ``trace.Counts``.
    """
    from examples.pos_tagging.train import TrainOptions, training_solver

    trace = get_array_module("trace")  # the trace device's module, which counts
    tagger, feeds = packed_tagger([T], config, seed=seed)
    model = tagger.train_model
    solver = training_solver(model, TrainOptions(data=None, model_dir=None), steps_per_epoch=100)
    if not graphs:
        solver.graphs = None
    for _ in range(steps + 1):
        with trace.measure() as counts:
            solver.step(1, feed=feeds[T]())
    return counts
