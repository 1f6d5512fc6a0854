"""Export a net to BVLC Caffe: only layer types Caffe has, the others lowered or refused.

An unrolled net may hold layer types of unroll's own (``unroll layers`` lists
which): ``GRUUnit`` (the ``gru`` template), ``LeadingSequenceEnd`` and
``TrailingSequenceEnd`` (``sequence_output=False``) and ``Scatter`` (the
tagger's character model). Real Caffe aborts on them with ``Unknown layer
type``. :func:`export_for_caffe` rewrites each one that Caffe's own layers
can express into those layers, computing the same function (forward and
backward):

- ``GRUUnit``: the primitive GRU step of ``gru_primitive.prototxt.j2`` (Scale,
  Slice, Eltwise, Sigmoid, TanH). GRUUnit has no params, so the params of the
  net and their sharing are unchanged.
- ``TrailingSequenceEnd``: a Reshape that keeps the shape (its top is the last
  run step's state); ``LeadingSequenceEnd``: the sum of each step's state
  masked by ``cont[k] * (1 - cont[k + 1])``, the indicator of a column's last
  step. The unroll layers also refuse a column whose cont does not hold one
  sequence padded as ``align`` says; Caffe's layers cannot check that, so the
  exported net trusts its batches (the header comment says so).
- ``Scatter``: a gather. Its positions are data, and Caffe has no scatter, but
  it has a gather whose backward scatters (BatchReindex): each cell's source
  row is computed from the positions by Caffe's layers (a one-hot comparison
  of the positions with the cells, then a weighted sum), and BatchReindex
  picks it from the rows with a zero row appended. Frozen params given in
  the prototxt hold the cell and row numbers, so the exported net is fixed
  to the positions and cells it was exported with (the tagger's character
  columns then no longer vary per batch), it trusts the positions to be
  distinct, which the unroll layer checks, and its comparison blobs hold
  cells x positions values each (the unroll layer: positions + cells).
- ``BatchMatMul``: a Scale of the memory by the other bottom (the query
  along axes 1.., the weights along axes 0..1), then the sum over the
  contracted axis: a Reduction over the last axis for scores; for contexts,
  the memory's S steps cut apart (Slice), summed (Eltwise) and the leading 1
  dropped (Reshape), since Caffe's Reduction sums only trailing axes. The
  exported net is fixed to the S it was exported with.

Anything else of unroll's own (a layer type registered by a user) is refused,
one line per layer, saying why. A ``type: "Python"`` layer is kept as it is:
Caffe has the type, but runs the module's class as a ``caffe.Layer``, so
that module must serve Caffe too.

The layer types Caffe has are read off real BVLC Caffe (``caffe_layer_types.txt``
beside this module, a copy of the list made with ``caffe.layer_type_list()`` at
Caffe 9b89154). Fields need no lowering: ``proto/unroll.proto`` holds only
fields of Caffe's caffe.proto, with Caffe's numbers (``tests/core/test_proto.py``
holds it to Caffe's field list), so any field a lowered net sets is Caffe's.

>>> from unroll.frontend.unroller import expand
>>> net_param = expand("gru", steps=2, batch=1, input_dim=2, hidden=3)
>>> unroll_only_types(net_param)
['GRUUnit']
>>> lowered, notes = export_for_caffe(net_param)
>>> unroll_only_types(lowered), len(notes)
([], 1)
"""

from __future__ import annotations

import textwrap
from collections import Counter
from functools import cache
from importlib import resources

import numpy as np

from unroll.core.errors import NetError
from unroll.core.proto import LayerParameter, NetParameter, blob_proto_from_array
from unroll.engine.layer import LAYERS

#: the file (package data) that lists BVLC Caffe's layer types, one a line
LAYER_TYPES_FILE = "caffe_layer_types.txt"
#: registered in Caffe but absent from the list, which a build without OpenCV printed
#: (the list's own header names them)
NEEDS_OPENCV = ("ImageData", "WindowData")


@cache
def caffe_layer_types() -> frozenset:
    """The layer types BVLC Caffe registers (``caffe.layer_type_list()``, plus the OpenCV ones).

    >>> {"InnerProduct", "LSTMUnit", "ImageData"} <= caffe_layer_types()
    True
    >>> "GRUUnit" in caffe_layer_types()
    False
    """
    text = resources.files("unroll.frontend").joinpath(LAYER_TYPES_FILE).read_text()
    listed = (line.strip() for line in text.splitlines())
    return frozenset(t for t in listed if t and not t.startswith("#")) | set(NEEDS_OPENCV)


