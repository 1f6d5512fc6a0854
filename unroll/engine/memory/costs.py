"""What a recomputation plan costs, found without its liveness or its layout
(docs/design.md, 6. Memory): the forward steps a one-level plan runs again, counted from
what each step needs, and a lower bound on any plan's bytes, so that a budget lays out
only the plans that may fit. Both are read off arrays made once per net and shapes
(:func:`plan_costs`); an attempt is then a few numpy passes over them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from unroll.engine.memory.liveness import saves_scratch

__all__ = ["PlanCosts", "plan_costs"]

#: a step that no cut lets run again: later than every step
NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class PlanCosts:
    """A net's steps and backward reads, as arrays, for costing its plans.

    ``needed_by[s]``: the first step whose segment must reach it for step s to run again in
    a one-level plan (:data:`NEVER`: it never does); ``read_step`` and ``read_root``: every
    (step, data root) that a backward reads, of the roots counted in a bound (planned, not
    a whole others live inside, not inside a kept blob), by root then step;
    ``root_bytes`` and ``last_write``: per data root its bytes and the last step writing
    it; ``scratch`` per step the bytes of the scratch it keeps from forward to backward;
    ``kept`` the bytes of the kept blobs (outputs, losses, ``keep=``, not inputs)."""

    needed_by: np.ndarray
    read_step: np.ndarray
    read_root: np.ndarray
    root_bytes: np.ndarray
    last_write: np.ndarray
    scratch: np.ndarray
    kept: int

    def recomputed(self, cuts) -> int:
        """The forward steps a one-level plan of segments starting at ``cuts`` runs again:
        :attr:`~unroll.engine.memory.segments.Recompute.recomputed` of its
        :func:`~unroll.engine.memory.liveness.forward_runs`, without the walk. Every
        segment but the last runs again right before its backward, from its own backward
        reads alone (a cut splits no in-place chain, so no later action reads what it
        writes): a step runs where its segment ends after ``needed_by``."""
        steps = len(self.needed_by)
        bounds = np.asarray([*cuts, steps], np.int64)
        end = bounds[np.searchsorted(bounds, np.arange(steps), side="right")]
        return int(np.count_nonzero((self.needed_by < end) & (end < steps)))

    def least_bytes(self, cuts, one_level: bool = True) -> int:
        """A lower bound on the bytes of any plan of segments starting at ``cuts``
        (:func:`~unroll.engine.memory.layout.planned_bytes`; ``one_level``: the plan runs
        the segments last first, each once).

        When a segment's first backward runs, every value its backward reads is in memory
        (the forward pass's, or its run's right before), and so is the scratch its steps
        keep; at one level, so are the values that the backward of an earlier segment reads
        from before that segment, which no run writes first. Those are distinct values, none
        a whole of others, each in memory of its own while it lives: the kept blobs and the
        largest of those sums bound the workspace from below."""
        bounds = np.asarray([0, *cuts], np.int64)
        n = len(bounds)
        segment = np.searchsorted(bounds, self.read_step, side="right") - 1
        root = self.read_root
        # a root's reads in one segment count once: reads are by root then step
        first = np.ones(len(root), bool)
        first[1:] = (root[1:] != root[:-1]) | (segment[1:] != segment[:-1])
        before = np.zeros(n, np.int64)  # per segment: the earlier segments' values
        if one_level:
            # the values an earlier segment's backward reads from before its start, from
            # the first such segment on (later segments start later: a suffix of a root's)
            early = first & (self.last_write[root] < bounds[segment])
            since = early.copy()
            since[1:] &= ~(early[:-1] & (root[1:] == root[:-1]))
            held = np.full(len(self.root_bytes), n, np.int64)
            held[root[since]] = segment[since]
            first &= held[root] >= segment  # counted in ``before`` already
            before[1:] = np.cumsum(np.bincount(held[root[since]],
                                               self.root_bytes[root[since]], n))[:-1]
        own = np.bincount(segment[first], self.root_bytes[root[first]], n)
        scratch = np.bincount(np.searchsorted(bounds, np.arange(len(self.scratch)),
                                              side="right") - 1, self.scratch, n)
        return self.kept + int((before + own + scratch).max())


def plan_costs(steps, layers, data_root, private, layer_need, again, shapes, itemsize: int,
               kept: int) -> PlanCosts:
    """The :class:`PlanCosts` of a net: ``again`` is what may run again (a
    :class:`~unroll.engine.memory.segments.Recomputable`, whose ``reads`` are the steps'
    backward reads), ``private`` the roots that keep memory of their own, ``kept`` the bytes
    of the kept blobs."""
    S, n_roots = len(steps), len(data_root)
    reads = again.reads
    # lists in the loops over steps, arrays once: a NumPy scalar a touch costs more
    first_read = [NEVER] * n_roots
    for s in reversed(range(S)):
        for r in reads[s]:
            first_read[r] = s
    # walking the steps last first: a step runs again where a value it writes, which the
    # runs write again, is read by a backward or by a later step that runs, in its segment
    needed_by = [NEVER] * S
    via = [NEVER] * n_roots
    relived = again.relived
    for s in reversed(range(S)):
        step, layer = steps[s], layers[s]
        if s in again.kept or "data" in layer.memory.shares_bottom:
            continue  # never runs again (a view writes nothing)
        need = s if saves_scratch(layer, layer_need[s]) else NEVER
        for b in step.tops:
            r = data_root[b]
            if relived[r]:
                need = min(need, first_read[r], via[r])
        needed_by[s] = need
        if need != NEVER:
            for b in step.bottoms:
                r = data_root[b]
                via[r] = min(via[r], need)
    counted = _counted_roots(steps, layers, data_root, private)
    read_root = np.fromiter((r for rs in reads for r in rs), np.int64)
    read_step = np.repeat(np.arange(S, dtype=np.int64), [len(rs) for rs in reads])
    keep = np.frombuffer(bytes(counted), np.uint8)[read_root].astype(bool)
    pairs = np.unique(read_root[keep] * S + read_step[keep])  # by root, then step
    last_write = [-1] * n_roots
    for s, step in enumerate(steps):
        for b in step.tops:
            last_write[data_root[b]] = s
    scratch = np.zeros(S, np.int64)
    for s, layer in enumerate(layers):
        if saves_scratch(layer, layer_need[s]):
            scratch[s] = sum(math.prod(shape) * np.dtype(dtype).itemsize
                             for shape, dtype, lives in layer.scratch_specs.values()
                             if lives == "both")
    return PlanCosts(np.array(needed_by, np.int64), pairs % S, pairs // S,
                     np.array([math.prod(shape) * itemsize for shape in shapes], np.int64),
                     np.array(last_write, np.int64), scratch, kept)


def _counted_roots(steps, layers, data_root, private) -> bytearray:
    """Per data root, whether a bound counts its bytes: planned, and neither a whole that
    other values may live inside (a Concat's top, a Slice's bottom) nor a part of a kept
    one, whose memory the kept blobs count."""
    counted = bytearray([1]) * len(data_root)
    inside: list[tuple[int, list[int]]] = []
    for step, layer in zip(steps, layers):
        kind = layer.memory.parts_of_whole
        if kind is not None:
            whole, parts = ((step.tops[0], step.bottoms) if kind == "bottoms"
                            else (step.bottoms[0], step.tops))
            inside.append((data_root[whole], [data_root[b] for b in parts]))
    kept = set(private)
    grew = True
    while grew:  # a part of a part of a kept whole is kept too
        grew = False
        for whole, parts in inside:
            if whole in kept and not kept.issuperset(parts):
                kept.update(parts)
                grew = True
    for whole, _ in inside:
        counted[whole] = 0
    for r in kept:
        if r < len(counted):
            counted[r] = 0
    return counted
