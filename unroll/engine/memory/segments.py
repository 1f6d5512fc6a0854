"""Segments of the run order that backward runs forward again (docs/design.md, 6. Memory): a
:class:`Recompute` plan, the cuts a segment may start at, and Chen et al.'s greedy cuts.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from unroll.engine.memory.walk import StepRoots

__all__ = ["CUT_WINDOW", "Recomputable", "Recompute", "allowed_cuts", "crossing_bytes",
           "greedy_cuts", "one_level_order", "recomputable"]


@dataclass(frozen=True)
class Recompute:
    """A recomputation plan: the run order cut into segments at ``cuts`` (the first step of
    every segment but the first), whose ``steps`` (per segment, in run order) may run
    forward again in backward from the values kept then, the checkpoints. A step that
    cannot be recomputed (:attr:`~unroll.engine.memory_traits.MemoryTraits.recomputable`,
    Dropout's mask, BatchNorm's statistics), and every step writing memory such a step
    writes, keeps its values.

    Backward runs ``order``'s actions: ``k >= 0`` runs segment k's steps forward again,
    ``~k`` runs segment k's backward (:func:`one_level_order` when empty: the segments
    last first, each run again once right before its backward). :func:`liveness` fills
    ``runs``: per action, the steps a forward action runs (those whose values something
    reads)."""

    cuts: tuple
    steps: tuple
    #: the weight-gradient chunks (:func:`gradient_chunks`): their x rows run again all
    #: together or not at all
    chunks: tuple = ()
    order: tuple = ()
    runs: tuple = ()
    #: BPTT-HSM's slots, where ``order`` is its policy (:func:`hsm_order`)
    slots: int | None = None
    #: per data root, whether backward's forward runs may write it again (a buffer per run;
    #: :class:`Recomputable`)
    relived: bytes = b""
    #: per step, the data roots its backward reads (:func:`~unroll.engine.memory.liveness.
    #: backward_reads`; empty: found by the walk)
    reads: tuple = ()
    #: what each step touches (:func:`~unroll.engine.memory.walk.step_roots`; None: found
    #: by the walk)
    roots: StepRoots | None = None

    @property
    def recomputed(self) -> int:
        """How many forward steps backward runs again."""
        return sum(len(run) for run in self.runs if run is not None)

    @property
    def policy(self) -> str:
        """How backward recomputes: one level (each segment run again once, right before
        its backward) or BPTT-HSM's policy in so many slots."""
        return "one level" if self.slots is None else f"BPTT-HSM in {self.slots} slots"


def one_level_order(segments: int) -> tuple:
    """Backward's actions (see :class:`Recompute`) for one level of recomputation: the
    segments last first, each but the last run forward again right before its backward.

    >>> one_level_order(3)
    (-3, 1, -2, 0, -1)
    """
    out = [~(segments - 1)]
    for k in reversed(range(segments - 1)):
        out += [k, ~k]
    return tuple(out)


@dataclass(frozen=True)
class Recomputable:
    """What backward's forward runs may run again, whatever the cuts: found once per net
    and shapes (:func:`recomputable`), shared by every plan a budget weighs. ``kept``: the
    steps that never run again; ``relived``: per data root, whether the runs may write it
    again; ``chunks``: the weight-gradient chunks
    (:func:`~unroll.engine.memory.weight_gradients.gradient_chunks`); ``reads``: per step,
    the data roots its backward reads; ``roots``: what each step touches
    (:func:`~unroll.engine.memory.walk.step_roots`)."""

    kept: frozenset
    relived: bytes
    chunks: tuple
    reads: tuple = ()
    roots: StepRoots | None = None

    def plan(self, n_steps: int, cuts, order=(), slots=None) -> Recompute:
        """The :class:`Recompute` plan of segments starting at ``cuts`` of a run order of
        ``n_steps`` steps; ``order`` backward's actions (empty: one level), BPTT-HSM's in
        ``slots`` slots."""
        bounds = [0, *cuts, n_steps]
        segments = tuple(tuple(s for s in range(a, b) if s not in self.kept)
                         for a, b in zip(bounds[:-1], bounds[1:]))
        return Recompute(tuple(cuts), segments, self.chunks, tuple(order), slots=slots,
                         relived=self.relived, reads=self.reads, roots=self.roots)


def recomputable(steps, layers, data_root, private, chunks=(), reads=(), roots=None
                 ) -> Recomputable:
    """What may run again in backward, from the layers' declarations (``recomputable``,
    ``draws_random``): ``private`` are the roots that keep memory of their own, ``chunks``
    the weight-gradient chunks, none of which a cut may split; ``reads`` per step the data
    roots its backward reads and ``roots`` what each step touches, carried to every plan."""
    chunks = tuple(map(tuple, chunks))
    kept = _kept_steps(steps, layers, data_root)
    return Recomputable(frozenset(kept),
                        _relived_roots(steps, layers, data_root, private, kept, chunks), chunks,
                        tuple(reads), roots)


def _kept_steps(steps, layers, data_root) -> set[int]:
    """Steps that never run again: those that cannot be recomputed or draw random numbers,
    and every step writing memory one of them writes."""
    writers: dict[int, list[int]] = {}
    for s, step in enumerate(steps):
        for b in step.tops:
            writers.setdefault(data_root[b], []).append(s)
    kept = {s for s, layer in enumerate(layers)
            if not layer.memory.recomputable or layer.draws_random}
    todo = list(kept)
    while todo:  # a value a kept step writes must not be written again by another step
        s = todo.pop()
        for b in steps[s].tops:
            for w in writers[data_root[b]]:
                if w not in kept:
                    kept.add(w)
                    todo.append(w)
    return kept


