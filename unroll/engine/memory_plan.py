"""The memory plan: a net's run order in, an immutable layout of its memory out.

Two passes, as a planner of tinygrad's kind: :func:`liveness` reads the run
order (the steps of :func:`unroll.graph.build_graph`, which layers run
backward, which blobs stay readable) and gives every buffer its lifetime;
:func:`layout` adds the shapes and gives every buffer its place in the
workspace, with what each layer is told (:class:`LayerFlags`). Nothing here
allocates or runs anything: :mod:`unroll.engine.executor` binds a layout to the
workspace, :class:`unroll.engine.net.Net` hands each layer its flags through
:meth:`~unroll.engine.layer.Layer.apply_layout`. A net built with
``plan_memory=False`` plans nothing: every blob keeps memory of its own.

What the layout does beyond giving each buffer its own bytes (docs/design.md,
6. Memory): buffers whose lifetimes do not overlap share memory
(:func:`place`); the parts of a Concat or Slice live inside their whole
(:func:`group_parts`); a diff passed through unchanged (Eltwise SUM) is its
bottoms' diff too (:func:`alias_pass_through_diffs`); the rows of the layers
that share a param go back to back, so that its gradient is one GEMM per chunk
of :data:`GRADIENT_CHUNK` timesteps (:func:`plan_weight_gradients`); within a
region whose branches run at once (:func:`concurrent_regions`) every buffer
lives through all of it.

Within a memory budget (:func:`within_budget`), backward recomputes segments
of the forward from checkpoints (a :class:`Recompute` plan), cut between
weight-gradient chunks, at one level or at several (BPTT-HSM,
:func:`hsm_order`): a value that forward runs in backward write again has a
life per run, each its own buffer.

Time, for lifetimes, counts forward steps ``0..S-1``, then ``S`` when loss
diffs are filled, then backward steps, step ``s`` at ``2S - s`` (with a
:class:`Recompute` plan, its actions' steps one after another).

>>> import numpy as np
>>> from unroll import Net
>>> net = Net('''
...   layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
...   layer { name: "a" type: "ReLU" bottom: "x" top: "a" }
...   layer { name: "b" type: "TanH" bottom: "a" top: "b" }
...   layer { name: "c" type: "Sigmoid" bottom: "b" top: "c" }''', phase="test")
>>> net.memory.layout.total  # 'a' and 'b' are planned; 'c' is the output: it is kept
128
"""

from __future__ import annotations

import bisect
import functools
import heapq
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from unroll.core.errors import MemoryBudgetError
from unroll.engine.workspace import ALIGN

if TYPE_CHECKING:
    from unroll.graph import Step

__all__ = ["GRADIENT_CHUNK", "HSM_MOST_FORWARDS", "Layout", "LayerFlags", "Lifetimes",
           "Liveness", "Recompute", "Region", "WeightGradGroup", "alias_pass_through_diffs",
           "allowed_cuts", "bptt_hsm", "concurrent_regions", "crossing_bytes",
           "gradient_chunks", "greedy_cuts", "group_parts", "hsm_order", "hsm_units",
           "input_roots", "layout", "liveness", "one_level_order", "place",
           "plan_weight_gradients", "planned_bytes", "private_blobs", "recompute_plan",
           "within_budget"]


#: a weight-gradient GEMM covers sharers spanning at most this much of their bottoms' axis 0
#: (timesteps, in an unrolled net): its chunks' rows then die chunk by chunk, and the
#: chunks do not depend on the memory budget, so every plan runs the same GEMMs
GRADIENT_CHUNK = 32