def unroll_only_types(net_param: NetParameter) -> list[str]:
    """The layer types of ``net_param`` that BVLC Caffe lacks, sorted."""
    known = caffe_layer_types()
    return sorted({lp.type for lp in net_param.layer if lp.type not in known})


def unroll_only_header(net_param: NetParameter) -> str:
    """A prototxt comment naming the unroll-only layer types of ``net_param`` ("" if none).

    >>> from unroll.frontend.unroller import expand
    >>> print(unroll_only_header(expand("gru", steps=1, input_dim=1, hidden=1)), end="")
    # unroll-only layer types (BVLC Caffe lacks them): GRUUnit
    # `unroll expand --caffe` (to_prototxt(..., caffe=True)) lowers them to Caffe's layers
    # or says why it cannot
    """
    types = unroll_only_types(net_param)
    if not types:
        return ""
    return (f"# unroll-only layer types (BVLC Caffe lacks them): {', '.join(types)}\n"
            "# `unroll expand --caffe` (to_prototxt(..., caffe=True)) lowers them to Caffe's "
            "layers\n# or says why it cannot\n")


def export_for_caffe(net_param: NetParameter) -> tuple[NetParameter, list[str]]:
    """``net_param`` with only BVLC Caffe's layer types, and one note per lowered type.

    Every layer of a type Caffe lacks is lowered (see the module docstring);
    where none can be, raises one NetError with one line per such layer,
    saying why. The input is not changed.
    """
    known = caffe_layer_types()
    refused = []
    for lp in net_param.layer:
        if lp.type not in known:
            why = _why_not(lp) if lp.type not in LOWERINGS else _carries_extras(lp)
            if why:
                refused.append(f"layer '{lp.name}' ({lp.type}): {why}")
    if refused:
        raise NetError(f"cannot export net '{net_param.name}' to BVLC Caffe: "
                       f"{len(refused)} layer(s) have no form in Caffe's layers:\n  "
                       + ";\n  ".join(refused))
    names, shapes = _Names(net_param), _Shapes(net_param)
    out = NetParameter()
    out.CopyFrom(net_param)
    del out.layer[:]
    lowered = Counter()
    for lp in net_param.layer:
        if lp.type in known:
            out.layer.append(lp)
            continue
        out.layer.extend(_with_rules(lp, LOWERINGS[lp.type](lp, names, shapes)))
        lowered[lp.type] += 1
    _silence_orphans(net_param, out, names)
    return out, [f"{n} {kind} layer(s) lowered: {NOTES[kind]}" for kind, n in lowered.items()]


def caffe_header(notes: list[str]) -> str:
    """The prototxt comment of an exported net: what was lowered, and how."""
    lines = ["# for BVLC Caffe: only layer types Caffe has (unroll expand --caffe)"]
    for note in notes:
        lines += textwrap.wrap(note, 98, initial_indent="# ", subsequent_indent="#   ",
                               break_on_hyphens=False)
    return "\n".join(lines) + "\n"


# -- the lowerings ---------------------------------------------------------------------


class _Names:
    """Fresh layer and blob names ``<layer>/<role>``, checked against the net's own."""

    def __init__(self, net_param: NetParameter):
        self.taken = {lp.name for lp in net_param.layer}
        self.taken.update(b for lp in net_param.layer for b in (*lp.bottom, *lp.top))

    def __call__(self, lp: LayerParameter, role: str) -> str:
        name = f"{lp.name}/{role}"
        if name in self.taken:
            raise NetError(f"layer '{lp.name}' ({lp.type}): cannot lower it for Caffe: the name "
                           f"'{name}' it needs is taken by the net")
        self.taken.add(name)
        return name


class _Shapes:
    """Blob shapes of the net, from building it once in unroll (only a lowering that must
    size given blobs asks)."""

    def __init__(self, net_param: NetParameter):
        self.net_param, self.nets = net_param, {}

    def __call__(self, lp: LayerParameter, blob: str) -> tuple:
        from unroll.engine.net import Net

        for phase in ("train", "test"):
            if phase not in self.nets:
                self.nets[phase] = Net(self.net_param, phase=phase, plan_memory=False)
            if lp.name in {layer.name for layer in self.nets[phase].layers}:
                return tuple(self.nets[phase].blobs[blob].shape)
        raise NetError(f"layer '{lp.name}' ({lp.type}) runs in neither phase")


def _layer(name: str, type_: str, bottoms, tops) -> LayerParameter:
    return LayerParameter(name=name, type=type_, bottom=list(bottoms), top=list(tops))


