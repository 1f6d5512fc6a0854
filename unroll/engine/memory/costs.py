"""What a recomputation plan costs, found without its liveness or its layout
(docs/design.md, 6. Memory): the forward steps a one-level plan runs again, counted from
what each step needs, and a lower bound on any plan's bytes, so that a budget lays out
only the plans that may fit. Both are read off arrays made once per net and shapes
(:func:`plan_costs`); an attempt is then a few numpy passes over them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from unroll.engine.memory.liveness import saves_scratch

__all__ = ["PlanCosts", "plan_costs"]

#: a step that no cut lets run again: later than every step
NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class PlanCosts:
    """A net's steps and reads, as arrays, for costing its plans.

    ``needed_by[s]``: the first step whose segment must reach it for step s to run again in
    a one-level plan (:data:`NEVER`: it never does); ``read_step`` and ``read_root``: every
    (step, data root) that a backward reads, by root then step, and ``bottom_step`` and
    ``bottom_root`` every one that a forward step reads; ``root_bytes`` and ``last_write``:
    per data root its bytes and the last step writing it; ``host`` per root the root whose
    memory it lives in whatever the plan (a part in its whole, :attr:`~unroll.engine.
    memory.aliases.Aliases.data`; -1: its own), ``pairs`` the (part, whole) roots that
    backward's runs may write again, hosted where the same runs write both
    (:attr:`~unroll.engine.memory.aliases.Aliases.again`, in its order), and ``writer_root``
    and ``writer_step`` the steps writing those roots; ``uncounted`` marks the roots kept
    (their memory is in ``kept``); ``scratch`` per step the bytes of the scratch it keeps
    from forward to backward; ``kept`` the bytes of the kept blobs (outputs, losses,
    ``keep=``, not inputs)."""

    needed_by: np.ndarray
    read_step: np.ndarray
    read_root: np.ndarray
    bottom_step: np.ndarray
    bottom_root: np.ndarray
    root_bytes: np.ndarray
    last_write: np.ndarray
    host: np.ndarray
    pairs: np.ndarray
    writer_root: np.ndarray
    writer_step: np.ndarray
    uncounted: np.ndarray
    scratch: np.ndarray
    kept: int

    def runs_again(self, cuts) -> np.ndarray:
        """Per step, whether a one-level plan of segments starting at ``cuts`` runs it
        again (the steps of its :func:`~unroll.engine.memory.liveness.forward_runs`),
        without the walk. Every segment but the last runs again right before its backward,
        from its own backward reads alone (a cut splits no in-place chain, so no later
        action reads what it writes): a step runs where its segment ends after
        ``needed_by``."""
        steps = len(self.needed_by)
        bounds = np.asarray([*cuts, steps], np.int64)
        end = bounds[np.searchsorted(bounds, np.arange(steps), side="right")]
        return (self.needed_by < end) & (end < steps)

    def recomputed(self, cuts) -> int:
        """The forward steps a one-level plan of segments starting at ``cuts`` runs again:
        :attr:`~unroll.engine.memory.segments.Recompute.recomputed` of its
        :func:`~unroll.engine.memory.liveness.forward_runs` (:meth:`runs_again`)."""
        return int(np.count_nonzero(self.runs_again(cuts)))

    def least_bytes(self, cuts, one_level: bool = True) -> int:
        """A lower bound on the bytes of any plan of segments starting at ``cuts``
        (:func:`~unroll.engine.memory.layout.planned_bytes`; ``one_level``: the plan runs
        the segments last first, each once).

        When a segment's first backward runs, every value its backward reads is in memory
        (the forward pass's, or its run's right before), and so is the scratch its steps
        keep; at one level, so are the values that the backward or the run of an earlier
        segment reads from before that segment (its checkpoints among them), which no run
        writes first. Each value is in the memory of the whole it lives in (a step's h
        inside its chunk's Concat of them, an x row inside its chunk's projection), which
        the layout places as one buffer while anything inside it lives: distinct wholes,
        each in memory of its own, and the kept blobs and the largest of those sums bound
        the workspace from below."""
        bounds = np.asarray([0, *cuts], np.int64)
        n = len(bounds)
        ran = self.runs_again(cuts) if one_level else None
        block = self._blocks(bounds, ran)
        segment = np.searchsorted(bounds, self.read_step, side="right") - 1
        read = block[self.read_root]
        # per whole: the first segment from which on it is held for an earlier segment
        held = self._held(bounds, ran, block) if one_level else np.full(len(block) + 1, n)
        before = 0
        if one_level:
            wholes = np.flatnonzero(held[:-1] < n)
            before = np.zeros(n, np.int64)  # per segment: the earlier segments' values
            before[1:] = np.cumsum(np.bincount(held[wholes], self.root_bytes[wholes], n))[:-1]
        # a whole read in one segment counts once, and not where it is held already
        pairs = np.unique(read * n + segment)
        whole, segment = pairs // n, pairs % n
        mine = (whole < len(block)) & (held[whole] >= segment)
        own = np.bincount(segment[mine], self.root_bytes[whole[mine]], n)
        scratch = np.bincount(np.searchsorted(bounds, np.arange(len(self.scratch)),
                                              side="right") - 1, self.scratch, n)
        return self.kept + int((before + own + scratch).max())

    def checkpoint_bytes(self, cuts) -> float:
        """The bytes a checkpoint at each of ``cuts`` holds, on average: the wholes that the
        runs of a one-level plan of those segments read from before their start, or their
        backwards (as :meth:`least_bytes` counts them), by cut (0 without cuts)."""
        bounds = np.asarray([0, *cuts], np.int64)
        ran = self.runs_again(cuts)
        held = self._held(bounds, ran, self._blocks(bounds, ran))[:-1]
        return float(self.root_bytes[held < len(bounds)].sum()) / max(len(cuts), 1)

    def _held(self, bounds, ran, block) -> np.ndarray:
        """Per whole (``block``'s, then one for the uncounted), the first segment of a
        one-level plan from which on it is held for an earlier one (``len(bounds)``:
        never): what an earlier segment's backward or run (``ran``) reads from before its
        start (later segments start later: from the first such segment on)."""
        n = len(bounds)
        held = np.full(len(block) + 1, n, np.int64)
        segment = np.searchsorted(bounds, self.read_step, side="right") - 1
        early = self.last_write[self.read_root] < bounds[segment]
        np.minimum.at(held, block[self.read_root[early]], segment[early])
        at = np.searchsorted(bounds, self.bottom_step, side="right") - 1
        early = ran[self.bottom_step] & (self.last_write[self.bottom_root] < bounds[at])
        np.minimum.at(held, block[self.bottom_root[early]], at[early])
        held[-1] = n
        return held

    def _blocks(self, bounds, ran) -> np.ndarray:
        """Per data root, the outermost whole whose memory holds it in the plan (itself
        where none; ``len(host)``: uncounted, a kept blob's or unknown). ``ran``: the steps
        a one-level plan runs again, whose runs decide which parts run again share their
        whole's buffers (:meth:`~unroll.engine.memory.aliases.Aliases.resolved`: where the
        same runs write both); None: not known, so such a whole counts nothing, and its
        parts their own bytes."""
        n_roots = len(self.host)
        up = self.host.copy()
        part, whole = self.pairs
        uncounted = self.uncounted.copy()
        if ran is None:
            uncounted[whole] = True
        elif len(part):
            # the segments whose runs write each root: the same set, the same buffers
            seg = np.searchsorted(bounds, self.writer_step, side="right") - 1
            written = ran[self.writer_step]
            keys = np.unique(self.writer_root[written] * len(bounds) + seg[written])
            roots, segs = keys // len(bounds), keys % len(bounds)
            count = np.bincount(roots, minlength=n_roots)
            start = np.searchsorted(roots, np.arange(n_roots))
            same = count[part] == count[whole]
            one = same & (count[part] == 1)
            same[one] = segs[start[part[one]]] == segs[start[whole[one]]]
            for i in np.flatnonzero(same & (count[part] > 1)).tolist():
                a, b, c = start[part[i]], start[whole[i]], count[part[i]]
                same[i] = bool((segs[a:a + c] == segs[b:b + c]).all())
            # the first pairing of a part holds it, as the layout's
            _, first = np.unique(part[same], return_index=True)
            up[part[same][first]] = whole[same][first]
        block = np.arange(n_roots)
        while True:  # up the chain of wholes
            outer = up[block]
            moving = outer >= 0
            if not moving.any():
                break
            block = np.where(moving, outer, block)
        block[uncounted[block]] = n_roots
        return block


def plan_costs(steps, layers, data_root, private, layer_need, again, shapes, itemsize: int,
               kept: int, aliases) -> PlanCosts:
    """The :class:`PlanCosts` of a net: ``again`` is what may run again (a
    :class:`~unroll.engine.memory.segments.Recomputable`, whose ``reads`` are the steps'
    backward reads), ``private`` the roots that keep memory of their own, ``kept`` the bytes
    of the kept blobs, ``aliases`` what lives inside what
    (:func:`~unroll.engine.memory.aliases.relived_aliases`, for ``again``)."""
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
    read_root = np.fromiter((r for rs in reads for r in rs), np.int64)
    read_step = np.repeat(np.arange(S, dtype=np.int64), [len(rs) for rs in reads])
    read = np.unique(read_root * S + read_step)  # by root, then step
    root = np.asarray(data_root, np.int64)
    # what a step run again reads (a view never runs again) and what it writes
    runs = np.array([not (s in again.kept or "data" in layer.memory.shares_bottom)
                     for s, layer in enumerate(layers)], bool)
    bottom_step, bottom_root = _blobs_of(steps, root, "bottoms")
    bottom = np.unique(bottom_root[runs[bottom_step]] * S + bottom_step[runs[bottom_step]])
    writer_step, writer_root = _blobs_of(steps, root, "tops")
    last_write = np.full(n_roots, -1, np.int64)
    np.maximum.at(last_write, writer_root, writer_step)
    relived_at = np.frombuffer(bytes(relived), np.uint8).astype(bool)
    pairs = np.array([(r, w) for _, _, r, w, _ in aliases.again], np.int64).reshape(-1, 2).T
    pairs = pairs[:, relived_at[pairs[0]] & relived_at[pairs[1]]]  # else never one buffer
    writes = runs[writer_step] & np.isin(writer_root, pairs)
    host = np.full(n_roots, -1, np.int64)
    hosted = np.fromiter((r for r in aliases.data if r < n_roots), np.int64)
    host[hosted] = [aliases.data[r][0] for r in hosted.tolist()]
    uncounted = np.zeros(n_roots, bool)
    uncounted[np.fromiter((r for r in private if r < n_roots), np.int64)] = True
    scratch = np.zeros(S, np.int64)
    for s, layer in enumerate(layers):
        if saves_scratch(layer, layer_need[s]):
            scratch[s] = sum(math.prod(shape) * np.dtype(dtype).itemsize
                             for shape, dtype, lives in layer.scratch_specs.values()
                             if lives == "both")
    return PlanCosts(np.array(needed_by, np.int64), read % S, read // S, bottom % S,
                     bottom // S,
                     np.array([math.prod(shape) * itemsize for shape in shapes], np.int64),
                     last_write, host, pairs, writer_root[writes], writer_step[writes],
                     uncounted, scratch, kept)


def _blobs_of(steps, root, which: str) -> tuple[np.ndarray, np.ndarray]:
    """Every (step, data root) of the steps' ``which`` ("tops" or "bottoms"), as arrays."""
    counts = [len(getattr(step, which)) for step in steps]
    blobs = np.fromiter(itertools.chain.from_iterable(getattr(step, which) for step in steps),
                        np.int64, sum(counts))
    return np.repeat(np.arange(len(steps), dtype=np.int64), counts), root[blobs]