# -- what the plan gives ------------------------------------------------------------------
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

    Per kind ("data", "diff"), read-only arrays by root: ``offset`` the
    workspace byte offset of its own buffer (-1: none), ``whole`` the root it
    lives inside (-1: none) and ``within`` its element offset there;
    ``offset["data_re"]`` places the lives of data that backward's forward runs
    write again, by life id (:class:`Liveness`). ``scratch`` maps (step, name)
    to offsets (``scratch_re``: (step, name, run) in a step's runs in backward);
    ``total`` is the bytes the
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
    scratch_re: Mapping = field(default_factory=dict)


def layout(plan: Liveness, steps, layers, bottom_need, shapes, rewritten,
           itemsize: int) -> Layout:
    """The layout of ``plan`` for blob shapes ``shapes`` (``itemsize`` bytes per element).

    Besides each blob's own buffer: parts placed inside their whole (Concat,
    Slice), diffs passed through unchanged (Eltwise SUM) sharing one buffer,
    and the rows of layers that share a param placed back to back, so that its
    gradient is one GEMM. ``rewritten`` lists the blobs written in place.
    """
    told = {s: {} for s, layer in enumerate(layers)
            if layer.parts_of_whole or layer.passes_diffs or layer.batches_param_diffs}
    data_host, diff_host, parts, data_re_host = group_parts(steps, layers, plan, shapes,
                                                            rewritten)
    skipped = {}
    for s, (data_flags, diff_flags) in parts.items():
        told[s]["parts_in_whole"] = (tuple(data_flags), tuple(diff_flags))
        # a Slice writes its whole's diff unless every part is inside it
        skipped[s] = diff_flags if layers[s].parts_of_whole == "bottoms" else [all(diff_flags)]
    aliased = alias_pass_through_diffs(steps, layers, plan, bottom_need, diff_host, rewritten)
    for s, fl in aliased.items():
        told[s]["diff_aliased"] = skipped[s] = tuple(fl)
    n_blobs = len(shapes)
    groups, counts = plan_weight_gradients(steps, layers, plan, bottom_need, shapes, data_host,
                                           diff_host, rewritten, skipped, n_blobs, data_re_host)
    for group in groups:
        for s in group.steps:
            told[s]["param_diffs_batched"] = True
    sizes = {key: n * itemsize for key, n in counts.items()}
    # with recomputation, a whole's data may die part by part before its diff is written
    # there (a time-major projection, re-read by the forward runs in backward): one buffer
    shared = (_data_then_diff(plan, data_host, diff_host, shapes) if plan.recompute is not None
              else set())
    buffers, keys, spans_of = [], [], {}
    lives = [("data", plan.data_life, data_host), ("diff", plan.diff_life, diff_host)]
    if plan.data_re_life is not None:
        # the lives of data written again in backward (a chunk's rows of a batched weight
        # gradient back to back in a buffer of their own)
        lives.append(("data_re", plan.data_re_life, data_re_host))
    for kind, life, host in lives:
        spans = dict(life.items())
        for r in host:  # a buffer inside another lives as long as either
            if r in life:
                top = r
                while top in host:
                    top = host[top][0]
                first, last = life[r]
                a, b = spans.get(top, (first, last))
                spans[top] = (min(a, first), max(b, last))
        spans_of[kind] = spans
        relives = kind == "data_re"  # keys are life ids, not roots
        if kind == "diff":
            for r in shared:
                a, b = buffers[keys.index(("data", r))][:2]
                c, d = spans.pop(r)
                buffers[keys.index(("data", r))] = (min(a, c), max(b, d),
                                                    _count(shapes[r]) * itemsize)
        for r, (first, last) in spans.items():
            if r not in host and (relives or r not in plan.private):
                nbytes = (sizes[(kind, r)] if (kind, r) in sizes else
                          _count(shapes[plan.re_root[r] if relives else r]) * itemsize)
                buffers.append((first, last, nbytes))
                keys.append((kind, r))
    for s, layer in enumerate(layers):
        for name, (shape, dtype, lives) in layer.scratch_specs.items():
            nbytes = _count(shape) * np.dtype(dtype).itemsize
            span = plan.scratch_life(s, lives)
            if span is not None:
                buffers.append((span[0], span[1], nbytes))
                keys.append(("scratch", (s, name)))
            for run in range(len(plan.re_time.get(s, ()))):
                span = plan.scratch_re_life(s, lives, run)
                if span is not None:
                    buffers.append((span[0], span[1], nbytes))
                    keys.append(("scratch_re", (s, name, run)))
    offsets, total = place(buffers)
    # kept per net, and a bucketed model keeps many nets: arrays by root, not dicts
    # the groups' buffers are numbered after the blobs (after the lives, for "data_re")
    n = max(n_blobs, len(plan.re_root)) + len(sizes)
    offset = {kind: np.full(n, -1, np.int64) for kind in ("data", "diff", "data_re")}
    scratch: dict = {"scratch": {}, "scratch_re": {}}
    for (kind, r), at in zip(keys, offsets):
        if kind in scratch:
            scratch[kind][r] = at
        else:
            offset[kind][r] = at
    for r in shared:
        offset["diff"][r] = offset["data"][r]
    whole, within = {}, {}
    for kind, host in (("data", data_host), ("diff", diff_host), ("data_re", data_re_host)):
        whole[kind], within[kind] = np.full(n, -1, np.int32), np.zeros(n, np.int64)
        if host:
            roots = np.fromiter(host, np.int64, len(host))
            whole[kind][roots], within[kind][roots] = zip(*host.values())
    for arrays in (offset, whole, within):
        for a in arrays.values():
            a.flags.writeable = False
    return Layout(MappingProxyType(offset), MappingProxyType(whole), MappingProxyType(within),
                  MappingProxyType(scratch["scratch"]), total, tuple(groups),
                  MappingProxyType(sizes),
                  tuple((s, LayerFlags(**flags)) for s, flags in told.items()),
                  MappingProxyType(scratch["scratch_re"]))


def planned_bytes(plan: Liveness, layout: Layout, shapes, itemsize: int,
                  inputs=frozenset()) -> int:
    """The bytes a net plans besides its params and its inputs: the workspace of ``layout``
    (every planned activation, diff and scratch buffer) and the data of the blobs it keeps
    (outputs, losses, ``keep=``) other than the ``inputs`` (:func:`input_roots`), which
    hold the caller's batch whatever the plan."""
    kept = sum(_count(shapes[r]) for r in set(plan.data_root)
               if r in plan.private and r not in inputs)
    return layout.total + kept * itemsize


def input_roots(steps, layers, data_root) -> set[int]:
    """The data roots of the tops of a net's Input layers."""
    return {data_root[t] for step, layer in zip(steps, layers) if layer.type == "Input"
            for t in step.tops}


def within_budget(make, lay_out, steps, layers, shapes, itemsize: int, budget=None,
                  mode=None, name: str = "") -> tuple[Liveness, Layout]:
    """The liveness and layout of a net that fit ``budget`` bytes (:func:`planned_bytes`)
    with the fewest forward steps recomputed, or, for ``mode="sqrt"``, Chen et al.'s
    segments of about a square root of the steps each (where those need less memory than
    no recomputation).

    ``make(recompute)`` gives the net's :class:`Liveness` for a :class:`Recompute`
    plan (None: none), ``lay_out(liveness)`` its layout for the current shapes.
    Segments are Chen's greedy ones (:func:`greedy_cuts`), of every halving of
    the steps' bytes down to a step each and of a square root of the steps:
    of those that fit, the one that runs fewest steps again. Where none fits
    and the net is a chain of three weight-gradient chunks or more, Gruslys
    et al.'s BPTT-HSM over its chunks (:func:`hsm_order`, a segment a chunk):
    of the slot counts whose policy runs every step forward at most
    :data:`HSM_MOST_FORWARDS` times, the most that fit. One level with a
    segment a chunk runs each step at most twice, no more than BPTT-HSM with
    a slot for every chunk, so BPTT-HSM serves the budgets one level cannot
    reach. ``mode="hsm"`` takes BPTT-HSM in any case (without a budget: its
    fewest slots, the least memory, where that is less than without
    recomputation). A budget none fits is a
    :class:`~unroll.core.errors.MemoryBudgetError` giving the smallest plan
    found.
    """
    base = make(None)
    full = lay_out(base)
    if budget is None and mode is None:
        return base, full
    inputs = input_roots(steps, layers, base.data_root)
    chunks = gradient_chunks(steps, layers, base.layer_need, shapes)
    # a param with one chunk (T <= GRADIENT_CHUNK) may be cut inside it: its rows are then
    # kept, as without chunks; segments of a longer chain start between chunks, where the
    # fewest bytes cross
    count = Counter(layers[c[0]].param_batch_key() for c in chunks)
    between = [c for c in chunks if count[layers[c[0]].param_batch_key()] > 1]
    allowed = allowed_cuts(steps, layers, base.data_root, between)
    sizes = [sum(_count(shapes[b]) * itemsize for b in step.tops
                 if base.data_root[b] == b and b not in base.private) for step in steps]
    total = max(sum(sizes), 1)
    crossing = (crossing_bytes(steps, base.data_root, base.private,
                               [_count(shape) * itemsize for shape in shapes])
                if between else None)

    planned: dict[tuple, tuple] = {}

    def attempt_order(cuts, order=(), slots=None):
        # segments of a few steps all end at the same cuts (between weight-gradient
        # chunks): each plan is made once
        if (cuts, order) not in planned:
            plan = make(recompute_plan(steps, layers, base.data_root, cuts, chunks, order,
                                       slots))
            layout_ = lay_out(plan)
            planned[(cuts, order)] = (planned_bytes(plan, layout_, shapes, itemsize, inputs),
                                      plan, layout_)
        return planned[(cuts, order)]

    def attempt(segment_bytes):
        return attempt_order(tuple(greedy_cuts(sizes, allowed, segment_bytes, crossing)))

    def error(smallest):
        return MemoryBudgetError(
            f"net '{name}': memory_budget {budget:,} bytes is too small: the smallest plan "
            f"found needs {smallest:,} bytes (activations, diffs, scratch and kept blobs; "
            f"params and inputs not counted)", smallest)

    need = planned_bytes(base, full, shapes, itemsize, inputs)
    units = hsm_units(between, allowed, crossing) if between else ()
    if mode == "hsm" and len(units) >= 2 and (budget is None or need > budget):
        best, least = _within_budget_hsm(attempt_order, units, budget)
        if best is None:
            raise error(least)
        if budget is None and least >= need:  # never more memory, for nothing
            return base, full
        return best[1], best[2]
    if mode == "sqrt":  # never more memory than without recomputation, for nothing
        n, plan, layout_ = attempt(total / max(1.0, len(steps) ** 0.5))
        return (plan, layout_) if n < need else (base, full)
    if budget is None or need <= budget:
        return base, full
    # every halving of the segments' bytes down to a step each, and Chen's square root:
    # memory falls then rises, and the steps run again do not follow the size
    step = min((n for n in sizes if n), default=total) / 2  # segments of a step, at least
    tries = [total / 2**k for k in range(1, 64) if total / 2**k >= step]
    tries.append(total / max(1.0, len(steps) ** 0.5))
    smallest, best = need, None
    for segment in tries:
        n, plan, layout_ = attempt(segment)
        smallest = min(smallest, n)
        if n <= budget and (best is None or (plan.recompute.recomputed, n) < best[0]):
            best = ((plan.recompute.recomputed, n), plan, layout_)
    if best is None and len(units) >= 2:
        best, least = _within_budget_hsm(attempt_order, units, budget)
        smallest = min(smallest, least)
    if best is None:
        raise error(smallest)
    return best[1], best[2]


#: a multi-level plan runs each step forward at most this many times (BPTT-HSM's fewest
#: slots tried): fewer slots save little more memory, for ever more recomputation
HSM_MOST_FORWARDS = 6


def _within_budget_hsm(attempt, units, budget) -> tuple[tuple | None, int]:
    """BPTT-HSM's plan over the segments starting at ``units`` with the most slots that
    fits ``budget`` (``(key, liveness, layout)``, None if none; without a budget, the
    fewest slots) and the smallest plan it found; ``attempt(cuts, order)`` plans one."""
    n = len(units) + 1
    fewest = 2
    while fewest < n and bptt_hsm(n, fewest) > HSM_MOST_FORWARDS * n:
        fewest += 1

    def fit(m):
        got, plan, layout_ = attempt(units, hsm_order(n, m), m)
        return (plan.recompute.recomputed, got), plan, layout_

    least = fit(fewest)
    if budget is None or least[0][1] > budget:
        return (least if budget is None else None), least[0][1]
    lo, hi = fewest, n + 1  # the planned bytes grow with the slots: the most that fit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fit(mid)[0][1] <= budget else (lo, mid)
    return fit(lo), least[0][1]


def hsm_units(between, allowed, crossing) -> tuple:
    """The cuts of BPTT-HSM's segments in a chain: between every two weight-gradient
    chunks (``between``, in run order), the allowed cut the fewest bytes cross; the steps
    before the first chunk go with it, those after the last with that.

    >>> hsm_units([(1, 2), (4, 5), (7, 8)], [1, 3, 4, 6, 7], [0, 0, 0, 5, 2, 0, 3, 1, 0])
    (4, 7)
    """
    spans = sorted((min(c), max(c)) for c in between)
    allowed = set(allowed)
    cuts = []
    for (_, last), (first, _) in zip(spans, spans[1:]):
        window = [p for p in range(last + 1, first + 1) if p in allowed]
        if window:
            cuts.append(min(window, key=crossing.__getitem__))
    return tuple(cuts)


def _data_then_diff(plan, data_host, diff_host, shapes) -> set[int]:
    """Roots whose data and diff may be one buffer: every element's data is last read
    before its diff is first written, for every value placed inside the root's data (by
    its data life) and diff (by its diff life)."""
    inside: dict[tuple, list] = {}
    for kind, host, life in (("data", data_host, plan.data_life),
                             ("diff", diff_host, plan.diff_life)):
        for r in host:
            if r in life:
                whole, first = _resolve(host, r)
                inside.setdefault((kind, whole), []).append((first, _count(shapes[r]), life[r]))
    out = set()
    for (kind, r), items in inside.items():
        if (kind != "data" or r in plan.private or r in data_host or r in diff_host
                or r not in plan.data_life or r not in plan.diff_life):
            continue
        n = _count(shapes[r])
        data = [(0, n, plan.data_life[r]), *items]
        diff = [(0, n, plan.diff_life[r]), *inside.get(("diff", r), ())]
        cuts = sorted({a for a, _, _ in data + diff} | {a + c for a, c, _ in data + diff})
        last = [-1] * len(cuts)  # per piece between two cuts: the latest data read ...
        first = [1 << 62] * len(cuts)  # ... and the earliest diff write
        for items_, table, pick, better in ((data, last, 1, max), (diff, first, 0, min)):
            for a, c, span in items_:
                for i in range(bisect.bisect_left(cuts, a), bisect.bisect_left(cuts, a + c)):
                    table[i] = better(table[i], span[pick])
        if all(d < g for d, g in zip(last, first)):
            out.add(r)
    return out


def place(buffers) -> tuple[list[int], int]:
    """Offsets for buffers ``(first, last, nbytes)`` live over steps first..last, and the total.

    Two buffers whose lifetimes overlap never overlap in memory. A buffer
    takes, in this order, a freed buffer of its exact size, the smallest freed
    one at most twice its size, or new memory at the end: an unrolled net's
    steps free and ask for the same sizes over and over, so this stays within
    a few percent of the live peak, in O(n log n). Every buffer is aligned to
    :data:`unroll.engine.workspace.ALIGN` bytes.

    >>> place([(0, 1, 64), (1, 2, 64), (2, 3, 64)])
    ([0, 64, 0], 128)
    """
    order = sorted(range(len(buffers)), key=lambda i: buffers[i][0])
    ending: list[tuple[int, int]] = []  # (last, index) of placed buffers, a heap by last
    free: list[tuple[int, int]] = []  # (size, offset), sorted
    offsets = [0] * len(buffers)
    sizes = [-(-max(b[2], 1) // ALIGN) * ALIGN for b in buffers]
    top = 0
    for i in order:
        first = buffers[i][0]
        while ending and ending[0][0] < first:
            _, j = heapq.heappop(ending)
            bisect.insort(free, (sizes[j], offsets[j]))
        need = sizes[i]
        k = bisect.bisect_left(free, (need, -1))
        if k < len(free) and free[k][0] <= 2 * need:
            size, offsets[i] = free.pop(k)
            sizes[i] = size  # the whole block returns to the free list with it
        else:
            offsets[i], top = top, top + need
        heapq.heappush(ending, (buffers[i][1], i))
    return offsets, top


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


# -- liveness: lifetimes from the graph alone ---------------------------------------------
class Lifetimes(Mapping):
    """root -> (first, last) time, for the roots placed in the workspace: a mapping held
    in two int32 arrays, since a net keeps it and a bucketed model keeps many nets."""

    __slots__ = ("_first", "_last")

    def __init__(self, spans: dict, n: int):
        self._first = np.full(n, -1, np.int32)
        self._last = np.full(n, -1, np.int32)
        if spans:
            roots = np.fromiter(spans, np.int64, len(spans))
            firsts, lasts = zip(*spans.values())
            self._first[roots], self._last[roots] = firsts, lasts

    def __getitem__(self, root: int) -> tuple[int, int]:
        if 0 <= root < len(self._first) and self._first[root] >= 0:
            return int(self._first[root]), int(self._last[root])
        raise KeyError(root)

    def __contains__(self, root) -> bool:
        return 0 <= root < len(self._first) and self._first[root] >= 0

    def __iter__(self):
        return iter(np.flatnonzero(self._first >= 0).tolist())

    def __len__(self) -> int:
        return int(np.count_nonzero(self._first >= 0))

    def items(self):
        roots = np.flatnonzero(self._first >= 0)
        return zip(roots.tolist(), zip(self._first[roots].tolist(), self._last[roots].tolist()))


@dataclass(frozen=True)
class Liveness:
    """Lifetimes of a net's memory, from its graph alone (no shapes).

    ``data_root[b]`` / ``diff_root[b]``: the blob whose memory blob b's data /
    diff is (a view or Split top shares its bottom's). ``data_life`` and
    ``diff_life`` map each root placed in the workspace to its (first, last)
    time; roots in ``private`` keep memory of their own (inputs, outputs,
    losses, ``keep=``). ``zero_before[s]`` lists diff roots that backward
    reads before anything writes them: zeroed right before step s's backward.

    With a :class:`Recompute` plan, a value that backward's forward runs write
    again has a life per run, each a buffer of its own: ``data_re_life`` maps
    life ids to their spans, ``re_root`` gives each life's root, lives of root
    r are ids ``re_index[r]`` to ``re_index[r + 1] - 1`` in time order, and
    ``re_born`` gives the action of ``recompute.order`` that starts each one
    (-1: the forward pass). Such roots are not in ``data_life``.
    """

    steps: int
    data_root: array
    diff_root: array
    private: set[int]
    data_life: Lifetimes
    diff_life: Lifetimes
    zero_before: dict[int, list[int]]
    layer_need: list[bool]
    windows: list = field(default_factory=list)  # of concurrent regions, as time spans
    #: with a Recompute plan: each step's backward time, each step's times in backward's
    #: forward runs (of the steps that keep scratch), the lives described above, the plan
    back: tuple | None = None
    re_time: Mapping = field(default_factory=dict)
    data_re_life: Lifetimes | None = None
    re_root: array = field(default_factory=lambda: array("i"))
    re_index: np.ndarray | None = None
    re_born: array = field(default_factory=lambda: array("i"))
    recompute: Recompute | None = None

    def backward_time(self, step: int) -> int:
        return self.back[step] if self.back is not None else 2 * self.steps - step

    def relived(self, root: int) -> bool:
        """Whether ``root``'s data has a life per forward run (in ``data_re_life``)."""
        return self.re_index is not None and self.re_index[root + 1] > self.re_index[root]

    def life_at(self, root: int, time: int) -> int:
        """The id of the life of relived ``root`` that holds its value at ``time``."""
        lo, hi = int(self.re_index[root]), int(self.re_index[root + 1])
        return bisect_right(self.data_re_life._first, time, lo + 1, hi) - 1

    def scratch_life(self, step: int, lives: str) -> tuple[int, int] | None:
        """When scratch of step ``step`` is live in the forward pass: ``lives`` is "forward",
        "backward" or "both". A step that backward runs forward again saves its scratch
        anew then (:meth:`scratch_re_life`)."""
        f, b = step, self.backward_time(step)
        runs_backward = self.layer_need[step]
        if lives == "forward":
            span = (f, f)
        elif lives == "backward":
            if not runs_backward:
                return None
            span = (b, b)
        elif step in self.re_time:
            span = (f, f)  # what backward reads, its last run saves again
        else:
            span = (f, b) if runs_backward else (f, f)
        return _widened(span, self.windows)

    def scratch_re_life(self, step: int, lives: str, run: int) -> tuple[int, int] | None:
        """When scratch of a step is live in its ``run``-th forward run in backward (None:
        not): its last run saves what its backward reads."""
        times = self.re_time[step]
        again = times[run]
        if lives == "backward":
            return None
        if lives == "forward" or not self.layer_need[step] or run < len(times) - 1:
            return (again, again)
        return (again, self.backward_time(step))


def _roots(steps, layers, n_blobs: int, what: str) -> list[int]:
    root = list(range(n_blobs))
    for step, layer in zip(steps, layers):
        if what in layer.shares_bottom:
            for t in step.tops:
                root[t] = root[step.bottoms[0]]
    return root


def liveness(steps: list[Step], layers, n_blobs: int, private_blobs, layer_need,
             bottom_need, loss_blobs, regions=(), recompute: Recompute | None = None
             ) -> Liveness:
    """The lifetime of every buffer of the net, from the graph alone.

    A value's data lives from its producer's forward until its last reader:
    forward readers, and backward readers as the layers' ``backward_reads``
    declare (``"bottom"``: a reader's backward, of the bottoms its
    :meth:`~unroll.engine.layer.Layer.reads_in_backward` names; ``"top"``: the
    producer's). A
    diff lives from the first backward that writes it to the backward of its
    producer, which consumes it. Within a :class:`Region` whose branches run at
    once, forward or backward, every buffer the region touches lives through
    all of it: the branches' order is not known in advance.

    With a :class:`Recompute` plan, backward runs the plan's actions in order,
    each the forward of a segment's steps again or a segment's backward. A
    value those runs write again has a life per run that writes it, each a
    buffer of its own, from its writing to its last reader before the next
    (``data_re_life``); a run writes only what something reads before the next
    run does (or what its backward reads, in the run right before it).
    """
    data_root = _roots(steps, layers, n_blobs, "data")
    diff_root = _roots(steps, layers, n_blobs, "diff")
    private = {data_root[b] for b in private_blobs} | {diff_root[b] for b in private_blobs}
    if recompute is not None:
        return _liveness_recomputed(steps, layers, n_blobs, data_root, diff_root, private,
                                    layer_need, bottom_need, loss_blobs, recompute)
    S = len(steps)
    data_life: dict[int, list[int]] = {}
    diffs = _Diffs(diff_root)
    for s, (step, layer) in enumerate(zip(steps, layers)):
        back = 2 * S - s
        runs_backward = layer_need[s]
        for b in step.tops:
            r = data_root[b]
            _touch(data_life, r, s)
            if runs_backward and "top" in layer.backward_reads:
                _touch(data_life, r, back)
        for k, b in enumerate(step.bottoms):
            r = data_root[b]
            _touch(data_life, r, s)
            if runs_backward and layer.reads_in_backward(k, bottom_need[s]):
                _touch(data_life, r, back)
        if runs_backward:
            diffs.backward(step, layer, back, bottom_need[s])
    windows = [w for r in regions
               for w in ((r.start, r.stop - 1), (2 * S - r.stop + 1, 2 * S - r.start))]
    return Liveness(
        S, array("i", data_root), array("i", diff_root), private,
        Lifetimes({r: _widened(v, windows) for r, v in data_life.items() if r not in private},
                  n_blobs),
        Lifetimes({r: _widened(v, windows) for r, v in diffs.life.items()
                   if r not in private}, n_blobs),
        diffs.zero_before(loss_blobs, private, S, lambda t: 2 * S - t), list(layer_need),
        windows)


def _touch(life, root, t) -> None:
    span = life.get(root)
    if span is None:
        life[root] = [t, t]
    elif t < span[0]:
        span[0] = t
    elif t > span[1]:
        span[1] = t


class _Diffs:
    """Diff lifetimes as backward runs: from the first backward writing a diff to the
    backward of its producer; and which diffs backward reads before anything writes them."""

    def __init__(self, diff_root):
        self.diff_root, self.life, self.reads, self.writes = diff_root, {}, {}, {}

    def backward(self, step, layer, back: int, need) -> None:
        if "diff" in layer.shares_bottom:
            return  # a view's diff is its bottom's: its backward moves nothing
        root = self.diff_root
        for b in step.tops:
            r = root[b]
            _touch(self.life, r, back)
            self.reads[r] = min(self.reads.get(r, back), back)
        for b, down in zip(step.bottoms, need):
            if down:
                r = root[b]
                _touch(self.life, r, back)
                self.writes[r] = min(self.writes.get(r, back), back)

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


def _liveness_recomputed(steps, layers, n_blobs, data_root, diff_root, private, layer_need,
                         bottom_need, loss_blobs, recompute) -> Liveness:
    S = len(steps)
    bounds = [0, *recompute.cuts, S]
    order = recompute.order or one_level_order(len(bounds) - 1)
    again = _relived_roots(steps, layers, data_root, private, recompute, n_blobs)
    # the forward run right before a segment's backward is its last: what backward reads
    final = {~a: i - 1 for i, a in enumerate(order) if a < 0 and i and order[i - 1] == ~a}
    # which steps each forward run needs, walking backward in time: a run writing what
    # something reads before the next write runs, and so do the steps it reads from
    pending = bytearray(n_blobs)
    runs: list = [None] * len(order)
    for i in reversed(range(len(order))):
        a = order[i]
        if a < 0:
            for s in range(bounds[~a], bounds[~a + 1]):
                if layer_need[s]:
                    for r in _backward_reads(steps[s], layers[s], data_root, bottom_need[s]):
                        pending[r] = 1
            continue
        ran = []
        for s in reversed(recompute.steps[a]):
            step, layer = steps[s], layers[s]
            if "data" in layer.shares_bottom:
                continue  # a view writes nothing
            if any(pending[data_root[b]] and again[data_root[b]] for b in step.tops) or (
                    final.get(a) == i and _saves_scratch(layer, layer_need[s])):
                for b in step.tops:
                    pending[data_root[b]] = 0
                for b in step.bottoms:
                    pending[data_root[b]] = 1
                ran.append(s)
        runs[i] = array("i", reversed(ran))
    # lives, walking forward in time: the forward pass, the loss at S, then the actions
    data_life: dict[int, list[int]] = {}
    lives: list[list[int]] = []  # [root, first, last, action]
    current = [-1] * n_blobs  # root -> its life now
    born = [-2] * n_blobs  # root -> the action whose run wrote its current life
    re_time: dict[int, list[int]] = {}

    def touch(r, t) -> None:  # root r's current life is used at time t
        if current[r] >= 0:
            lives[current[r]][2] = t
        else:
            _touch(data_life, r, t)

    def run(run_steps, action: int, t: int) -> int:
        # a forward run (action -1: the forward pass) from time t; the time after it
        for s in run_steps:
            step = steps[s]
            for b in step.tops:
                r = data_root[b]
                if again[r] and born[r] != action:
                    born[r], current[r] = action, len(lives)
                    lives.append([r, t, t, action])
            for b in step.tops + step.bottoms:
                touch(data_root[b], t)
            if action >= 0 and layers[s].scratch_specs:
                re_time.setdefault(s, []).append(t)
            t += 1
        return t

    run(range(S), -1, 0)
    back = [0] * S
    diffs = _Diffs(diff_root)
    t = S + 1
    for i, a in enumerate(order):
        if a >= 0:
            t = run(runs[i], i, t)
            continue
        for s in reversed(range(bounds[~a], bounds[~a + 1])):
            back[s] = t
            if layer_need[s]:
                for r in _backward_reads(steps[s], layers[s], data_root, bottom_need[s]):
                    touch(r, t)
                diffs.backward(steps[s], layers[s], t, bottom_need[s])
            t += 1
    # lives numbered by root, then time: a root's lives are consecutive ids
    lives.sort(key=lambda life: (life[0], life[1]))
    roots = np.fromiter((life[0] for life in lives), np.int64, len(lives))
    step_at = dict(zip(back, range(S)))
    return Liveness(
        S, array("i", data_root), array("i", diff_root), private,
        Lifetimes({r: tuple(v) for r, v in data_life.items() if r not in private}, n_blobs),
        Lifetimes({r: tuple(v) for r, v in diffs.life.items() if r not in private}, n_blobs),
        diffs.zero_before(loss_blobs, private, S, step_at.__getitem__), list(layer_need), [],
        tuple(back), MappingProxyType({s: tuple(v) for s, v in re_time.items()}),
        Lifetimes({j: (life[1], life[2]) for j, life in enumerate(lives)}, len(lives)),
        array("i", roots.tolist()), np.searchsorted(roots, np.arange(n_blobs + 1)),
        array("i", (life[3] for life in lives)),
        Recompute(recompute.cuts, recompute.steps, recompute.chunks, tuple(order),
                  tuple(runs), recompute.slots))


def _backward_reads(step, layer, data_root, need):
    """The data roots a step's backward reads."""
    if "top" in layer.backward_reads:
        yield from (data_root[b] for b in step.tops)
    for k, b in enumerate(step.bottoms):
        if layer.reads_in_backward(k, need):
            yield data_root[b]


# -- recomputation: segments of the run order, re-run before their backward ----------------
@dataclass(frozen=True)
class Recompute:
    """A recomputation plan: the run order cut into segments at ``cuts`` (the first step of
    every segment but the first), whose ``steps`` (per segment, in run order) may run
    forward again in backward from the values kept then, the checkpoints. A step that
    cannot be recomputed (:attr:`~unroll.engine.layer.Layer.recomputable`, Dropout's mask,
    BatchNorm's statistics), and every step writing memory such a step writes, keeps its
    values.

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


def recompute_plan(steps, layers, data_root, cuts, chunks=(), order=(), slots=None
                   ) -> Recompute:
    """The :class:`Recompute` plan of segments starting at ``cuts``, from the layers'
    declarations (``recomputable``, ``draws_random``); ``chunks`` are the weight-gradient
    chunks (:func:`gradient_chunks`), none of which a cut may split; ``order`` backward's
    actions (empty: one level), BPTT-HSM's in ``slots`` slots."""
    kept = _kept_steps(steps, layers, data_root)
    bounds = [0, *cuts, len(steps)]
    segments = tuple(tuple(s for s in range(a, b) if s not in kept)
                     for a, b in zip(bounds[:-1], bounds[1:]))
    return Recompute(tuple(cuts), segments, tuple(map(tuple, chunks)), tuple(order),
                     slots=slots)


def _kept_steps(steps, layers, data_root) -> set[int]:
    """Steps that never run again: those that cannot be recomputed or draw random numbers,
    and every step writing memory one of them writes."""
    writers: dict[int, list[int]] = {}
    for s, step in enumerate(steps):
        for b in step.tops:
            writers.setdefault(data_root[b], []).append(s)
    kept = {s for s, layer in enumerate(layers) if not layer.recomputable or layer.draws_random}
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
    tops take (``sizes``, per step) add up, and a segment ends at the first allowed cut
    after they pass ``segment_bytes``. With ``crossing`` (per step, :func:`crossing_bytes`),
    the cut is the one the fewest bytes cross of the allowed cuts in a row there (up to
    :data:`CUT_WINDOW` of them), and the next cut comes after them: between the chunks of
    an unrolled chain, one cut, where only the state crosses.

    >>> greedy_cuts([4, 4, 4, 4], [1, 2, 3], 8), greedy_cuts([4, 4, 4, 4], [1, 2, 3], 4,
    ...                                                       [0, 9, 9, 1])
    ([2], [3])
    """
    allowed, cuts, total, s, hold = set(allowed), [], 0, 0, -1
    while s < len(sizes):
        if total >= segment_bytes and s in allowed and s > hold:
            if crossing is not None:
                hold = s
                while hold + 1 in allowed and hold + 1 < s + CUT_WINDOW:
                    hold += 1
                s = min(range(s, hold + 1), key=crossing.__getitem__)
            cuts.append(s)
            total = 0
        total += sizes[s]
        s += 1
    return cuts


def crossing_bytes(steps, data_root, private, sizes_of) -> list[int]:
    """Per step p, the bytes of the values a cut at p leaves to checkpoints: planned data
    written before p and read in forward at p or later (``sizes_of[root]``: its bytes)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for s, step in enumerate(steps):
        for b in step.tops:
            first.setdefault(data_root[b], s)
        for b in step.bottoms:
            last[data_root[b]] = s
    delta = [0] * (len(steps) + 2)
    for r, w in first.items():
        if r not in private and last.get(r, w) > w:
            delta[w + 1] += sizes_of[r]
            delta[last[r] + 1] -= sizes_of[r]
    out, run = [], 0
    for p in range(len(steps)):
        run += delta[p]
        out.append(run)
    return out


def _saves_scratch(layer, runs_backward) -> bool:
    """Whether a layer keeps scratch from its forward to its backward."""
    return runs_backward and any(lives == "both" for _, _, lives in layer.scratch_specs.values())


def _relived_roots(steps, layers, data_root, private, recompute, n_blobs) -> bytearray:
    """Per data root, whether backward's forward runs may write it again (a life per run):
    every writer may run again (is in ``recompute.steps``), and it is not a kept blob, nor
    a part of a kept whole (the Slice parts of an input, which live inside it), nor the x
    rows of a weight-gradient chunk unless all of them are (its one GEMM reads them
    together, from one buffer)."""
    runnable = bytearray(len(steps))
    for seg in recompute.steps:
        for s in seg:
            runnable[s] = 1
    again = bytearray(n_blobs)
    fixed = bytearray(n_blobs)
    for s, (step, layer) in enumerate(zip(steps, layers)):
        if "data" in layer.shares_bottom:
            continue
        whole_kept = (layer.parts_of_whole == "tops"
                      and data_root[step.bottoms[0]] in private)
        for b in step.tops:
            r = data_root[b]
            if not runnable[s] or r in private or whole_kept:
                fixed[r] = 1
            else:
                again[r] = 1
    for r in range(n_blobs):
        if fixed[r]:
            again[r] = 0
    for chunk in recompute.chunks:
        rows = [data_root[steps[s].bottoms[0]] for s in chunk]
        if not all(again[r] for r in rows):
            for r in rows:
                again[r] = 0
    return again


def bptt_hsm(t: int, slots: int) -> int:
    """Gruslys et al.'s BPTT-HSM: the fewest forward steps that backpropagate a chain of
    ``t`` steps keeping at most ``slots`` hidden states (the input's included), by their
    dynamic program ``Q(t, m) = min_y y + Q(t - y, m - 1) + Q(y, m)``, ``Q(t, 1) = t(t+1)/2``,
    ``Q(1, m) = 1``: a step's backward runs its forward again from the state before it.

    >>> bptt_hsm(4, 1), bptt_hsm(4, 2), bptt_hsm(4, 4), bptt_hsm(1000, 10)
    (10, 8, 7, 4636)
    """
    slots = max(1, min(slots, t))
    return int(_hsm_table(t, slots)[0][slots, t])


def _hsm_table(t: int, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """BPTT-HSM's costs ``Q[m, n]`` and first moves ``Y[m, n]`` (the steps run forward
    before the state kept next) for chains up to ``t`` steps and at least ``slots`` slots:
    rows up to a power of two, so that a search over the slots builds few tables."""
    return _hsm_rows(t, min(t, 1 << max(0, slots - 1).bit_length()))


@functools.lru_cache(maxsize=8)
def _hsm_rows(t: int, slots: int) -> tuple[np.ndarray, np.ndarray]:
    ts = np.arange(t + 1, dtype=np.int64)
    q = np.zeros((slots + 1, t + 1), np.int64)
    y = np.zeros((slots + 1, t + 1), np.int64)
    q[1] = ts * (ts + 1) // 2  # one slot: from the input every time (hsm_order's own case)
    for m in range(2, slots + 1):
        row, prev = q[m], q[m - 1]
        row[: m + 1] = np.maximum(2 * ts[: m + 1] - 1, 0)  # a slot for every state
        y[m, : m + 1] = np.minimum(ts[: m + 1], 1)
        for n in range(m + 1, t + 1):  # Q(., m) from Q(., m - 1), one n at a time
            costs = ts[1:n] + prev[n - 1 : 0 : -1] + row[1:n]
            k = int(costs.argmin())
            row[n], y[m, n] = costs[k], k + 1
    for a in (q, y):
        a.flags.writeable = False
    return q, y


def hsm_order(units: int, slots: int) -> tuple:
    """BPTT-HSM's policy for a chain of ``units`` segments in ``slots`` slots, as
    backward's actions (:class:`Recompute`): the forward pass runs every segment once,
    keeping the states the policy keeps; then the actions after it, whose forward runs
    total :func:`bptt_hsm` with the forward pass. A segment runs forward right before its
    own backward, from the state kept before it.

    >>> hsm_order(3, 2)  # segment 0 again, from the input; 1 twice, from the state kept at 1
    (-3, 1, -2, 0, -1)
    """
    slots = max(1, min(slots, units))
    _, first = _hsm_table(units, slots)
    actions: list[int] = []
    todo = [(0, units, slots)]  # ranges still to backpropagate, last first
    while todo:
        a, b, m = todo.pop()
        if b - a == 1:
            actions += [a, ~a]
        elif m == 1:  # from the state at a for every step
            for end in reversed(range(a, b)):
                actions += [*range(a, end + 1), ~end]
        else:
            y = int(first[m, b - a])
            actions += range(a, a + y)
            todo += [(a, a + y, m), (a + y, b, m - 1)]
    # the forward pass is every forward before the first backward
    first_backward = next(i for i, x in enumerate(actions) if x < 0)
    assert actions[:first_backward] == list(range(units))
    return tuple(actions[first_backward:])


def _widened(span, windows) -> tuple[int, int]:
    """``span`` stretched over every window (of a concurrent region) it meets."""
    first, last = span
    for a, b in windows:
        if first <= b and last >= a:
            first, last = min(first, a), max(last, b)
    return first, last


def group_parts(steps: list[Step], layers, plan: Liveness, shapes, rewritten) -> tuple:
    """Concat bottoms and Slice tops placed inside their whole, so they move no memory.

    Along axis 0 (or any axis with only 1s before it) the parts of a Concat
    top or a Slice bottom are consecutive blocks of it: each part's root is
    then hosted at its element offset in the whole's root, data and diff
    alike, and the layer skips its copy. Not for memory written in place
    (``rewritten``: a write through the whole would change a part a backward
    still reads), nor for a part that keeps memory of its own (an input, say,
    which the user may reshape and fill between runs). Where backward runs
    forward again, a part and its whole with a life per run (:class:`Liveness`)
    are hosted life by life, where the same runs write both.

    Returns ``(data_host, diff_host, flags, data_re_host)``: root (life id, in
    ``data_re_host``) -> (host root or life, element offset), and step -> (data
    in whole, diff in whole) per part.
    """
    data_host: dict[int, tuple[int, int]] = {}
    diff_host: dict[int, tuple[int, int]] = {}
    data_re_host: dict[int, tuple[int, int]] = {}
    flags: dict[int, tuple[list[bool], list[bool]]] = {}
    written = {plan.data_root[b] for b in rewritten}
    for s, (step, layer) in enumerate(zip(steps, layers)):
        kind = layer.parts_of_whole
        if kind is None:
            continue
        whole, parts = (step.tops[0], step.bottoms) if kind == "bottoms" else (
            step.bottoms[0], step.tops)
        shape = shapes[whole]
        axis = getattr(layer, "axis", None)  # a parts layer's axis, None until set up
        data_flags, diff_flags = [False] * len(parts), [False] * len(parts)
        flags[s] = (data_flags, diff_flags)
        if axis is None or any(d != 1 for d in shape[:axis]):
            continue
        offset = 0
        for k, part in enumerate(parts):
            for roots, host, fl, lives in ((plan.data_root, data_host, data_flags, True),
                                           (plan.diff_root, diff_host, diff_flags, False)):
                r, w = roots[part], roots[whole]
                if (r == w or r in host or r in written or w in written
                        or r in plan.private):
                    continue
                if lives and (plan.relived(r) or plan.relived(w)):
                    pairs = _same_lives(plan, r, w)
                    if pairs is None or any(j in data_re_host for j, _ in pairs):
                        continue
                    for j, i in pairs:
                        data_re_host[j] = (i, offset)
                else:
                    host[r] = (w, offset)
                fl[k] = True
            offset += _count(shapes[part])
    return data_host, diff_host, flags, data_re_host


def _same_lives(plan, r: int, w: int) -> list[tuple[int, int]] | None:
    """The lives of relived roots ``r`` and ``w`` paired, where the same runs write both
    (None where not)."""
    if not (plan.relived(r) and plan.relived(w)):
        return None
    a, b = range(plan.re_index[r], plan.re_index[r + 1]), range(plan.re_index[w],
                                                                plan.re_index[w + 1])
    if len(a) != len(b) or any(plan.re_born[j] != plan.re_born[i] for j, i in zip(a, b)):
        return None
    return list(zip(a, b))


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# -- gradients without copies: pass-through diffs, one weight-gradient GEMM per param -----
def _resolve(host, r: int) -> tuple[int, int]:
    """The whole that root ``r`` lives in and its element offset there ((r, 0) if none)."""
    offset = 0
    while r in host:
        r, o = host[r]
        offset += o
    return r, offset


def alias_pass_through_diffs(steps: list[Step], layers, plan: Liveness, bottom_need,
                             diff_host: dict, rewritten) -> dict[int, list[bool]]:
    """Bottom diffs equal to their top's diff (Eltwise SUM, coefficient 1) share its memory.

    The top's diff and those bottoms' diffs become one buffer, placed where
    one of them already lives (a Slice part of a time-major whole, say) or
    else at the top's; ``diff_host`` gains the entries. Every value has one
    reader (splits see to that), so nothing else writes that buffer between
    the top's readers' backward and the bottoms' producers'. Not for memory
    written in place or kept, nor for buffers already inside two wholes.
    Returns step -> per-bottom flags: the layer writes no diff for those.
    """
    written = {plan.diff_root[b] for b in rewritten}
    aliased: dict[int, list[bool]] = {}
    for s, (step, layer) in enumerate(zip(steps, layers)):
        passes = layer.passes_diff
        if not layer.passes_diffs or not plan.layer_need[s]:
            continue
        top = plan.diff_root[step.tops[0]]
        if top in plan.private or top in written:
            continue
        members = [(k, plan.diff_root[b]) for k, b in enumerate(step.bottoms)
                   if bottom_need[s][k] and passes(k)]
        members = [(k, r) for k, r in members if r != top and r not in plan.private
                   and r not in written and sum(r == q for _, q in members) == 1]
        if not members:
            continue
        home = top if top in diff_host else next(
            (r for _, r in members if r in diff_host), top)
        if _resolve(diff_host, home)[0] == top and home != top:
            continue  # the top's own buffer holds the bottom: not a pass-through
        flags = [False] * len(step.bottoms)
        for k, r in [(None, top)] + members:
            if r != home:
                if r in diff_host:
                    continue  # inside another whole already
                diff_host[r] = (home, 0)
            if k is not None:
                flags[k] = True
        if any(flags):
            aliased[s] = flags
    return aliased


@dataclass
class WeightGradGroup:
    """Layers sharing one param whose weight gradient is ONE GEMM over all their rows.

    ``steps`` are the members in row order; after the backward of step
    ``after`` (the last member backward reaches) the net runs the GEMM over
    ``x`` (data, of ``x_kind``) and ``gy`` (diff), each ``(root, first element)`` of a
    buffer holding every member's rows back to back, ``rows`` of them.
    """

    steps: list[int]
    after: int
    x: tuple[int, int]
    gy: tuple[int, int]
    rows: int
    x_kind: str = "data"  # "data_re": a relived chunk's x rows, in their lives at the GEMM


def _tiling(roots, host, counts):
    """How ``roots`` sit in other buffers: None if in none, ``(whole, first element,
    order)`` if back to back in one whole (in that order), False otherwise."""
    if all(r not in host for r in roots):
        return None
    placed = [_resolve(host, r) for r in roots]
    if len({whole for whole, _ in placed}) != 1:
        return False
    order = sorted(range(len(roots)), key=lambda i: placed[i][1])
    ends = [placed[i][1] + counts[i] for i in order]
    if [placed[i][1] for i in order[1:]] != ends[:-1]:
        return False
    return placed[0][0], placed[order[0]][1], order


def gradient_chunks(steps: list[Step], layers, layer_need, shapes) -> list[tuple[int, ...]]:
    """The sharers of one param whose weight gradient may be one GEMM, in chunks.

    Layers declaring ``batches_param_diffs`` with one ``param_batch_key()``
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
        if layer_need[s] and layer.batches_param_diffs and layer.blobs:
            by_param.setdefault(layer.param_batch_key(), []).append(s)
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
                          data_host: dict, diff_host: dict, rewritten, skipped,
                          n_roots: int, data_re_host: dict | None = None
                          ) -> tuple[list[WeightGradGroup], dict]:
    """Group the layers that share a param, so that its gradient is one GEMM per chunk.

    A layer declaring ``batches_param_diffs`` computes its param gradient as
    a GEMM over rows of its bottom (x) and of its top's diff (gy), in
    ``param_backward(x, gy)``; the layers of one chunk (:func:`gradient_chunks`)
    form a group. The members' rows go
    back to back, time-major: where they already tile one block of a whole
    (the time-major diff of a shared input projection, reached through
    pass-through diffs; the Slice parts of an input) they stay, otherwise
    they get a new buffer, x and gy in one order. Both stay live until the
    group's GEMM. A group needs every member's x and gy planned (not kept),
    written nowhere in place, and no backward write landing in a member's gy
    rows between its backward and the GEMM. Where a recomputation plan runs
    a chunk's x rows again, their lives at the GEMM (the run's right before
    it) go back to back in a buffer (``data_re_host``) and the GEMM reads
    them there.

    ``n_roots`` numbers the new buffers (roots ``n_roots, n_roots + 1, ...``).
    Returns the groups and ``{(kind, root): elements}`` of the new buffers;
    ``data_host``/``diff_host``/``data_re_host`` gain the placements.
    """
    groups = gradient_chunks(steps, layers, plan.layer_need, shapes)
    if not groups:
        return [], {}
    n_lives = len(plan.re_root)
    data_re_host = {} if data_re_host is None else data_re_host
    written = {plan.data_root[b] for b in rewritten} | {plan.diff_root[b] for b in rewritten}
    at = plan.backward_time
    writes: dict[int, list] = {}

    def write(root, time, count):
        whole, first = _resolve(diff_host, root)
        writes.setdefault(whole, []).append((time, first, first + count))

    for s, (step, layer) in enumerate(zip(steps, layers)):
        if not plan.layer_need[s] or "diff" in layer.shares_bottom:
            continue
        flags = skipped.get(s, ())
        for k, b in enumerate(step.bottoms):
            if bottom_need[s][k] and not (k < len(flags) and flags[k]):
                write(plan.diff_root[b], at(s), _count(shapes[b]))
    for s, roots in plan.zero_before.items():
        for r in roots:
            write(r, at(s) - 0.5, _count(shapes[r]))

    def untouched(members, whole, regions) -> bool:
        """No backward write lands in member i's rows from its backward to the GEMM."""
        gemm = at(members[0])
        spans = sorted((first, end, at(s)) for s, (first, end) in zip(members, regions))
        firsts = [first for first, _, _ in spans]
        for t, a, b in writes.get(whole, ()):
            k = max(bisect_right(firsts, a) - 1, 0)
            while k < len(spans) and spans[k][0] < b:  # every member block the write meets
                first, end, since = spans[k]
                if a < end and since <= t <= gemm:
                    return False
                k += 1
        return True

    out, sizes = [], {}
    for members in groups:
        layer = layers[members[0]]
        x_roots = [plan.data_root[steps[s].bottoms[0]] for s in members]
        gy_roots = [plan.diff_root[steps[s].tops[0]] for s in members]
        x_counts = [_count(shapes[steps[s].bottoms[0]]) for s in members]
        gy_counts = [_count(shapes[steps[s].tops[0]]) for s in members]
        again = [plan.relived(r) for r in x_roots]
        if any(r in plan.private or r in written for r in x_roots + gy_roots) or (
                any(again) and not all(again)):
            continue
        if all(again):  # the GEMM reads each row's life of the run right before it
            x_roots = [plan.life_at(r, at(members[0])) for r in x_roots]
        if len(set(x_roots)) < len(members) or len(set(gy_roots)) < len(members):
            continue
        x_tiles = _tiling(x_roots, data_re_host if all(again) else data_host, x_counts)
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
                 zip((_resolve(diff_host, r) for r in gy_roots), gy_counts)]):
            continue
        blocks = []
        x_kind, x_host = ("data_re", data_re_host) if all(again) else ("data", data_host)
        for kind, tiles, roots, counts, host in ((x_kind, x_tiles, x_roots, x_counts, x_host),
                                                 ("diff", gy_tiles, gy_roots, gy_counts,
                                                  diff_host)):
            if tiles is not None:
                blocks.append(tiles[:2])
                continue
            if kind == "data_re":  # numbered after the lives
                whole, n_lives, offset = n_lives, n_lives + 1, 0
            else:
                whole, n_roots, offset = n_roots, n_roots + 1, 0
            for i in order:
                host[roots[i]] = (whole, offset)
                offset += counts[i]
            sizes[(kind, whole)] = offset
            blocks.append((whole, 0))
        out.append(WeightGradGroup([members[i] for i in order], members[0], blocks[0],
                                   blocks[1], sum(gy_counts) // layer.param_row_widths()[1],
                                   x_kind))
    return out, sizes


# -- independent branches -------------------------------------------------------------------
@dataclass
class Region:
    """Steps ``start..stop-1`` of the run order, split into independent branches.

    ``first`` lists the region's steps that depend on no branch (run before
    them, in run order); ``branches`` the others, one list per branch in run
    order. No branch reads what another writes, and none shares a param or
    draws random numbers, so they may run at once.
    """

    start: int
    stop: int
    first: list[int]
    branches: list[list[int]]


def concurrent_regions(steps: list[Step], layers, min_steps: int = 8) -> list[Region]:
    """Where a Split fans a value out to chains that meet again only later (the two
    directions of a bidirectional layer), the steps between the Split and their meeting.

    A Split is a candidate when each of its readers reads nothing else made
    after it (a reader that also reads later values is where branches meet,
    not a branch). Labels then flow from its tops through the steps after it;
    the first step reached by two labels ends the region. A region is kept if
    it has two or more branches of ``min_steps`` steps or more, their layers
    share no param, and none draws random numbers.
    """
    producer: dict[int, int] = {}  # blob -> its latest writer so far
    readers: dict[int, list[int]] = {}
    made_by: list[list[int]] = []  # step -> the steps that wrote its bottoms
    for s, step in enumerate(steps):
        made_by.append([producer[b] for b in step.bottoms if b in producer])
        for b in step.bottoms:
            readers.setdefault(b, []).append(s)
        for t in step.tops:
            producer[t] = s
    regions: list[Region] = []
    s = 0
    while s < len(steps):
        region = _region_from(s, steps, layers, made_by, readers, min_steps)
        if region is None:
            s += 1
        else:
            regions.append(region)
            s = region.stop
    return regions


def _region_from(p: int, steps, layers, made_by, readers, min_steps) -> Region | None:
    if layers[p].type != "Split" or len(steps[p].tops) < 2:
        return None
    heads = [readers.get(t, [None])[0] for t in steps[p].tops]
    if any(h is None or any(w > p for w in made_by[h] if w != p) for h in heads):
        return None
    label: dict[int, int] = {}  # step -> its branch
    for k, h in enumerate(heads):
        if h in label:
            return None  # one reader takes two tops: no branches here
        label[h] = k
    first, stop = [], len(steps)
    for s in range(p + 1, len(steps)):
        found = {label[w] for w in made_by[s] if w in label}
        if s in label:
            found.add(label[s])
        if len(found) > 1:
            stop = s
            break
        if found:
            label[s] = found.pop()
        else:
            first.append(s)
    branches: list[list[int]] = [[] for _ in heads]
    for s in range(p + 1, stop):
        if s in label:
            branches[label[s]].append(s)
    branches = [b for b in branches if b]
    if len(branches) < 2 or min(len(b) for b in branches) < min_steps:
        return None
    params = [{id(blob) for s in b for blob in layers[s].blobs} for b in branches]
    if sum(len(p) for p in params) != len(set().union(*params)):
        return None
    if any(layers[s].draws_random for b in branches for s in b):
        return None
    return Region(p + 1, stop, first, branches)
