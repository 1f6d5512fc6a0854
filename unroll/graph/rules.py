"""Planning a net: pure functions from layers to a run order, gradients and a memory plan.

Caffe's semantics, deliberately: a bottom names the most recent top of that
name above it; a blob read by several layers gets a split so that each reader
has its own diff; a top named like its bottom runs in place when that is safe.
Nothing here allocates or runs anything: :class:`unroll.engine.net.Net` builds the
blobs and layers these functions describe, and runs them.

Blobs are numbered: a blob is the memory of one or more values (an in-place
layer's top is its bottom's blob, a new version of it). A step is one layer
of the run order, an inserted Split included.

Time, for lifetimes, counts forward steps ``0..S-1``, then ``S`` when loss
diffs are filled, then backward steps, step ``s`` at ``2S - s``.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from unroll.core.errors import NetError
from unroll.core.proto import LayerParameter, NetParameter

__all__ = [
    "Graph", "MemoryPlan", "Region", "SplitSpec", "Step", "WeightGradGroup",
    "alias_pass_through_diffs", "backward_needs", "build_graph", "concurrent_regions",
    "filter_layers", "group_parts", "legacy_inputs", "plan_memory", "plan_weight_gradients",
]


# -- which layers: phases, stages, levels ------------------------------------------------
def _state_meets_rule(phase: int, level: int, stages: set, rule) -> bool:
    if rule.HasField("phase") and rule.phase != phase:
        return False
    if rule.HasField("min_level") and level < rule.min_level:
        return False
    if rule.HasField("max_level") and level > rule.max_level:
        return False
    if any(s not in stages for s in rule.stage):
        return False
    return not any(s in stages for s in rule.not_stage)


def filter_layers(net_param: NetParameter, phase: int) -> list[LayerParameter]:
    """The layers of ``net_param`` included in ``phase`` (Caffe's FilterNet)."""
    level = net_param.state.level
    stages = set(net_param.state.stage)
    kept = []
    for lp in net_param.layer:
        if lp.include and lp.exclude:
            raise NetError(f"layer '{lp.name}': specify include or exclude rules, not both")
        if lp.include:
            ok = any(_state_meets_rule(phase, level, stages, r) for r in lp.include)
        else:
            ok = not any(_state_meets_rule(phase, level, stages, r) for r in lp.exclude)
        if ok:
            kept.append(lp)
    return kept


def legacy_inputs(net_param: NetParameter) -> list[LayerParameter]:
    """NetParameter.input / input_shape / input_dim as one Input layer (as Caffe upgrades)."""
    if not net_param.input:
        return []
    lp = LayerParameter(name="input", type="Input", top=list(net_param.input))
    if net_param.input_shape:
        for s in net_param.input_shape:
            lp.input_param.shape.add().CopyFrom(s)
    elif net_param.input_dim:
        dims = list(net_param.input_dim)
        if len(dims) != 4 * len(net_param.input):
            raise NetError(f"input_dim must give 4 dims per input, found {len(dims)}")
        for i in range(len(net_param.input)):
            lp.input_param.shape.add().dim.extend(dims[4 * i : 4 * i + 4])
    else:
        raise NetError("net inputs given without input_shape or input_dim")
    return [lp]


# -- the graph: names, in place, splits ---------------------------------------------------
class _Value:
    """One version of a named blob: what produced it and who reads it."""

    __slots__ = ("name", "version", "producer", "top_index", "consumers", "blob")

    def __init__(self, name: str, version: int, producer: int, top_index: int):
        self.name, self.version = name, version
        self.producer, self.top_index = producer, top_index  # layer index, top index
        self.consumers: list = []  # (layer index, bottom index)
        self.blob = -1


@dataclass(slots=True)
class Step:
    """One layer of the run order: ``layer`` indexes ``Graph.layer_params``; ``bottoms`` and
    ``tops`` are tuples of blob numbers."""

    layer: int
    bottoms: tuple
    tops: tuple


class SplitSpec:
    """A Split the graph inserted: its name, bottom and tops. Its LayerParameter is made
    only when asked for (:meth:`layer_parameter`): an unrolled net inserts thousands of
    splits, and a protobuf message costs about 2 KB, more than the rest of the split."""

    __slots__ = ("name", "bottom", "top")
    type = "Split"

    def __init__(self, name: str, bottom: str, top: tuple):
        self.name, self.bottom, self.top = name, bottom, top

    def layer_parameter(self) -> LayerParameter:
        return LayerParameter(name=self.name, type="Split", bottom=[self.bottom],
                              top=list(self.top))


@dataclass
class Graph:
    """A net's run order over numbered blobs.

    ``layer_params`` holds the net's layers, then the inserted Splits (as
    :class:`SplitSpec`), until the net has built its layers (then None: each
    layer keeps its own); ``names[b]`` is blob b's name; ``order`` lists the blob
    of every value and split top, in the order ``net.blobs`` adds them (a value
    written in place has its bottom's blob, and name); ``table`` pairs them with
    their names;
    ``outputs`` names the values nobody reads; ``in_place_fallbacks`` says
    why some in-place tops were written out of place.
    """

    layer_params: list | None
    steps: list[Step]
    names: list[str]
    order: list[int]
    outputs: list[str]
    rewritten: set[int]
    in_place_fallbacks: list[str]

    @property
    def table(self) -> list[tuple[str, int]]:
        """``(name, blob)`` for every value and split top, in the order of ``order``."""
        names = self.names
        return [(names[b], b) for b in self.order]


def _resolve_names(layer_params) -> list[_Value]:
    """Bottoms to the latest version of their name; tops to new versions (linear)."""
    seen: set[str] = set()
    for lp in layer_params:
        if lp.name in seen:
            raise NetError(f"two layers are named '{lp.name}'; layer names must be unique")
        seen.add(lp.name)
    current: dict[str, _Value] = {}
    values: list[_Value] = []
    for li, lp in enumerate(layer_params):
        for bi, b in enumerate(lp.bottom):
            if b not in current:
                raise NetError(
                    f"layer '{lp.name}' ({lp.type}): bottom '{b}' is not produced by any "
                    f"layer above it"
                )
            current[b].consumers.append((li, bi))
        tvals, names = [], set()
        for ti, t in enumerate(lp.top):
            t = sys.intern(t)  # the nets of every T share one string per blob name
            in_place = ti < len(lp.bottom) and lp.bottom[ti] == t
            if t in current and not in_place:
                raise NetError(
                    f"layer '{lp.name}' ({lp.type}): top '{t}' is already produced by layer "
                    f"'{layer_params[current[t].producer].name}'; a top may reuse a name "
                    f"only in place (as the same layer's bottom at the same position)"
                )
            if t in names:
                raise NetError(f"layer '{lp.name}' ({lp.type}): top '{t}' is listed twice")
            names.add(t)
            version = current[t].version + 1 if in_place else 0
            tvals.append(_Value(t, version, li, ti))
        values.extend(tvals)
        for v in tvals:
            current[v.name] = v
    return values


def _bottom_values(values, layer_params) -> list[list[_Value]]:
    bottoms_of = [[None] * len(lp.bottom) for lp in layer_params]
    for v in values:
        for li, bi in v.consumers:
            bottoms_of[li][bi] = v
    return bottoms_of


def _in_place_hazard(layers, li: int, prev: _Value, bottoms_of, keep) -> str | None:
    """Why layer ``li`` may not overwrite ``prev`` in place (None if it may).

    The write also lands in every value ``prev`` is a view of (a Reshape,
    Flatten or Split top shares its bottom's data), so those are checked too.
    """
    layer = layers[li]
    if not layer.in_place:
        raise NetError(
            f"layer '{layer.name}' ({layer.type}): cannot run in place (top '{prev.name}' "
            f"== bottom '{prev.name}'); {layer.type} needs a top of its own"
        )
    if "bottom" in layer.backward_reads:
        raise NetError(
            f"layer '{layer.name}' ({layer.type}): cannot run in place on '{prev.name}': "
            f"its backward reads its bottom, which the in-place write destroys"
        )
    value, reader, via = prev, li, ""
    while True:
        if value.name in keep:
            return f"keep=[{value.name!r}] asks to preserve it{via}"
        readers = [c for c, _ in value.consumers]
        readers.remove(reader)
        if readers:
            others = [layers[c].name for c in readers]
            return f"layer(s) {others} also read the value it would overwrite{via}"
        producer = layers[value.producer]
        if "top" in producer.backward_reads:
            return (
                f"the backward of its producer '{producer.name}' ({producer.type}) reads "
                f"that top{via}"
            )
        if "data" not in producer.shares_bottom:
            return None
        # the value is a view of the producer's bottom: the write lands there as well
        reader, value = value.producer, bottoms_of[value.producer][0]
        via = f" (through '{producer.name}', a view of '{value.name}')"


def build_graph(layer_params: list[LayerParameter], layers, keep=()) -> Graph:
    """The run order of ``layer_params`` (``layers``: their Layer objects, for the contract).

    Names are resolved as Caffe does; an in-place top shares its bottom's blob
    when that is provably safe (else it gets its own, and the reason is kept);
    every value read by several layers gets a Split right after its producer,
    one top per reader, so that each reader has its own diff (Caffe's
    InsertSplits). Linear in the number of layers and blobs.
    """
    keep = set(keep)
    values = _resolve_names(layer_params)
    bottoms_of = _bottom_values(values, layer_params)
    names: list[str] = []
    fallbacks: list[str] = []
    rewritten: set[int] = set()
    order = []
    for v in values:
        if v.version > 0:
            prev = bottoms_of[v.producer][v.top_index]
            reason = _in_place_hazard(layers, v.producer, prev, bottoms_of, keep)
            if reason is None:
                v.blob = prev.blob
                rewritten.add(v.blob)
            else:
                fallbacks.append(f"layer '{layer_params[v.producer].name}' writes '{v.name}' "
                                 f"out of place: {reason}")
        if v.blob < 0:
            v.blob = len(names)
            names.append(v.name)
        order.append(v.blob)
    for name in keep:
        if not any(v.name == name for v in values):
            raise NetError(f"keep names blob '{name}', which no layer produces")
    bottoms = [[v.blob for v in bvals] for bvals in bottoms_of]
    tops = [[] for _ in layer_params]
    for v in values:
        tops[v.producer].append(v.blob)
    all_params = list(layer_params)
    splits_after: dict[int, list[Step]] = {}
    for v in values:
        if len(v.consumers) < 2:
            continue
        base = sys.intern(f"{v.name}_{layer_params[v.producer].name}_{v.top_index}_split")
        split_tops = []
        for k, (li, bi) in enumerate(v.consumers):
            blob = len(names)
            names.append(sys.intern(f"{base}_{k}"))
            order.append(blob)
            bottoms[li][bi] = blob
            split_tops.append(blob)
        all_params.append(SplitSpec(base, v.name, tuple(names[b] for b in split_tops)))
        splits_after.setdefault(v.producer, []).append(
            Step(len(all_params) - 1, (v.blob,), tuple(split_tops)))
    steps = []
    for li in range(len(layer_params)):
        steps.append(Step(li, tuple(bottoms[li]), tuple(tops[li])))
        steps.extend(splits_after.get(li, ()))
    outputs = [v.name for v in values if not v.consumers]
    return Graph(all_params, steps, names, order, outputs, rewritten, fallbacks)


# -- which layers run backward ------------------------------------------------------------
def _loss_weights(layer) -> list[float]:
    n = len(layer.param.top)
    weights = list(layer.param.loss_weight)
    if weights and len(weights) != n:
        raise NetError(
            f"layer '{layer.name}' ({layer.type}): loss_weight gives {len(weights)} values "
            f"for {n} tops"
        )
    if not weights:
        weights = [1.0 if (layer.is_loss and i == 0) else 0.0 for i in range(n)]
    return weights


def backward_needs(steps: list[Step], layers, force: bool, learns):
    """Which steps run backward, which bottoms get a gradient, and the loss tops.

    ``layers[i]`` is step i's layer; ``learns(i)`` says whether it has a
    param with a non-zero lr_mult. Returns ``(layer_need, bottom_need,
    [(blob, loss weight)])``, Caffe's rules: a layer whose tops reach no loss,
    or whose every top is refused by its readers (propagate_down: false), runs
    no backward unless ``force_backward``.
    """
    need: dict[int, bool] = {}
    layer_need, bottom_need, loss_tops = [], [], []
    consumed = {b for step in steps for b in step.bottoms}
    for i, (step, layer) in enumerate(zip(steps, layers)):
        bottoms = step.bottoms
        split = layer.type == "Split"  # inserted: no prototxt settings of its own
        pd = [] if split else list(layer.param.propagate_down)
        if pd and len(pd) != len(bottoms):
            raise NetError(
                f"layer '{layer.name}' ({layer.type}): propagate_down gives {len(pd)} values "
                f"for {len(bottoms)} bottoms"
            )
        bneed = []
        for k, b in enumerate(bottoms):
            wanted = need.get(b, False) or (force and not pd)
            if pd:
                wanted = pd[k] and (need.get(b, False) or force)
            bneed.append(bool(wanted) and layer.allow_force_backward(k))
        lneed = any(bneed) or learns(i) or (force and bool(bottoms))
        for t in step.tops:
            need[t] = lneed
        layer_need.append(lneed)
        bottom_need.append(bneed)
        if not split and (layer.is_loss or layer.param.loss_weight):  # else every weight is 0
            for t, w in zip(step.tops, _loss_weights(layer)):
                if w == 0:
                    continue
                if t in consumed and t not in bottoms:
                    raise NetError(
                        f"layer '{layer.name}' ({layer.type}): top has loss_weight {w} and is "
                        f"also read by another layer; give the reader its own copy"
                    )
                loss_tops.append((t, float(w)))
    under_loss = {t for t, _ in loss_tops}
    refused: set[int] = set()
    for i in reversed(range(len(steps))):
        tops, bottoms = steps[i].tops, steps[i].bottoms
        skip = bool(tops) and all(t in refused for t in tops)
        if any(t in under_loss for t in tops) and not skip:
            under_loss.update(bottoms)
        elif not force:
            layer_need[i] = False
            bottom_need[i] = [False] * len(bottoms)
        refused.update(b for b, n in zip(bottoms, bottom_need[i]) if not n)
    # one tuple per pattern ((True,), (True, False), ...), shared by every step that has it
    patterns: dict[tuple, tuple] = {}
    bottom_need = [patterns.setdefault(t, t) for t in map(tuple, bottom_need)]
    return layer_need, bottom_need, loss_tops


# -- the memory plan ----------------------------------------------------------------------
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


@dataclass
class MemoryPlan:
    """Lifetimes of a net's memory, from its graph alone (no shapes).

    ``data_root[b]`` / ``diff_root[b]``: the blob whose memory blob b's data /
    diff is (a view or Split top shares its bottom's). ``data_life`` and
    ``diff_life`` map each root placed in the workspace to its (first, last)
    time; roots in ``private`` keep memory of their own (inputs, outputs,
    losses, ``keep=``). ``zero_before[s]`` lists diff roots that backward
    reads before anything writes them: zeroed right before step s's backward.
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

    def backward_time(self, step: int) -> int:
        return 2 * self.steps - step

    def scratch_life(self, step: int, lives: str) -> tuple[int, int] | None:
        """When scratch of step ``step`` is live: ``lives`` is "forward", "backward" or "both"."""
        f, b = step, self.backward_time(step)
        runs_backward = self.layer_need[step]
        if lives == "forward":
            span = (f, f)
        elif lives == "backward":
            if not runs_backward:
                return None
            span = (b, b)
        else:
            span = (f, b) if runs_backward else (f, f)
        return _widened(span, self.windows)


def _roots(steps, layers, n_blobs: int, what: str) -> list[int]:
    root = list(range(n_blobs))
    for step, layer in zip(steps, layers):
        if what in layer.shares_bottom:
            for t in step.tops:
                root[t] = root[step.bottoms[0]]
    return root


def plan_memory(steps: list[Step], layers, n_blobs: int, private_blobs, layer_need,
                bottom_need, loss_blobs, regions=()) -> MemoryPlan:
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
    """
    S = len(steps)
    data_root = _roots(steps, layers, n_blobs, "data")
    diff_root = _roots(steps, layers, n_blobs, "diff")
    private = {data_root[b] for b in private_blobs} | {diff_root[b] for b in private_blobs}
    data_life: dict[int, list[int]] = {}
    reads: dict[int, int] = {}
    writes: dict[int, int] = {}
    diff_life: dict[int, list[int]] = {}

    def touch(life, root, t):
        span = life.get(root)
        if span is None:
            life[root] = [t, t]
        elif t < span[0]:
            span[0] = t
        elif t > span[1]:
            span[1] = t

    for s, (step, layer) in enumerate(zip(steps, layers)):
        back = 2 * S - s
        runs_backward = layer_need[s]
        for b in step.tops:
            touch(data_life, data_root[b], s)
            if runs_backward and "top" in layer.backward_reads:
                touch(data_life, data_root[b], back)
        for k, b in enumerate(step.bottoms):
            touch(data_life, data_root[b], s)
            if runs_backward and layer.reads_in_backward(k, bottom_need[s]):
                touch(data_life, data_root[b], back)
        if not runs_backward or "diff" in layer.shares_bottom:
            continue  # a view's diff is its bottom's: its backward moves nothing
        for b in step.tops:
            r = diff_root[b]
            touch(diff_life, r, back)
            reads[r] = min(reads.get(r, back), back)
        for b, down in zip(step.bottoms, bottom_need[s]):
            if down:
                r = diff_root[b]
                touch(diff_life, r, back)
                writes[r] = min(writes.get(r, back), back)
    for b in loss_blobs:
        writes[diff_root[b]] = S
    zero_before: dict[int, list[int]] = {}
    for r, first_read in reads.items():
        if r not in private and writes.get(r, first_read) >= first_read:
            zero_before.setdefault(2 * S - first_read, []).append(r)
    windows = [w for r in regions
               for w in ((r.start, r.stop - 1), (2 * S - r.stop + 1, 2 * S - r.start))]
    return MemoryPlan(
        S, array("i", data_root), array("i", diff_root), private,
        Lifetimes({r: _widened(v, windows) for r, v in data_life.items() if r not in private},
                  n_blobs),
        Lifetimes({r: _widened(v, windows) for r, v in diff_life.items() if r not in private},
                  n_blobs),
        zero_before, list(layer_need), windows,
    )


def _widened(span, windows) -> tuple[int, int]:
    """``span`` stretched over every window (of a concurrent region) it meets."""
    first, last = span
    for a, b in windows:
        if first <= b and last >= a:
            first, last = min(first, a), max(last, b)
    return first, last


def group_parts(steps: list[Step], layers, plan: MemoryPlan, shapes, rewritten) -> tuple:
    """Concat bottoms and Slice tops placed inside their whole, so they move no memory.

    Along axis 0 (or any axis with only 1s before it) the parts of a Concat
    top or a Slice bottom are consecutive blocks of it: each part's root is
    then hosted at its element offset in the whole's root, data and diff
    alike, and the layer skips its copy. Not for memory written in place
    (``rewritten``: a write through the whole would change a part a backward
    still reads), nor for a part that keeps memory of its own (an input, say,
    which the user may reshape and fill between runs).

    Returns ``(data_host, diff_host, flags)``: root -> (host root, element
    offset), and step -> (data in whole, diff in whole) per part.
    """
    data_host: dict[int, tuple[int, int]] = {}
    diff_host: dict[int, tuple[int, int]] = {}
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
            for roots, host, fl in ((plan.data_root, data_host, data_flags),
                                    (plan.diff_root, diff_host, diff_flags)):
                r, w = roots[part], roots[whole]
                if r == w or r in host or r in written or w in written or r in plan.private:
                    continue
                host[r] = (w, offset)
                fl[k] = True
            offset += _count(shapes[part])
    return data_host, diff_host, flags


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


def alias_pass_through_diffs(steps: list[Step], layers, plan: MemoryPlan, bottom_need,
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
    ``x`` (data) and ``gy`` (diff), each ``(root, first element)`` of a
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
    placed = [_resolve(host, r) for r in roots]
    if len({whole for whole, _ in placed}) != 1:
        return False
    order = sorted(range(len(roots)), key=lambda i: placed[i][1])
    ends = [placed[i][1] + counts[i] for i in order]
    if [placed[i][1] for i in order[1:]] != ends[:-1]:
        return False
    return placed[0][0], placed[order[0]][1], order


def plan_weight_gradients(steps: list[Step], layers, plan: MemoryPlan, bottom_need, shapes,
                          data_host: dict, diff_host: dict, rewritten, skipped,
                          n_roots: int) -> tuple[list[WeightGradGroup], dict]:
    """Group the layers that share a param, so that its gradient is one GEMM.

    A layer declaring ``batches_param_diffs`` computes its param gradient as
    a GEMM over rows of its bottom (x) and of its top's diff (gy), in
    ``param_backward(x, gy)``; layers with one ``param_batch_key()`` (the
    same param blobs, used the same way) form a group. The members' rows go
    back to back, time-major: where they already tile one block of a whole
    (the time-major diff of a shared input projection, reached through
    pass-through diffs; the Slice parts of an input) they stay, otherwise
    they get a new buffer, x and gy in one order. Both stay live until the
    group's GEMM. A group needs every member's x and gy planned (not kept),
    written nowhere in place, and no backward write landing in a member's gy
    rows between its backward and the GEMM.

    ``n_roots`` numbers the new buffers (roots ``n_roots, n_roots + 1, ...``).
    Returns the groups and ``{(kind, root): elements}`` of the new buffers;
    ``data_host``/``diff_host`` gain the placements.
    """
    by_param: dict[tuple, list[int]] = {}
    for s, layer in enumerate(layers):
        if plan.layer_need[s] and layer.batches_param_diffs and layer.blobs:
            by_param.setdefault(layer.param_batch_key(), []).append(s)
    groups = [members for members in by_param.values() if len(members) > 1]
    if not groups:
        return [], {}
    written = {plan.data_root[b] for b in rewritten} | {plan.diff_root[b] for b in rewritten}
    T = 2 * plan.steps
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
                write(plan.diff_root[b], T - s, _count(shapes[b]))
    for s, roots in plan.zero_before.items():
        for r in roots:
            write(r, T - s - 0.5, _count(shapes[r]))

    def untouched(members, whole, regions) -> bool:
        """No backward write lands in member i's rows from its backward to the GEMM."""
        gemm = T - members[0]
        spans = sorted((first, end, T - s) for s, (first, end) in zip(members, regions))
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
        if any(r in plan.private or r in written for r in x_roots + gy_roots):
            continue
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
                 zip((_resolve(diff_host, r) for r in gy_roots), gy_counts)]):
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
        out.append(WeightGradGroup([members[i] for i in order], members[0], blocks[0],
                                   blocks[1], sum(gy_counts) // layer.param_row_widths()[1]))
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