def _eltwise(name: str, bottoms, top: str, operation: str = "SUM", coeff=()) -> LayerParameter:
    lp = _layer(name, "Eltwise", bottoms, [top])
    if operation != "SUM":
        lp.eltwise_param.operation = lp.eltwise_param.EltwiseOp.Value(operation)
    lp.eltwise_param.coeff.extend(coeff)
    return lp


def _scale(name: str, x: str, by: str, top: str) -> LayerParameter:
    """top = x * by, ``by`` (1, N) or (N,)-like covering x's leading axes (Scale, axis 0)."""
    lp = _layer(name, "Scale", [x, by], [top])
    lp.scale_param.axis = 0
    return lp


def _gru_unit(lp: LayerParameter, names: _Names, shapes: _Shapes) -> list[LayerParameter]:
    """GRUUnit as gru_primitive.prototxt.j2 spells its step:
    h' = cont h_prev; r, z = sigmoid(x_rz + hh_rz); n = tanh(x_n + r hh_n); h = n + z (h' - n)."""
    h_prev, x, hh, cont = lp.bottom
    (h,) = lp.top
    b = {role: names(lp, role) for role in (
        "h_cont", "xr", "xz", "xn", "hr", "hz", "hn", "r_pre", "r", "z_pre", "z", "rhn", "n_pre",
        "n", "h_minus_n", "zd")}
    out = [_scale(b["h_cont"], h_prev, cont, b["h_cont"])]
    for name, bottom, tops in ((names(lp, "x_split"), x, ("xr", "xz", "xn")),
                               (names(lp, "hh_split"), hh, ("hr", "hz", "hn"))):
        cut = _layer(name, "Slice", [bottom], [b[t] for t in tops])
        cut.slice_param.axis = -1  # three equal parts of the gates' axis
        out.append(cut)
    for gate in ("r", "z"):
        out.append(_eltwise(b[f"{gate}_pre"], [b[f"x{gate}"], b[f"h{gate}"]], b[f"{gate}_pre"]))
        out.append(_layer(b[gate], "Sigmoid", [b[f"{gate}_pre"]], [b[gate]]))
    out += [
        _eltwise(b["rhn"], [b["r"], b["hn"]], b["rhn"], "PROD"),
        _eltwise(b["n_pre"], [b["xn"], b["rhn"]], b["n_pre"]),
        _layer(b["n"], "TanH", [b["n_pre"]], [b["n"]]),
        _eltwise(b["h_minus_n"], [b["h_cont"], b["n"]], b["h_minus_n"], coeff=(1, -1)),
        _eltwise(b["zd"], [b["z"], b["h_minus_n"]], b["zd"], "PROD"),
        _eltwise(names(lp, "h"), [b["n"], b["zd"]], h),
    ]
    return out


def _trailing_sequence_end(lp: LayerParameter, names: _Names,
                           shapes: _Shapes) -> list[LayerParameter]:
    """The last run step's state, as is: a Reshape that keeps every axis."""
    keep = _layer(names(lp, "last"), "Reshape", lp.bottom[:1], lp.top)
    keep.reshape_param.shape.SetInParent()
    keep.reshape_param.num_axes = 0
    return [keep]


def _leading_sequence_end(lp: LayerParameter, names: _Names,
                          shapes: _Shapes) -> list[LayerParameter]:
    """sum_k m_k s_k with m_k = c_k (1 - c_{k+1}), c_0 = 1 and c_T = 0: the state at each
    column's last step, when its cont over the run is 1 ... 1 0 ... 0 after step 0."""
    n_states = (len(lp.bottom) + 1) // 2
    states, conts = list(lp.bottom[:n_states]), list(lp.bottom[n_states:])
    if n_states == 1:
        return _trailing_sequence_end(lp, names, shapes)
    out, pieces = [], []
    ends = []  # 1 - c_{k+1}: step k is the last of its sequence
    for k, c in enumerate(conts):
        end = names(lp, f"end{k}")
        power = _layer(end, "Power", [c], [end])
        power.power_param.scale, power.power_param.shift = -1.0, 1.0
        out.append(power)
        ends.append(end)
    for k, state in enumerate(states):
        if k == 0:
            mask = ends[0]
        elif k == n_states - 1:
            mask = conts[k - 1]
        else:
            mask = names(lp, f"mask{k}")
            out.append(_eltwise(mask, [conts[k - 1], ends[k]], mask, "PROD"))
        piece = names(lp, f"picked{k}")
        out.append(_scale(piece, state, mask, piece))
        pieces.append(piece)
    out.append(_eltwise(names(lp, "sum"), pieces, lp.top[0]))
    return out


