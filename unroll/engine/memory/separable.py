"""A loss over a whole (T, N, ...) output, run by chunks of time (docs/design.md, 6. Memory,
the whole-output loss).

A net whose steps' outputs are concatenated along time (a Concat on axis 0), run through
layers that treat each position apart (an InnerProduct from axis 2 on, a Softmax on an
axis past 0, element-wise neurons) and scored by a loss that is a sum over positions
(SoftmaxWithLoss, EuclideanLoss) keeps that whole output, its softmax and its diff alive
for the whole run: no memory budget gets below about half the full plan.
:func:`separate_losses` rewrites such a chain into one piece per chunk of
:data:`GRADIENT_CHUNK` steps: the chunk's Concat, its copy of each layer (sharing the
params by name) and its share of the loss (:mod:`unroll.engine.layers.loss_chunks`),
divided by ONE normalizer, the whole output's; a Concat and a Reduction (SUM) named as the
loss add the shares up. Each piece runs right after its chunk's last step, so its output,
softmax and diff live only around that chunk's steps, forward and backward, and the
ordinary planner places them. The whole layers sum by the same chunks (the InnerProduct's
weight gradient, EuclideanLoss's loss), so the rewritten net gives their results bit for bit.

What is rewritten: the loss's labels (targets) are an input whose axis 0 is T, as many
steps as the Concat has bottoms; nothing else reads the chain's blobs, and none of them
is kept (``keep=``): a net whose user keeps the concatenated output, or an intermediate,
is left as it is. So is a net whose labels come after its last step: every piece would run
there, as the whole does, and the pieces would only add their blobs to the plan.
:data:`SEPARATE` is the off switch.

>>> from unroll.core.proto import NetParameter, read_message
>>> steps = "".join(f'layer {{ name: "s{t}" type: "Input" top: "h{t}" '
...                 f'input_param {{ shape {{ dim: 1 dim: 2 dim: 3 }} }} }}' for t in range(40))
>>> labels = ('layer { name: "y" type: "Input" top: "y" '
...           'input_param { shape { dim: 40 dim: 2 dim: 3 } } }')
>>> net = read_message(labels + steps + '''
...   layer { name: "h" type: "Concat" top: "h" concat_param { axis: 0 }'''
...   + "".join(f' bottom: "h{t}"' for t in range(40)) + ''' }
...   layer { name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "y" top: "loss" }''',
...   NetParameter)
>>> [(lp.name, lp.type) for lp in separate_losses(list(net.layer), set())
...  if lp.type != "Input"]  # doctest: +NORMALIZE_WHITESPACE
[('loss/y', 'Slice'), ('h/0', 'Concat'), ('loss/0', 'EuclideanLossChunk'),
 ('h/1', 'Concat'), ('loss/1', 'EuclideanLossChunk'), ('loss/shares', 'Concat'),
 ('loss', 'Reduction')]
"""

from __future__ import annotations

from dataclasses import dataclass

from unroll.core.proto import LayerParameter
from unroll.engine.memory.weight_gradients import GRADIENT_CHUNK

__all__ = ["SEPARATE", "separate_losses"]

#: the off switch: False leaves every net as it is
SEPARATE = True

#: layers that treat every position of axis 0 apart, and have one bottom and one top
_NEURONS = {"ReLU", "Sigmoid", "TanH", "AbsVal", "Power"}
#: the losses that are a sum over positions, and their pieces
_PIECES = {"SoftmaxWithLoss": "SoftmaxWithLossChunk", "EuclideanLoss": "EuclideanLossChunk"}


def _per_position(lp: LayerParameter) -> bool:
    """Whether layer ``lp`` treats each position along axis 0 apart, as one chunk's copy."""
    if len(lp.bottom) != 1 or len(lp.top) != 1 or lp.loss_weight or lp.propagate_down:
        return False
    if lp.type == "InnerProduct":
        return lp.inner_product_param.axis >= 2 and not lp.blobs
    if lp.type == "Softmax":
        return lp.softmax_param.axis >= 1
    return lp.type in _NEURONS


@dataclass
class _Chain:
    """A Concat on axis 0, the per-position layers after it and the loss ending them."""

    concat: int
    layers: list[int]
    loss: int
    labels: str


def _input_steps(layer_params, name: str) -> int | None:
    """Axis 0 of input ``name``, as its Input layer declares it; None if not an input."""
    for lp in layer_params:
        if lp.type == "Input" and name in lp.top:
            shapes, k = lp.input_param.shape, list(lp.top).index(name)
            if len(shapes) == 1:
                k = 0
            return shapes[k].dim[0] if k < len(shapes) and shapes[k].dim else None
        if name in lp.top:
            return None
    return None


def _chain_from(layer_params, c: int, keep) -> _Chain | None:
    """The chain of the Concat at ``c``, if its loss separates over its chunks of time."""
    readers: dict[str, list[int]] = {}
    writers: dict[str, list[int]] = {}
    for i, lp in enumerate(layer_params):
        for b in lp.bottom:
            readers.setdefault(b, []).append(i)
        for t in lp.top:
            writers.setdefault(t, []).append(i)
    name, at, chain = layer_params[c].top[0], c, []
    while True:
        reading = readers.get(name, [])
        in_place = [r for r in reading if list(layer_params[r].top) == [name]]
        if name in keep or writers[name] != [at, *in_place]:
            return None
        rest = [r for r in reading if r not in in_place]
        if len(rest) != 1 or not all(_per_position(layer_params[r]) for r in in_place):
            return None
        chain += in_place
        (nxt,) = rest
        lp = layer_params[nxt]
        if lp.type in _PIECES:
            break
        if not _per_position(lp) or lp.top[0] in writers and writers[lp.top[0]][0] != nxt:
            return None
        chain.append(nxt)
        name, at = lp.top[0], nxt
    if (list(lp.bottom).index(name) != 0 or len(lp.top) != 1 or len(lp.bottom) != 2
            or (lp.type == "SoftmaxWithLoss" and lp.softmax_param.axis < 1)):
        return None
    labels = lp.bottom[1]
    if labels == name or _input_steps(layer_params, labels) != len(layer_params[c].bottom):
        return None
    return _Chain(c, chain, nxt, labels)


