"""Caffe prototxt with its LSTM and RNN layers written out: ``unroll expand NET.prototxt``.

Caffe's recurrent layers hide a net unrolled over T steps inside one layer
(:mod:`unroll.engine.layers.caffe_recurrent`); this tool replaces each by its
hidden layers, so the unrolled net can be read, drawn and run as plain layers.
"""

from __future__ import annotations

from unroll.core.errors import NetError
from unroll.core.proto import LayerParameter, NetParameter, read_message
from unroll.engine.layers.caffe_recurrent import RecurrentLayer

__all__ = ["expand_net_file", "unrolled_net"]


def unrolled_net(source, steps: int | None = None, phase: str = "train") -> NetParameter:
    """``source`` (a NetParameter, prototxt path or text) with every LSTM and RNN layer unrolled.

    Each such layer of ``phase`` is replaced by the layers of its hidden net,
    named ``<layer>_<hidden name>``; its bottoms and tops keep their names,
    and its params are named as the layer's ``param { name }`` says, else
    ``<layer>_<Caffe's name>`` (``lstm1_W_xc``). Without ``expose_hidden`` the
    initial states are zero-filled inputs ``<layer>_h_0``... (the layer itself
    carries the state over from the previous batch). T is axis 0 of the
    layers' inputs; ``steps`` sets it: axis 0 of every time-major input (an
    Input top whose axis 0 is the T of the recurrent layers' ``cont``; their
    ``x_static`` and initial-state bottoms are not time-major) becomes ``steps``.

    >>> net = unrolled_net('''
    ...   layer { name: "in" type: "Input" top: "x" top: "cont"
    ...           input_param { shape { dim: 3 dim: 2 dim: 5 } shape { dim: 3 dim: 2 } } }
    ...   layer { name: "lstm1" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
    ...           recurrent_param { num_output: 4 } }''', steps=6)
    >>> sum(lp.type == "LSTMUnit" for lp in net.layer)
    6
    """
    from unroll.engine.net import PHASES, Net
    from unroll.graph.rules import filter_layers

    net_param = NetParameter()
    net_param.CopyFrom(read_message(source, NetParameter))
    if steps is not None:
        _set_steps(net_param, int(steps), Net(net_param, phase=phase))
    net = Net(net_param, phase=phase)
    recurrent = {layer.name: layer for layer in net.layers if isinstance(layer, RecurrentLayer)}
    included = filter_layers(net_param, PHASES[phase])
    out = NetParameter()
    out.CopyFrom(net_param)
    del out.layer[:]
    for lp in net_param.layer:
        layer = recurrent.get(lp.name)
        if layer is None or lp not in included:  # not recurrent, or of the other phase
            out.layer.add().CopyFrom(lp)
            continue
        T = net.blobs[lp.bottom[0]].shape[0]
        bottom_shapes = {"x": net.blobs[lp.bottom[0]].shape}
        if layer.static:
            bottom_shapes["x_static"] = net.blobs[lp.bottom[2]].shape
        out.layer.extend(_inline(layer, lp, layer.unrolled_param(T, bottom_shapes)))
    return out


def _set_steps(net_param: NetParameter, steps: int, net) -> None:
    """Set axis 0 of the time-major inputs of ``net_param`` to ``steps``."""
    if steps < 1:
        raise NetError(f"steps must be >= 1, found {steps}")
    layers = [layer for layer in net.layers if isinstance(layer, RecurrentLayer)]
    if not layers:
        raise NetError("steps is given, but the net has no LSTM or RNN layer to unroll")
    old = {net.blobs[layer.param.bottom[1]].shape[0] for layer in layers}
    if len(old) != 1:
        raise NetError(f"the LSTM and RNN layers see different T (axis 0 of their cont "
                       f"bottoms: {sorted(old)}); give each input's shape in the prototxt "
                       f"instead of steps")
    (T,) = old
    fixed = {b for layer in layers for b in layer.param.bottom[2:]}
    inputs = [(net_param.input, net_param.input_shape)]
    for lp in net_param.layer:
        if lp.type == "Input":
            shapes = lp.input_param.shape
            if len(shapes) == 1 and len(lp.top) > 1:  # one shape for all tops: one each
                shapes.extend([shapes[0]] * (len(lp.top) - 1))
            inputs.append((lp.top, shapes))
    for tops, shapes in inputs:
        for top, shape in zip(tops, shapes):
            if top not in fixed and shape.dim and shape.dim[0] == T:
                shape.dim[0] = steps


def _inline(layer: RecurrentLayer, lp: LayerParameter, hidden: NetParameter) -> list:
    """The hidden net's layers, renamed to live in the outer net in place of ``lp``."""
    prefix = f"{lp.name}_"
    outer = {"x": lp.bottom[0], "cont": lp.bottom[1], layer.output: lp.top[0]}
    if layer.static:
        outer["x_static"] = lp.bottom[2]
    if layer.expose:
        for k, state in enumerate(layer.states):
            outer[f"{state}_0"] = lp.bottom[2 + layer.static + k]
            outer[f"{state}_T"] = lp.top[1 + k]
    params = {}
    for k, name in enumerate(layer.blob_names):
        spec = lp.param[k] if k < len(lp.param) else None
        params[name] = spec, (spec.name if spec is not None and spec.name else prefix + name)
    layers = []
    for h in hidden.layer:
        if h.type == "Input" and all(t in outer for t in h.top):
            continue  # fed by the outer net's own bottoms
        new = LayerParameter()
        new.CopyFrom(h)
        new.name = prefix + h.name
        new.ClearField("bottom")
        new.bottom.extend(outer.get(b, prefix + b) for b in h.bottom)
        new.ClearField("top")
        new.top.extend(outer.get(t, prefix + t) for t in h.top)
        for p in new.param:
            spec, name = params[p.name]
            if spec is not None:
                p.CopyFrom(spec)
            p.name = name
        layers.append(new)
    return layers



def expand_net_file(path, steps: int, variables: dict) -> NetParameter:
    """``unroll expand NET.prototxt --steps T``: the net at ``path`` with LSTM/RNN unrolled."""
    if variables:
        raise NetError(f"--set {', '.join(variables)}: a .prototxt net takes no template "
                       f"variables")
    return unrolled_net(path, steps=steps)
