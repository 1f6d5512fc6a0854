"""Liveness: a net's run order in, every buffer's lifetime out (a
:class:`~unroll.engine.memory.lifetimes.Liveness`), from the graph alone (docs/design.md,
6. Memory). One walk over the forward pass and backward's actions (with a
:class:`~unroll.engine.memory.segments.Recompute` plan, its actions), in which a value
run again is a buffer per run.
"""

from __future__ import annotations

import dataclasses
from array import array
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from unroll.engine.memory.lifetimes import Lifetimes, Liveness
from unroll.engine.memory.segments import one_level_order
from unroll.engine.memory.walk import data_walk, saves_scratch, step_roots

if TYPE_CHECKING:
    from unroll.engine.memory.segments import Recompute
    from unroll.graph import Step

__all__ = ["backward_reads", "forward_runs", "liveness", "private_blobs", "saves_scratch"]


def private_blobs(steps, layers, table, named, phase: str, loss_blobs) -> set[int]:
    """Blobs readable after a run, which keep memory of their own: inputs, those ``named``
    (outputs, ``keep=``; ``table`` pairs names with blobs), losses, and in the test phase
    what losses and accuracies read (the predictions, as pycaffe users read them)."""
    private = {b for name, b in table if name in named}
    for step, layer in zip(steps, layers):
        if layer.type == "Input":
            private.update(step.tops)
        elif phase == "test" and (layer.is_loss or layer.type == "Accuracy"):
            private.update(step.bottoms)
    private.update(loss_blobs)
    return private


def _roots(steps, layers, n_blobs: int, what: str) -> list[int]:
    root = list(range(n_blobs))
    for step, layer in zip(steps, layers):
        if what in layer.memory.shares_bottom:
            for t in step.tops:
                root[t] = root[step.bottoms[0]]
    return root


def liveness(steps: list[Step], layers, n_blobs: int, private_blobs, layer_need,
             bottom_need, loss_blobs, regions=(), recompute: Recompute | None = None,
             base: Liveness | None = None) -> Liveness:
    """The lifetime of every buffer of the net, from the graph alone.

    A value's data lives from its producer's forward until its last reader:
    forward readers, and backward readers as the layers' ``backward_reads``
    declare (``"bottom"``: a reader's backward, of the bottoms its
    :attr:`~unroll.engine.memory_traits.MemoryTraits.reads_in_backward` names; ``"top"``: the
    producer's). A
    diff lives from the first backward that writes it to the backward of its
    producer, which consumes it. Within a :class:`Region` whose branches run at
    once, forward or backward, every buffer the region touches lives through
    all of it: the branches' order is not known in advance.

    One walk over the actions in time order. Without a :class:`Recompute`
    plan, backward is every step's backward, last first; with one, the plan's
    actions in order, each the forward of a segment's steps again or a
    segment's backward. A value those runs write again has a buffer per run
    that writes it, from its writing to its last reader before the next
    (:meth:`Liveness.data_buffers`); a run writes only what something reads
    before the next run does (or what its backward reads, in the run right
    before it).

    ``base`` is the net's liveness without a plan (made with ``recompute`` None), or None.
    Every diff a backward touches is the same in every plan; only the times move. Where
    backward runs the steps last first, as segments do, and no region widens lifetimes, the
    diffs' lifetimes and zeroing are ``base``'s, moved to this plan's backward times, and
    the walk never reads the layers for diffs (an attempt of a budget walks T steps' diffs
    no more).
    """
    if base is not None:  # the same steps: the same views
        data_root, diff_root = base.data_root, base.diff_root
    else:
        data_root = array("i", _roots(steps, layers, n_blobs, "data"))
        diff_root = array("i", _roots(steps, layers, n_blobs, "diff"))
    private = {data_root[b] for b in private_blobs} | {diff_root[b] for b in private_blobs}
    S = len(steps)
    if recompute is None:  # backward in one segment, run forward again never
        bounds, order, runs, again = [0, S], (-1,), (), bytes(n_blobs)
    else:
        bounds = [0, *recompute.cuts, S]
        if not recompute.runs:
            recompute = forward_runs(steps, layers, data_root, layer_need, bottom_need,
                                     recompute)
        order, runs, again = recompute.order, recompute.runs, recompute.relived
    reads = (recompute.reads if recompute is not None and recompute.reads else
             backward_reads(steps, layers, data_root, layer_need, bottom_need))
    # one walk over the actions in time order, over arrays: the forward pass, the loss at
    # S, then backward's; a value run again gets a buffer per run that writes it
    walk = data_walk(recompute.roots if recompute is not None and recompute.roots else
                     step_roots(steps, layers, data_root, reads, layer_need),
                     n_blobs, bounds, order, runs, again, layer_need)
    windows = [w for r in regions
               for w in ((r.start, r.stop - 1), (2 * S - r.stop + 1, 2 * S - r.start))]
    kept = np.fromiter(private, np.int64, len(private))
    back = walk.back.tolist()
    backs = walk.back.astype(np.int32)
    if base is not None and not windows and (np.diff(backs) < 0).all():
        # base's step s ran backward at 2S - s; the moved times keep their order, so every
        # first and last touch, and which backward reads a diff before one writes it, stay
        moved = np.full(2 * S + 2, -1, np.int32)  # moved[-1]: no time stays no time
        moved[2 * S - np.arange(S)] = backs
        diff_life, zero_before = base.diff_life.moved(moved), base.zero_before
    else:
        diffs = _Diffs(diff_root)
        for s in np.argsort(walk.back).tolist():  # backward's steps in time order
            if layer_need[s]:
                diffs.backward(steps[s], layers[s], back[s], bottom_need[s])
        step_at = dict(zip(back, range(S)))
        diff_life = _planned(Lifetimes(diffs.life, n_blobs), kept, windows)
        zero_before = diffs.zero_before(loss_blobs, private, S, step_at.__getitem__)
    life_root = walk.life_root
    return Liveness(
        S, data_root, diff_root, private,
        _planned(Lifetimes.of(walk.first, walk.last), kept, windows), diff_life, zero_before,
        list(layer_need), tuple(back), windows,
        MappingProxyType(walk.again_at),
        array("i", life_root.astype(np.intc).tobytes()),
        array("i", walk.life_action.astype(np.intc).tobytes()),
        np.searchsorted(life_root, np.arange(n_blobs + 1)) if len(life_root) else None,
        recompute, reads)


