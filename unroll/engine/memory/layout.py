"""Layout: a :class:`~unroll.engine.memory.lifetimes.Liveness` and the blobs' shapes in, an
immutable :class:`Layout` out (docs/design.md, 6. Memory): every buffer's offset in the
workspace, what lives inside what, and the :class:`LayerFlags` each layer is told.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from unroll.engine.memory.aliases import Aliases, aliases_of, landing
from unroll.engine.memory.placement import place
from unroll.engine.memory.weight_gradients import plan_weight_gradients

if TYPE_CHECKING:
    from unroll.engine.memory.lifetimes import Liveness

__all__ = ["LayerFlags", "Layout", "input_roots", "layout", "planned_bytes"]


class LayerFlags(NamedTuple):
    """What a layout tells one layer (:meth:`~unroll.engine.layer.Layer.apply_layout`'s arguments):
    which of its parts live inside the whole (data flags, diff flags), which bottom diffs are
    the top's, and whether the net computes its param gradient for every sharer at once."""

    parts_in_whole: tuple | None = None
    diff_aliased: tuple = ()
    param_diffs_batched: bool = False


@dataclass(frozen=True)
class Layout:
    """Where a net's planned buffers sit in the workspace, for one set of shapes.

    Per kind ("data", "diff"), read-only arrays by buffer (a data buffer is
    numbered as its root, or after the blobs where backward's forward runs
    write the root again: :meth:`Liveness.data_buffers`): ``offset`` the
    workspace byte offset of its own memory (-1: none), ``whole`` the buffer
    it lives inside (-1: none) and ``within`` its element offset there.
    ``scratch`` maps (step, name, run) to offsets, run -1 the forward pass's,
    0, 1, ... the step's runs in backward; ``total`` is the bytes the
    workspace needs; ``groups`` are the weight-gradient groups and ``sizes``
    the bytes of their buffers (roots numbered after the blobs); ``flags``
    pairs steps with the :class:`LayerFlags` of every layer that takes part
    in a layout (the others keep the defaults).
    """

    offset: Mapping
    whole: Mapping
    within: Mapping
    scratch: Mapping
    total: int
    groups: tuple
    sizes: Mapping
    flags: tuple


def layout(plan: Liveness, steps, layers, bottom_need, shapes, rewritten,
           itemsize: int, aliases: Aliases | None = None) -> Layout:
    """The layout of ``plan`` for blob shapes ``shapes`` (``itemsize`` bytes per element).

    Besides each blob's own buffer: parts placed inside their whole (Concat,
    Slice), diffs passed through unchanged (Eltwise SUM) sharing one buffer,
    and the rows of layers that share a param placed back to back, so that its
    gradient is one GEMM. ``rewritten`` lists the blobs written in place;
    ``aliases`` are the net's (:func:`~unroll.engine.memory.aliases.aliases_of`, found
    once for every plan a budget weighs; None: found here).
    """
    told = [s for s, m in enumerate(layer.memory for layer in layers)
            if m.parts_of_whole or m.passes_diff or m.batched_param_gradient]
    if aliases is None:
        again = plan.recompute.relived if plan.recompute is not None else b""
        aliases = aliases_of(steps, layers, plan, shapes, rewritten, bottom_need, again)
    data_host, diff_host, parts = aliases.resolved(plan)
    n_blobs, n_buffers = len(shapes), plan.buffers
    groups, counts = plan_weight_gradients(steps, layers, plan, bottom_need, shapes, data_host,
                                           diff_host, rewritten, aliases.writes, n_buffers)
    batched = {s for group in groups for s in group.steps}
    sizes = {key: n * itemsize for key, n in counts.items()}
    elems = np.array([math.prod(shape) for shape in shapes], np.int64)
    # with recomputation, a whole's data may die part by part before its diff is written
    # there (a time-major projection, re-read by the forward runs in backward): one buffer
    shared = (_data_then_diff(plan, data_host, diff_host, elems) if plan.recompute is not None
              else set())
    # kept per net, and a bucketed model keeps many nets: arrays by buffer, not dicts;
    # the groups' buffers are numbered after the data buffers
    n = n_buffers + len(sizes)
    whole, within = {}, {}
    for kind, host in (("data", data_host), ("diff", diff_host)):
        whole[kind], within[kind] = np.full(n, -1, np.int32), np.zeros(n, np.int64)
        if host:
            roots = np.fromiter(host, np.int64, len(host))
            placed = np.fromiter(itertools.chain.from_iterable(host.values()), np.int64,
                                 2 * len(host)).reshape(-1, 2)  # (whole, offset) a buffer
            whole[kind][roots], within[kind][roots] = placed[:, 0], placed[:, 1]
    private = np.zeros(n, bool)
    private[list(plan.private)] = True
    nbytes = {"data": np.zeros(n, np.int64), "diff": np.zeros(n, np.int64)}
    nbytes["data"][:n_buffers] = elems[np.concatenate(
        [np.arange(n_blobs), np.asarray(plan.root_of, np.int64)])] * itemsize
    nbytes["diff"][:n_blobs] = elems * itemsize
    for (kind, r), size in sizes.items():
        nbytes[kind][r] = size
    data_ids, data_first, data_last = _spans_of(plan.data_life)
    data_keys = np.fromiter(data_host, np.int64, len(data_host))
    # the data of the blobs' own buffers, the diffs, then the buffers of values run again
    # (a chunk's x rows of a batched weight gradient back to back in a buffer of their own)
    roots = data_ids < n_blobs
    passes = []
    for kind, (ids, first, last), keys in (
            ("data", (data_ids[roots], data_first[roots], data_last[roots]),
             data_keys[data_keys < n_blobs]),
            ("diff", _spans_of(plan.diff_life), np.fromiter(diff_host, np.int64, len(diff_host))),
            ("data", (data_ids[~roots], data_first[~roots], data_last[~roots]),
             data_keys[data_keys >= n_blobs])):
        ids, first, last = _placed(ids, first, last, keys, whole[kind], private)
        passes.append((kind, ids, first, last, nbytes[kind][ids]))
    if shared:  # the data buffer takes in the diff's lifetime, and the diff goes
        _, ids, first, last, size = passes[0]
        _, dids, dfirst, dlast, dsize = passes[1]
        both = np.array(sorted(shared), np.int64)
        at, dat = np.flatnonzero(np.isin(ids, both)), np.flatnonzero(np.isin(dids, both))
        at, dat = at[np.argsort(ids[at])], dat[np.argsort(dids[dat])]  # both by root
        first[at] = np.minimum(first[at], dfirst[dat])
        last[at] = np.maximum(last[at], dlast[dat])
        keep = np.ones(len(dids), bool)
        keep[dat] = False
        passes[1] = ("diff", dids[keep], dfirst[keep], dlast[keep], dsize[keep])
    scratch_keys, scratch_spans = [], []
    for s, layer in enumerate(layers):
        if not layer.scratch_specs:
            continue
        runs = range(-1, len(plan.again_at.get(s, ())))  # the forward pass's, then the runs'
        for name, (shape, dtype, lives) in layer.scratch_specs.items():
            size = math.prod(shape) * np.dtype(dtype).itemsize
            for run in runs:
                span = plan.scratch_life(s, lives, run)
                if span is not None:
                    scratch_spans.append((*span, size))
                    scratch_keys.append((s, name, run))
    scratch_spans = np.array(scratch_spans, np.int64).reshape(-1, 3)
    offsets, total = place(*(np.concatenate([*(p[i] for p in passes), scratch_spans[:, i - 2]])
                             for i in (2, 3, 4)))
    offset = {kind: np.full(n, -1, np.int64) for kind in ("data", "diff")}
    at = 0
    for kind, ids, *_ in passes:
        offset[kind][ids] = offsets[at : at + len(ids)]
        at += len(ids)
    scratch = dict(zip(scratch_keys, offsets[at:].tolist()))
    for r in shared:
        offset["diff"][r] = offset["data"][r]
    for arrays in (offset, whole, within):
        for a in arrays.values():
            a.flags.writeable = False
    return Layout(MappingProxyType(offset), MappingProxyType(whole), MappingProxyType(within),
                  MappingProxyType(scratch), total, tuple(groups), MappingProxyType(sizes),
                  tuple((s, LayerFlags(parts.get(s), aliases.passed.get(s, ()), s in batched))
                        for s in told))


def _spans_of(life) -> tuple:
    """A :class:`~unroll.engine.memory.lifetimes.Lifetimes`' buffers, ascending, and their
    first and last times, as arrays."""
    ids = np.flatnonzero(life._first >= 0)
    return ids, life._first[ids].astype(np.int64), life._last[ids].astype(np.int64)


def _placed(ids, first, last, hosted, whole, private) -> tuple:
    """The buffers placed in the workspace, of those with spans ``ids`` (ascending) and
    those ``hosted`` inside others (``whole``: each buffer's host, -1 none): a host lives
    as long as any buffer inside it, and comes after the buffers with spans of their own
    where it has none, in the order the buffers inside it were hosted; neither hosted
    buffers nor ``private`` ones are placed."""
    n = len(whole)
    lo, hi = np.full(n, np.iinfo(np.int64).max), np.full(n, -1, np.int64)
    lo[ids], hi[ids] = first, last
    spanned = np.zeros(n, bool)
    spanned[ids] = True
    inside = hosted[spanned[hosted]]
    top = inside.copy()
    while len(top):
        up = whole[top]
        if not (up >= 0).any():
            break
        top = np.where(up >= 0, up, top)
    np.minimum.at(lo, top, lo[inside])
    np.maximum.at(hi, top, hi[inside])
    new = top[~spanned[top]]
    _, seen = np.unique(new, return_index=True)
    every = np.concatenate([ids, new[np.sort(seen)]])
    every = every[(whole[every] < 0) & ~private[every]]
    return every, lo[every], hi[every]


def planned_bytes(plan: Liveness, layout: Layout, shapes, itemsize: int,
                  inputs=frozenset()) -> int:
    """The bytes a net plans besides its params and its inputs: the workspace of ``layout``
    (every planned activation, diff and scratch buffer) and the data of the blobs it keeps
    (outputs, losses, ``keep=``) other than the ``inputs`` (:func:`input_roots`), which
    hold the caller's batch whatever the plan."""
    kept = sum(math.prod(shapes[r]) for r in set(plan.data_root)
               if r in plan.private and r not in inputs)
    return layout.total + kept * itemsize


def input_roots(steps, layers, data_root) -> set[int]:
    """The data roots of the tops of a net's Input layers."""
    return {data_root[t] for step, layer in zip(steps, layers) if layer.type == "Input"
            for t in step.tops}


def _data_then_diff(plan, data_host, diff_host, elems) -> set[int]:
    """Roots whose data and diff may be one buffer: every element's data is last read
    before its diff is first written, for every value placed inside the root's data (by
    its data life) and diff (by its diff life); ``elems`` are the blobs' element counts."""
    n_blobs = len(elems)
    items = []  # per kind: the wholes, first elements, counts and times of what is inside
    for host, life, pick in ((data_host, plan.data_life, 1), (diff_host, plan.diff_life, 0)):
        roots = np.fromiter(host, np.int64, len(host))
        roots = roots[roots < n_blobs]  # roots, not buffers of a run again
        roots = roots[life._first[roots] >= 0]
        wholes, firsts = landing(host, roots)
        times = (life._first, life._last)[pick][roots].astype(np.int64)
        items.append((wholes, firsts, elems[roots], times))
    data_first, data_last = plan.data_life._first, plan.data_life._last
    diff_first = plan.diff_life._first
    held = np.unique(items[0][0])  # a root's data whole holding something: may it be one?
    held = held[held < n_blobs]
    held = held[(diff_first[held] >= 0) & (data_first[held] >= 0)]
    hosted = np.fromiter((*data_host, *diff_host), np.int64, len(data_host) + len(diff_host))
    held = held[~np.isin(held, hosted) & ~np.isin(held, np.fromiter(plan.private, np.int64))]
    if not len(held):
        return set()
    # each whole's own buffer, then what lives inside it, by kind (0: data, 1: diff)
    kinds, wholes, starts, counts, times = [], [], [], [], []
    for kind, (w, first, count, time), own in ((0, items[0], data_last), (1, items[1],
                                                                         diff_first)):
        inside = np.isin(w, held)
        kinds += [np.full(len(held) + inside.sum(), kind)]
        wholes += [held, w[inside]]
        starts += [np.zeros(len(held), np.int64), first[inside]]
        counts += [elems[held], count[inside]]
        times += [own[held].astype(np.int64), time[inside]]
    kinds, wholes, starts, counts, times = map(np.concatenate, (kinds, wholes, starts, counts,
                                                               times))
    # the pieces between every whole's cuts, as one sorted key a cut: whole, element
    span = int((starts + counts).max()) + 1
    cuts = np.unique(np.concatenate([wholes * span + starts, wholes * span + starts + counts]))
    lo = np.searchsorted(cuts, wholes * span + starts)
    hi = np.searchsorted(cuts, wholes * span + starts + counts)
    widths = hi - lo
    pieces = np.repeat(lo - np.cumsum(widths) + widths, widths) + np.arange(widths.sum())
    last = np.full(len(cuts), -1, np.int64)  # per piece: the latest data read ...
    first = np.full(len(cuts), 1 << 62, np.int64)  # ... and the earliest diff write
    of_data = np.repeat(kinds == 0, widths)
    np.maximum.at(last, pieces[of_data], np.repeat(times, widths)[of_data])
    np.minimum.at(first, pieces[~of_data], np.repeat(times, widths)[~of_data])
    late = np.unique(cuts[last >= first] // span)
    return set(held[~np.isin(held, late)].tolist())