def allowed_cuts(steps, layers, data_root, chunks=()) -> list[int]:
    """The steps a segment may start at: not inside an in-place chain (a value produced
    before the cut and written in place after it), whose forward run again would leave the
    earlier version where backward reads the later one; nor inside a weight-gradient
    chunk (``chunks``, :func:`gradient_chunks`), whose one GEMM needs its rows together."""
    first: dict[int, int] = {}
    banned = bytearray(len(steps) + 1)
    for chunk in chunks:
        for p in range(min(chunk) + 1, max(chunk) + 1):
            banned[p] = 1
    for s, step in enumerate(steps):
        for b in step.tops:
            r = data_root[b]
            if r in first and b in step.bottoms and first[r] < s:
                for p in range(first[r] + 1, s + 1):
                    banned[p] = 1
            first.setdefault(r, s)
    return [p for p in range(1, len(steps)) if not banned[p]]


#: how many allowed cuts in a row :func:`greedy_cuts` weighs against each other
CUT_WINDOW = 64


def greedy_cuts(sizes, allowed, segment_bytes: float, crossing=None) -> list[int]:
    """Chen et al.'s greedy segments over the run order: walking the steps, the bytes their
    tops take (``sizes``, per step, whole numbers) add up, and a segment ends at the first
    allowed cut after they pass ``segment_bytes``. With ``crossing`` (per step,
    :func:`crossing_bytes`), the cut is the one the fewest bytes cross of the allowed cuts
    in a row there (up to :data:`CUT_WINDOW` of them), and the next cut comes after them:
    between the chunks of an unrolled chain, one cut, where only the state crosses.

    >>> greedy_cuts([4, 4, 4, 4], [1, 2, 3], 8), greedy_cuts([4, 4, 4, 4], [1, 2, 3], 4,
    ...                                                       [0, 9, 9, 1])
    ([2], [3])
    """
    n = len(sizes)
    if math.isnan(segment_bytes) or segment_bytes == math.inf:
        return []
    need = math.ceil(segment_bytes)  # the sums are whole: at least the next whole number
    # the bytes before each step, so that a segment's end is a search, not a walk; lists,
    # for the walk takes a cut at a time (a NumPy scalar a search costs more)
    before = list(itertools.accumulate(sizes, initial=0))
    cut_at = np.unique(np.array([p for p in allowed if 0 <= p < n], np.int64))
    if crossing is not None:
        crossing = list(crossing)
        # per allowed cut, the last of the allowed cuts in a row from it
        last = np.append(np.flatnonzero(np.diff(cut_at) != 1), len(cut_at) - 1)
        run_end = cut_at[last[np.searchsorted(last, np.arange(len(cut_at)))]].tolist()
    cut_at = cut_at.tolist()
    cuts: list[int] = []
    start, s, hold = 0, 0, -1  # the current segment's first step; the next step to try
    while True:
        first = max(s, hold + 1, bisect_left(before, before[start] + need))
        k = bisect_left(cut_at, first)
        if k == len(cut_at):
            return cuts
        s = cut_at[k]
        if crossing is not None:
            hold = min(run_end[k], s + CUT_WINDOW - 1)
            window = crossing[s : hold + 1]
            s += window.index(min(window))  # the first of the fewest, as argmin
        cuts.append(s)
        start, s = s, s + 1


def crossing_bytes(steps, data_root, private, sizes_of) -> list[int]:
    """Per step p, the bytes of the values a cut at p leaves to checkpoints: planned data
    written before p and read in forward at p or later (``sizes_of[root]``: its bytes)."""
    n, S = len(data_root), len(steps)
    roots = np.asarray(data_root, np.int64)
    # a root's first writer and last forward reader, over arrays (a chain has T steps)
    first, last = np.full(n, S, np.int64), np.full(n, -1, np.int64)
    for ends, side, reduce in ((first, "tops", np.minimum), (last, "bottoms", np.maximum)):
        counts = [len(getattr(step, side)) for step in steps]
        blobs = np.fromiter(itertools.chain.from_iterable(getattr(step, side) for step in steps),
                            np.int64, sum(counts))
        reduce.at(ends, roots[blobs], np.repeat(np.arange(S, dtype=np.int64), counts))
    crossing = (first < S) & (last > first)
    crossing[np.fromiter(private, np.int64, len(private))] = False
    at = np.flatnonzero(crossing)
    size = np.asarray(sizes_of, np.int64)[at]
    delta = np.zeros(S + 2, np.int64)
    np.add.at(delta, first[at] + 1, size)
    np.add.at(delta, last[at] + 1, -size)
    return np.cumsum(delta[:S]).tolist()


def _relived_roots(steps, layers, data_root, private, kept, chunks) -> bytes:
    """Per data root, whether backward's forward runs may write it again (a life per run):
    every writer may run again (is not in ``kept``), and it is not a kept blob, nor
    a part of a kept whole (the Slice parts of an input, which live inside it), nor the x
    rows of a weight-gradient chunk unless all of them are (its one GEMM reads them
    together, from one buffer)."""
    n_blobs = len(data_root)
    again = bytearray(n_blobs)
    fixed = bytearray(n_blobs)
    for s, (step, layer) in enumerate(zip(steps, layers)):
        if "data" in layer.memory.shares_bottom:
            continue
        whole_kept = (layer.memory.parts_of_whole == "tops"
                      and data_root[step.bottoms[0]] in private)
        for b in step.tops:
            r = data_root[b]
            if s in kept or r in private or whole_kept:
                fixed[r] = 1
            else:
                again[r] = 1
    for r in range(n_blobs):
        if fixed[r]:
            again[r] = 0
    for chunk in chunks:
        rows = [data_root[steps[s].bottoms[0]] for s in chunk]
        if not all(again[r] for r in rows):
            for r in rows:
                again[r] = 0
    return bytes(again)