def _reshape(name: str, bottom: str, top: str, dims) -> LayerParameter:
    lp = _layer(name, "Reshape", [bottom], [top])
    lp.reshape_param.shape.dim.extend(dims)
    return lp


def _power(name: str, bottom: str, top: str, scale: float, shift: float) -> LayerParameter:
    lp = _layer(name, "Power", [bottom], [top])
    lp.power_param.scale, lp.power_param.shift = scale, shift
    return lp


def _frozen(lp: LayerParameter, *values) -> LayerParameter:
    """``lp`` with params that no solver changes (lr_mult 0, decay_mult 0), named after the
    layer (a shared store needs names), holding ``values`` where given (Caffe reads a layer's
    ``blobs`` as its initial params and then skips its fillers)."""
    for k in range(max(len(values), 1)):
        lp.param.add(name=f"{lp.name}.{k}", lr_mult=0, decay_mult=0)
    for value in values:
        lp.blobs.add().CopyFrom(blob_proto_from_array(np.asarray(value, np.float32)))
    return lp


def _scatter(lp: LayerParameter, names: _Names, shapes: _Shapes) -> list[LayerParameter]:
    """Scatter as a gather: for each cell j, the row k with i[k] == j, or a zero row.

    With K positions i and C cells: hit[j, k] = 1 - Threshold(|i[k] - j|) (i and j whole
    numbers), and source[j] = sum_k (k - K) hit[j, k] + K is the row that cell j takes, or K
    where no row names it; BatchReindex picks the rows of [x; 0] (2K rows), so its backward
    is Scatter's: each row of x gets the gradient of its cell. The arrays that hold j and k
    are frozen params given in the prototxt, so the net is fixed to K and C."""
    x, at, like = lp.bottom
    (top,) = lp.top
    K, like_shape = int(np.prod(shapes(lp, at))), shapes(lp, like)
    C, D = int(np.prod(like_shape)), shapes(lp, x)[-1]
    b = {role: names(lp, role) for role in (
        "at", "cell_col", "one", "ones", "at_rows", "offset", "distance", "miss", "hit",
        "source_col", "source", "rows", "zeros", "padded", "picked")}
    ones = _frozen(_layer(b["ones"], "InnerProduct", [b["one"]], [b["ones"]]))
    ones.inner_product_param.num_output, ones.inner_product_param.bias_term = K, False
    ones.inner_product_param.weight_filler.type = "constant"
    ones.inner_product_param.weight_filler.value = 1
    offset = _frozen(_layer(b["offset"], "Bias", [b["at_rows"]], [b["offset"]]),
                     -np.arange(C))
    offset.bias_param.axis = 0
    source = _frozen(_layer(b["source_col"], "InnerProduct", [b["hit"]], [b["source_col"]]),
                     (np.arange(K) - K).reshape(1, K), [K])
    source.inner_product_param.num_output = 1
    scale = _layer(b["at_rows"], "Scale", [b["ones"], b["at"]], [b["at_rows"]])
    scale.scale_param.axis = 1
    padded = _layer(b["padded"], "Concat", [b["rows"], b["zeros"]], [b["padded"]])
    padded.concat_param.axis = 0
    return [
        _reshape(b["at"], at, b["at"], [-1]),
        _reshape(b["cell_col"], like, b["cell_col"], [-1, 1]),
        _power(b["one"], b["cell_col"], b["one"], scale=0, shift=1),
        ones, scale, offset,
        _layer(b["distance"], "AbsVal", [b["offset"]], [b["distance"]]),
        _layer(b["miss"], "Threshold", [b["distance"]], [b["miss"]]),
        _power(b["hit"], b["miss"], b["hit"], scale=-1, shift=1),
        source,
        _reshape(b["source"], b["source_col"], b["source"], [-1]),
        _reshape(b["rows"], x, b["rows"], [-1, D]),
        _power(b["zeros"], b["rows"], b["zeros"], scale=0, shift=0),
        padded,
        _layer(b["picked"], "BatchReindex", [b["padded"], b["source"]], [b["picked"]]),
        _reshape(names(lp, "grid"), b["picked"], top, [*like_shape, D]),
    ]


