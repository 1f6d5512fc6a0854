"""One weight-gradient GEMM per chunk of a shared param's sharers (docs/design.md, 6. Memory,
chunks of time): the chunks, from shapes only (:func:`gradient_chunks`), and the rows of each
placed back to back (:func:`plan_weight_gradients`).
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from unroll.engine.memory.aliases import landing, resolve

if TYPE_CHECKING:
    from unroll.engine.memory.lifetimes import Liveness
    from unroll.graph import Step

__all__ = ["GRADIENT_CHUNK", "WeightGradGroup", "gradient_chunks", "plan_weight_gradients",
           "time_chunks"]


#: a weight-gradient GEMM covers sharers spanning at most this much of their bottoms' axis 0
#: (timesteps, in an unrolled net): its chunks' rows then die chunk by chunk, and the
#: chunks do not depend on the memory budget, so every plan runs the same GEMMs
GRADIENT_CHUNK = 32


def time_chunks(steps: int) -> list[range]:
    """The chunks of :data:`GRADIENT_CHUNK` timesteps of an axis 0 of ``steps``, last first.

    A lone layer whose rows span the whole of time (an output InnerProduct over a
    (T, N, H) blob) sums its weight gradient by these chunks, one GEMM each, in the order
    backward would reach them as separate layers: so a net whose loss runs by chunks
    (:mod:`unroll.engine.memory.separable`) gives the same bits.

    >>> time_chunks(70)
    [range(64, 70), range(32, 64), range(0, 32)]
    """
    return [range(start, min(start + GRADIENT_CHUNK, steps))
            for start in reversed(range(0, steps, GRADIENT_CHUNK))]


@dataclass
class WeightGradGroup:
    """Layers sharing one param whose weight gradient is ONE GEMM over all their rows.

    ``steps`` are the members in row order; after the backward of step
    ``after`` (the last member backward reaches) the net runs the GEMM over
    ``x`` (data) and ``gy`` (diff), each ``(buffer, first element)`` of a
    buffer holding every member's rows back to back, ``rows`` of them.
    """

    steps: list[int]
    after: int
    x: tuple[int, int]
    gy: tuple[int, int]
    rows: int


def _tiling(roots, host, counts):
    """How ``roots`` sit in other buffers: None if in none, ``(whole, first element,
    order)`` if back to back in one whole (in that order), False otherwise."""
    if all(r not in host for r in roots):
        return None
    placed = [resolve(host, r) for r in roots]
    if len({whole for whole, _ in placed}) != 1:
        return False
    order = sorted(range(len(roots)), key=lambda i: placed[i][1])
    ends = [placed[i][1] + counts[i] for i in order]
    if [placed[i][1] for i in order[1:]] != ends[:-1]:
        return False
    return placed[0][0], placed[order[0]][1], order


def _writes_at(plan: Liveness, shapes, diff_host, writes) -> tuple:
    """Backward's diff writes at ``plan``'s times: arrays of the host (ascending), first
    and end element and time, the steps' ``writes`` and the zeroing of diffs (half a step
    before the backward it comes before)."""
    hosts, firsts, ends, writers = writes
    back = np.asarray(plan.back, np.float64)
    times = back[writers]
    zeroed = [(r, s) for s, roots in plan.zero_before.items() for r in roots]
    if not zeroed:
        return hosts, firsts, ends, times
    roots, steps = np.array(zeroed, np.int64).T
    wholes, starts = landing(diff_host, roots)
    counts = np.array([math.prod(shapes[r]) for r in roots.tolist()], np.int64)
    hosts, firsts = np.concatenate([hosts, wholes]), np.concatenate([firsts, starts])
    ends, times = np.concatenate([ends, starts + counts]), np.concatenate([times,
                                                                          back[steps] - 0.5])
    order = np.lexsort((firsts, hosts))
    return hosts[order], firsts[order], ends[order], times[order]


def gradient_chunks(steps: list[Step], layers, layer_need, shapes) -> list[tuple[int, ...]]:
    """The sharers of one param whose weight gradient may be one GEMM, in chunks.

    Layers declaring a ``memory.batched_param_gradient`` with one ``key``
    share a param the same way; in run order, consecutive ones form a chunk
    while their bottoms span at most :data:`GRADIENT_CHUNK` along axis 0 (a
    bottom longer than that is a chunk alone). The chunks depend on shapes
    only, never on a memory budget: the full plan and every budgeted plan
    accumulate the same GEMMs in the same order, and segments of a
    recomputation plan are cut between chunks (:func:`allowed_cuts`).
    Returns the chunks of two members or more, each in run order.
    """
    by_param: dict[tuple, list[int]] = {}
    for s, layer in enumerate(layers):
        batched = layer.memory.batched_param_gradient
        if layer_need[s] and batched is not None and layer.blobs:
            by_param.setdefault(batched.key(layer), []).append(s)
    chunks = []
    for members in by_param.values():
        chunk: list[int] = []
        span = 0
        for s in members:
            shape = shapes[steps[s].bottoms[0]]
            extent = shape[0] if shape else 1
            if chunk and span + extent > GRADIENT_CHUNK:
                chunks.append(tuple(chunk))
                chunk, span = [], 0
            chunk.append(s)
            span += extent
        chunks.append(tuple(chunk))
    return [c for c in chunks if len(c) > 1]


def plan_weight_gradients(steps: list[Step], layers, plan: Liveness, bottom_need, shapes,
                          data_host: dict, diff_host: dict, rewritten, writes,
                          n_roots: int) -> tuple[list[WeightGradGroup], dict]:
    """Group the layers that share a param, so that its gradient is one GEMM per chunk.

    A layer declaring a ``memory.batched_param_gradient`` computes its param
    gradient as a GEMM over rows of its bottom (x) and of its top's diff (gy),
    in its ``backward(layer, x, gy)``; the layers of one chunk (:func:`gradient_chunks`)
    form a group. The members' rows go
    back to back, time-major: where they already tile one block of a whole
    (the time-major diff of a shared input projection, reached through
    pass-through diffs; the Slice parts of an input) they stay, otherwise
    they get a new buffer, x and gy in one order. Both stay live until the
    group's GEMM. A group needs every member's x and gy planned (not kept),
    written nowhere in place, and no backward write landing in a member's gy
    rows between its backward and the GEMM. Where a recomputation plan runs
    a chunk's x rows again, their buffers at the GEMM (the run's right before
    it) go back to back in a buffer and the GEMM reads them there.

    ``writes`` are the net's backward diff writes (:attr:`~unroll.engine.memory.aliases.
    Aliases.writes`), ``n_roots`` numbers the new buffers (``n_roots, n_roots + 1, ...``).
    Returns the groups and ``{(kind, buffer): elements}`` of the new buffers;
    ``data_host``/``diff_host`` gain the placements.
    """
    # a recomputation plan carries the chunks of these shapes, found once for every attempt
    groups = (plan.recompute.chunks if plan.recompute is not None else
              gradient_chunks(steps, layers, plan.layer_need, shapes))
    if not groups:
        return [], {}
    written = {plan.data_root[b] for b in rewritten} | {plan.diff_root[b] for b in rewritten}
    at = plan.back.__getitem__
    hosts, firsts, ends, times = _writes_at(plan, shapes, diff_host, writes)

    def untouched(members, whole, regions) -> bool:
        """No backward write lands in member i's rows from its backward to the GEMM."""
        gemm, since = at(members[0]), [at(s) for s in members]
        lo, hi = np.searchsorted(hosts, whole, "left"), np.searchsorted(hosts, whole, "right")
        block = min(first for first, _ in regions), max(end for _, end in regions)
        stop = lo + np.searchsorted(firsts[lo:hi], block[1])  # the writes starting in it
        near = lo + np.flatnonzero((ends[lo:stop] > block[0]) & (times[lo:stop] <= gemm)
                                   & (times[lo:stop] >= min(since)))
        spans = sorted((first, end, s_) for s_, (first, end) in zip(since, regions))
        starts = [first for first, _, _ in spans]
        for a, b, t in zip(firsts[near].tolist(), ends[near].tolist(), times[near].tolist()):
            k = max(bisect_right(starts, a) - 1, 0)
            while k < len(spans) and spans[k][0] < b:  # every member block the write meets
                _, end, s_ = spans[k]
                if a < end and s_ <= t:
                    return False
                k += 1
        return True

    # the buffer of every member's x rows at its group's GEMM, for all groups at once: a
    # root run again has its buffers numbered after the blobs
    x_of = [[plan.data_root[steps[s].bottoms[0]] for s in members] for members in groups]
    sizes_of = [len(members) for members in groups]
    at_gemm = plan.buffers_at(
        np.fromiter(itertools.chain.from_iterable(x_of), np.int64, sum(sizes_of)),
        np.repeat(np.array([at(members[0]) for members in groups], np.int64), sizes_of))
    x_at_gemm = np.split(at_gemm, np.cumsum(sizes_of)[:-1])
    out, sizes = [], {}
    for members, x_roots, x_buffers in zip(groups, x_of, x_at_gemm):
        layer = layers[members[0]]
        gy_roots = [plan.diff_root[steps[s].tops[0]] for s in members]
        x_counts = [math.prod(shapes[steps[s].bottoms[0]]) for s in members]
        gy_counts = [math.prod(shapes[steps[s].tops[0]]) for s in members]
        again = (x_buffers >= len(plan.data_root)).tolist()
        if any(r in plan.private or r in written for r in x_roots + gy_roots) or (
                any(again) and not all(again)):
            continue
        if all(again):  # the GEMM reads each row's buffer of the run right before it
            x_roots = x_buffers.tolist()
        if len(set(x_roots)) < len(members) or len(set(gy_roots)) < len(members):
            continue
        x_tiles = _tiling(x_roots, data_host, x_counts)
        gy_tiles = _tiling(gy_roots, diff_host, gy_counts)
        if x_tiles is False or gy_tiles is False:
            continue  # some rows live inside other buffers, but not as one block
        orders = [t[2] for t in (x_tiles, gy_tiles) if t is not None]
        if len(orders) == 2 and orders[0] != orders[1]:
            continue
        order = orders[0] if orders else list(range(len(members)))
        if gy_tiles is not None and not untouched(
                members, gy_tiles[0],
                [(first, first + n) for (_, first), n in
                 zip((resolve(diff_host, r) for r in gy_roots), gy_counts)]):
            continue
        blocks = []
        for kind, tiles, roots, counts, host in (("data", x_tiles, x_roots, x_counts, data_host),
                                                 ("diff", gy_tiles, gy_roots, gy_counts,
                                                  diff_host)):
            if tiles is not None:
                blocks.append(tiles[:2])
                continue
            whole, n_roots, offset = n_roots, n_roots + 1, 0
            for i in order:
                host[roots[i]] = (whole, offset)
                offset += counts[i]
            sizes[(kind, whole)] = offset
            blocks.append((whole, 0))
        gy_width = layer.memory.batched_param_gradient.row_widths(layer)[1]
        out.append(WeightGradGroup([members[i] for i in order], members[0], blocks[0],
                                   blocks[1], sum(gy_counts) // gy_width))
    return out, sizes