def _planned(life: Lifetimes, private: np.ndarray, windows) -> Lifetimes:
    """``life`` without the ``private`` roots (they keep memory of their own), each span
    stretched over every window of a concurrent region it meets."""
    first, last = life._first, life._last
    first[private], last[private] = -1, -1
    for a, b in windows:  # in order, as :func:`~unroll.engine.memory.regions.widened`
        meets = (first >= 0) & (first <= b) & (last >= a)
        first[meets], last[meets] = np.minimum(first[meets], a), np.maximum(last[meets], b)
    return life


class _Diffs:
    """Diff lifetimes as backward runs: from the first backward writing a diff to the
    backward of its producer; and which diffs backward reads before anything writes them.
    Backward's steps come in time order."""

    def __init__(self, diff_root):
        self.diff_root, self.life, self.reads, self.writes = diff_root, {}, {}, {}

    def backward(self, step, layer, back: int, need) -> None:
        if "diff" in layer.memory.shares_bottom:
            return  # a view's diff is its bottom's: its backward moves nothing
        root, life = self.diff_root, self.life
        for bs, downs, firsts in ((step.tops, None, self.reads),
                                  (step.bottoms, need, self.writes)):
            for k, b in enumerate(bs):
                if downs is not None and not downs[k]:
                    continue
                r = root[b]  # backward runs in time order: a touch moves only the end
                if r in life:
                    life[r][1] = back
                else:
                    life[r] = [back, back]
                firsts.setdefault(r, back)

    def zero_before(self, loss_blobs, private, S: int, step_at) -> dict[int, list[int]]:
        """Step -> the diff roots zeroed right before its backward (``step_at``: the step
        whose backward runs at a time)."""
        for b in loss_blobs:
            self.writes[self.diff_root[b]] = S
        out: dict[int, list[int]] = {}
        for r, first_read in self.reads.items():
            if r not in private and self.writes.get(r, first_read) >= first_read:
                out.setdefault(step_at(first_read), []).append(r)
        return out


def forward_runs(steps, layers, data_root, layer_need, bottom_need, recompute: Recompute
                 ) -> Recompute:
    """``recompute`` with its ``order`` (one level where empty) and its ``runs``: per
    action, the steps a forward action runs, those whose values something reads before
    they are written again and the steps they read from (found walking backward in time),
    and in the run right before a segment's backward the steps that save scratch for it.
    The runs give :attr:`~unroll.engine.memory.segments.Recompute.recomputed` without
    the rest of a liveness walk."""
    bounds = [0, *recompute.cuts, len(steps)]
    order = recompute.order or one_level_order(len(bounds) - 1)
    again = recompute.relived
    # the forward run right before a segment's backward is its last: what backward reads
    final = {~a: i - 1 for i, a in enumerate(order) if a < 0 and i and order[i - 1] == ~a}
    # which steps each forward run needs, walking backward in time: a run writing what
    # something reads before the next write runs, and so do the steps it reads from
    pending = bytearray(len(data_root))
    reads = recompute.reads or backward_reads(steps, layers, data_root, layer_need, bottom_need)
    at = recompute.roots or step_roots(steps, layers, data_root, reads, layer_need)
    # lists, not arrays, for the step by step walk: a step's tops' roots, then its bottoms'
    roots, start, ends = at.roots.tolist(), at.start.tolist(), (at.start[:-1] + at.tops).tolist()
    view, saves = at.view, at.saves
    read = np.frombuffer(pending, np.uint8)  # the same bytes: a segment's reads at once
    runs: list = [None] * len(order)
    for i in reversed(range(len(order))):
        a = order[i]
        if a < 0:
            read[at.reads[at.read_start[bounds[~a]] : at.read_start[bounds[~a + 1]]]] = 1
            continue
        ran = []
        last = final.get(a) == i
        for s in reversed(recompute.steps[a]):
            if view[s]:
                continue  # a view writes nothing
            tops = roots[start[s] : ends[s]]
            if any(pending[r] and again[r] for r in tops) or (last and saves[s]):
                for r in tops:
                    pending[r] = 0
                for r in roots[ends[s] : start[s + 1]]:
                    pending[r] = 1
                ran.append(s)
        runs[i] = array("i", reversed(ran))
    return dataclasses.replace(recompute, order=tuple(order), runs=tuple(runs))


def backward_reads(steps, layers, data_root, layer_need, bottom_need) -> tuple:
    """Per step, the data roots its backward reads (none where it runs no backward): its
    tops' where its layer's ``backward_reads`` names "top", and the bottoms its
    :meth:`~unroll.engine.layer.Layer.reads_in_backward` names."""
    out = []
    for step, layer, runs, need in zip(steps, layers, layer_need, bottom_need):
        reads = []
        if runs:
            if "top" in layer.backward_reads:
                reads += [data_root[b] for b in step.tops]
            reads += [data_root[b] for k, b in enumerate(step.bottoms)
                      if layer.memory.reads_in_backward(layer, k, need)]
        out.append(tuple(reads))
    return tuple(out)

