"""Caffe's rules for a net: pure functions from layers to a run order and its gradients.

Caffe's semantics, deliberately: a bottom names the most recent top of that
name above it; a blob read by several layers gets a split so that each reader
has its own diff; a top named like its bottom runs in place when that is safe;
a layer runs backward when its tops reach a loss. Nothing here allocates or
runs anything: :mod:`unroll.engine.memory` plans the memory of the run order,
and :class:`unroll.engine.net.Net` builds the blobs and layers and runs them.

Blobs are numbered: a blob is the memory of one or more values (an in-place
layer's top is its bottom's blob, a new version of it). A step is one layer
of the run order, an inserted Split included.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from unroll.core.errors import NetError
from unroll.core.proto import LayerParameter, NetParameter

__all__ = ["Graph", "SplitSpec", "Step", "backward_needs", "build_graph", "filter_layers",
           "learns", "legacy_inputs"]


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


def _resolve_names(layer_params) -> tuple[list[_Value], list[list[_Value]]]:
    """Bottoms to the latest version of their name; tops to new versions (linear). Returns
    the values, and per layer the values its bottoms read."""
    names = [lp.name for lp in layer_params]
    if len(set(names)) < len(names):
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise NetError(f"two layers are named '{name}'; layer names must be unique")
            seen.add(name)
    current: dict[str, _Value] = {}
    values: list[_Value] = []
    bottoms_of: list[list[_Value]] = []
    intern, add, Value = sys.intern, values.append, _Value
    for li, lp in enumerate(layer_params):
        # each read of a message's repeated field makes a container: read them once
        bottom, top = list(lp.bottom), lp.top
        read = []
        for bi, b in enumerate(bottom):
            value = current.get(b)
            if value is None:
                raise NetError(
                    f"layer '{lp.name}' ({lp.type}): bottom '{b}' is not produced by any "
                    f"layer above it"
                )
            value.consumers.append((li, bi))
            read.append(value)
        bottoms_of.append(read)
        if len(top) == 1:  # most layers: nothing to compare within the layer
            t = intern(top[0])  # the nets of every T share one string per blob name
            before = current.get(t)
            if before is None:
                v = Value(t, 0, li, 0)
            elif bottom and bottom[0] == t:  # in place
                v = Value(t, before.version + 1, li, 0)
            else:
                _taken(layer_params, lp, t, current)
            add(v)
            current[t] = v
            continue
        tvals, names = [], set()
        for ti, t in enumerate(top):
            t = intern(t)
            in_place = ti < len(bottom) and bottom[ti] == t
            if t in current and not in_place:
                _taken(layer_params, lp, t, current)
            if t in names:
                raise NetError(f"layer '{lp.name}' ({lp.type}): top '{t}' is listed twice")
            names.add(t)
            version = current[t].version + 1 if in_place else 0
            tvals.append(_Value(t, version, li, ti))
        values.extend(tvals)
        for v in tvals:
            current[v.name] = v
    return values, bottoms_of


def _taken(layer_params, lp, t: str, current: dict) -> None:
    raise NetError(
        f"layer '{lp.name}' ({lp.type}): top '{t}' is already produced by layer "
        f"'{layer_params[current[t].producer].name}'; a top may reuse a name "
        f"only in place (as the same layer's bottom at the same position)"
    )


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
        if "data" not in producer.memory.shares_bottom:
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
    values, bottoms_of = _resolve_names(layer_params)
    names: list[str] = []
    fallbacks: list[str] = []
    rewritten: set[int] = set()
    order = []
    tops: list[list[int]] = [[] for _ in layer_params]
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
        tops[v.producer].append(v.blob)
    produced = {v.name for v in values} if keep else ()
    for name in keep:
        if name not in produced:
            raise NetError(f"keep names blob '{name}', which no layer produces")
    bottoms = [[v.blob for v in bvals] for bvals in bottoms_of]
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


def learns(layer) -> bool:
    """Whether ``layer`` has a param it learns: a learnable layer with a param whose lr_mult
    is not 0 (unset: 1), which makes it run backward (Caffe's ``layer_need_backward``)."""
    if not (layer.learnable and layer.blobs):
        return False  # without reading the LayerParameter: a Split makes one when asked
    specs = layer.param.param
    return any((specs[k].lr_mult if k < len(specs) else 1.0) != 0
               for k in range(len(layer.blobs)))


def backward_needs(steps: list[Step], layers, force: bool):
    """Which steps run backward, which bottoms get a gradient, and the loss tops.

    ``layers[i]`` is step i's layer (see :func:`learns`). Returns ``(layer_need, bottom_need,
    [(blob, loss weight)])``, Caffe's rules: a layer whose tops reach no loss,
    or whose every top is refused by its readers (propagate_down: false), runs
    no backward unless ``force_backward``.
    """
    need: dict[int, bool] = {}
    layer_need, bottom_need, loss_tops = [], [], []
    consumed = {b for step in steps for b in step.bottoms}
    get = need.get
    for step, layer in zip(steps, layers):
        bottoms = step.bottoms
        split = layer.type == "Split"  # inserted: no prototxt settings of its own
        param = None if split else layer.param
        pd = param.propagate_down if param is not None else ()
        if pd and len(pd) != len(bottoms):
            raise NetError(
                f"layer '{layer.name}' ({layer.type}): propagate_down gives {len(pd)} values "
                f"for {len(bottoms)} bottoms"
            )
        if pd:
            bneed = [bool(pd[k] and (get(b, False) or force)) and layer.allow_force_backward(k)
                     for k, b in enumerate(bottoms)]
        else:
            bneed = [bool(get(b, False) or force) and layer.allow_force_backward(k)
                     for k, b in enumerate(bottoms)]
        lneed = any(bneed) or learns(layer) or (force and bool(bottoms))
        for t in step.tops:
            need[t] = lneed
        layer_need.append(lneed)
        bottom_need.append(bneed)
        if not split and (layer.is_loss or param.loss_weight):  # else every weight is 0
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
        skip = bool(tops) and refused.issuperset(tops)
        if not under_loss.isdisjoint(tops) and not skip:
            under_loss.update(bottoms)
        elif not force:
            layer_need[i] = False
            bottom_need[i] = [False] * len(bottoms)
        if not all(bottom_need[i]):
            refused.update(b for b, n in zip(bottoms, bottom_need[i]) if not n)
    # one tuple per pattern ((True,), (True, False), ...), shared by every step that has it
    patterns: dict[tuple, tuple] = {}
    bottom_need = [patterns.setdefault(t, t) for t in map(tuple, bottom_need)]
    return layer_need, bottom_need, loss_tops