def _renamed(lp: LayerParameter, k: int, params: dict[str, list[str]]) -> LayerParameter:
    """Chunk ``k``'s copy of ``lp``: its blobs renamed, its params shared by name."""
    piece = LayerParameter()
    piece.CopyFrom(lp)
    piece.name = f"{lp.name}/{k}"
    piece.ClearField("bottom")
    piece.ClearField("top")
    piece.bottom.extend(f"{b}/{k}" for b in lp.bottom)
    piece.top.extend(f"{t}/{k}" for t in lp.top)
    for index, name in enumerate(params.get(lp.name, ())):
        spec = piece.param[index] if index < len(piece.param) else piece.param.add()
        spec.name = name
    return piece


def _param_names(lp: LayerParameter) -> list[str]:
    """The names of an InnerProduct's params, as the net names them (given or
    ``"<layer>.<index>"``); none for the other layers of a chain, which have no params."""
    if lp.type != "InnerProduct":
        return []
    count = 1 + lp.inner_product_param.bias_term
    return [lp.param[i].name if i < len(lp.param) and lp.param[i].name else f"{lp.name}.{i}"
            for i in range(count)]


def _rewrite(layer_params, chain: _Chain) -> list[LayerParameter] | None:
    concat, loss = layer_params[chain.concat], layer_params[chain.loss]
    steps = list(concat.bottom)
    chunks = [steps[s:s + GRADIENT_CHUNK] for s in range(0, len(steps), GRADIENT_CHUNK)]
    params = {layer_params[i].name: _param_names(layer_params[i]) for i in chain.layers}
    last_writer = {}  # of the versions the Concat reads
    for i, lp in enumerate(layer_params[:chain.concat]):
        for t in lp.top:
            last_writer[t] = i
    labels_at = max(i for i, lp in enumerate(layer_params[:chain.loss]) if chain.labels in lp.top)
    pieces: dict[int, list[LayerParameter]] = {}
    after = labels_at
    for k, bottoms in enumerate(chunks):
        after = max([after] + [last_writer[b] for b in bottoms])
        part = LayerParameter(name=f"{concat.name}/{k}", type="Concat", bottom=bottoms,
                              top=[f"{concat.top[0]}/{k}"])
        part.concat_param.axis = 0
        layers = [part] + [_renamed(layer_params[i], k, params) for i in chain.layers]
        share = _renamed(loss, k, {})
        share.type = _PIECES[loss.type]
        share.ClearField("loss_weight")
        share.bottom[1] = f"{chain.labels}/{k}"
        if share.type == "EuclideanLossChunk":
            share.input_param.shape.add(dim=[len(steps)])
        else:
            share.bottom.append(chain.labels)  # the valid labels of the whole count
            if share.propagate_down:
                share.propagate_down.append(False)
        pieces.setdefault(after, []).extend(layers + [share])
    if len(pieces) == 1:  # the labels come after the last step: every piece would run there
        return None
    slicer = LayerParameter(name=f"{loss.name}/{chain.labels}", type="Slice",
                            bottom=[chain.labels], top=[f"{chain.labels}/{k}"
                                                        for k in range(len(chunks))])
    slicer.slice_param.axis = 0
    slicer.slice_param.slice_point.extend(range(GRADIENT_CHUNK, len(steps), GRADIENT_CHUNK))
    shares = LayerParameter(name=f"{loss.name}/shares", type="Concat",
                            bottom=[f"{loss.top[0]}/{k}" for k in range(len(chunks))],
                            top=[f"{loss.top[0]}/shares"])
    shares.concat_param.axis = 0
    total = LayerParameter(name=loss.name, type="Reduction", bottom=shares.top, top=loss.top,
                           loss_weight=list(loss.loss_weight) or [1.0])
    pieces.setdefault(labels_at, []).insert(0, slicer)
    dropped = {chain.concat, chain.loss, *chain.layers}
    out = []
    for i, lp in enumerate(layer_params):
        if i == chain.loss:
            out += [shares, total]
        elif i not in dropped:
            out.append(lp)
        out += pieces.get(i, [])
    return out


def separate_losses(layer_params: list[LayerParameter], keep) -> list[LayerParameter]:
    """``layer_params`` with every whole-output loss that separates over chunks of time
    rewritten into one piece per chunk (see the module's doc); the rest as it was."""
    if not SEPARATE:
        return layer_params
    c = 0
    while c < len(layer_params):
        lp = layer_params[c]
        if (lp.type == "Concat" and lp.concat_param.axis == 0 and len(lp.top) == 1
                and len(lp.bottom) > GRADIENT_CHUNK and not lp.concat_param.HasField(
                    "concat_dim")):
            chain = _chain_from(layer_params, c, keep)
            rewritten = None if chain is None else _rewrite(layer_params, chain)
            if rewritten is not None:
                taken = {n for p in layer_params for n in (p.name, *p.top)}
                kept = {id(p) for p in layer_params}
                added = [n for p in rewritten if id(p) not in kept
                         for n in (p.name, *p.top) if p.type != "Reduction"]
                if taken.isdisjoint(added):  # a name of the user's is never taken
                    layer_params = rewritten
        c += 1
    return layer_params