def _batch_matmul(lp: LayerParameter, names: _Names, shapes: _Shapes) -> list[LayerParameter]:
    """Scores M (S, N, H) x q (N, H): sum over h of Scale(M, q, axis 1); contexts
    a (S, N) x M (S, N, H): sum over s of Scale(M, a, axis 0), by Slice and Eltwise."""
    first, second = lp.bottom
    (top,) = lp.top
    product = names(lp, "product")
    if len(shapes(lp, first)) == 3:
        scale = _layer(product, "Scale", [first, second], [product])
        scale.scale_param.axis = 1
        total = _layer(names(lp, "sum"), "Reduction", [product], [top])
        total.reduction_param.axis = 2
        return [scale, total]
    steps = shapes(lp, second)[0]
    out = [_scale(product, second, first, product)]
    summed = product
    if steps > 1:
        parts = [names(lp, f"step{s}") for s in range(steps)]
        cut = _layer(names(lp, "steps"), "Slice", [product], parts)
        cut.slice_param.axis = 0
        summed = names(lp, "summed")
        out += [cut, _eltwise(summed, parts, summed)]
    drop = _layer(names(lp, "drop_step_axis"), "Reshape", [summed], [top])
    drop.reshape_param.shape.SetInParent()
    drop.reshape_param.axis, drop.reshape_param.num_axes = 0, 1
    return out + [drop]


LOWERINGS = {
    "BatchMatMul": _batch_matmul,
    "GRUUnit": _gru_unit,
    "TrailingSequenceEnd": _trailing_sequence_end,
    "LeadingSequenceEnd": _leading_sequence_end,
    "Scatter": _scatter,
}
#: what each lowering does, for the header comment of the exported net
NOTES = {
    "BatchMatMul": "a Scale of the memory by the query or the weights, summed over the "
                   "contracted axis (Reduction for scores; Slice, Eltwise and Reshape over the "
                   "memory's steps for contexts, fixed to the steps it was exported with)",
    "GRUUnit": "the primitive GRU step (Scale, Slice, Eltwise, Sigmoid, TanH), same params",
    "TrailingSequenceEnd": "a shape-keeping Reshape of the last run step's state; Caffe does "
                           "not check that each column holds one right-aligned sequence",
    "Scatter": "a gather: one-hot rows of the positions (AbsVal, Threshold, Power), the row each "
               "cell takes (InnerProduct), BatchReindex of [x; 0]; fixed to the positions and "
               "cells it was exported with, which Caffe trusts to be distinct; the comparison "
               "holds cells x positions values",
    "LeadingSequenceEnd": "each step's state masked by cont[k] * (1 - cont[k + 1]) and summed "
                          "(Power, Eltwise, Scale); Caffe does not check that each column "
                          "holds one left-aligned sequence",
}
def _why_not(lp: LayerParameter) -> str:
    if lp.type == "SegmentSum":
        return ("a tree net's child sum by segment ids, which Caffe's layers cannot add up; "
                "expand the tree net with fixed_arity=A (the sum of A gathers, one per child "
                "slot, in BatchReindex, Reshape, Slice and Eltwise) to export it")
    if lp.type in LAYERS:
        return "a layer type of unroll's own (registered by @register_layer) that BVLC Caffe " \
               "lacks, with no lowering to Caffe's layers"
    return "a layer type that neither BVLC Caffe nor unroll knows"


def _carries_extras(lp: LayerParameter) -> str:
    """Why the lowering would drop something the layer says (loss weights, propagate_down)."""
    extras = [f for f in ("loss_weight", "propagate_down", "param", "blobs") if getattr(lp, f)]
    if extras:
        return (f"sets {', '.join(extras)}, which its lowering to several Caffe layers cannot "
                f"carry over")
    return ""


def _with_rules(lp: LayerParameter, layers: list[LayerParameter]) -> list[LayerParameter]:
    """The lowered layers, each with the phase and include/exclude rules of the original."""
    for new in layers:
        if lp.HasField("phase"):
            new.phase = lp.phase
        new.include.extend(lp.include)
        new.exclude.extend(lp.exclude)
    return layers


def _silence_orphans(before: NetParameter, after: NetParameter, names: _Names) -> None:
    """A Silence for blobs that only a lowered layer read (a sequence end's conts), so the
    exported net has the outputs the original had."""
    read_before = {b for lp in before.layer for b in lp.bottom}
    read_after = {b for lp in after.layer for b in lp.bottom}
    made = {t: None for lp in after.layer for t in lp.top}  # in net order
    orphans = [t for t in made if t in read_before and t not in read_after]
    if orphans:
        name = names(LayerParameter(name=after.name or "net"), "caffe_silence")
        after.layer.add(name=name, type="Silence", bottom=orphans)
