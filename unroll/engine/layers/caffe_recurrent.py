"""Caffe's own recurrent layers, ``LSTM`` and ``RNN``: a hidden unrolled net inside one layer.

BVLC Caffe's ``RecurrentLayer`` (``recurrent_layer.cpp``) builds a whole net
that unrolls its recurrence over the T steps of its input and runs it as one
layer. These layers do the same with unroll's own unroller and its built-in
``lstm`` and ``rnn`` step templates, whose params carry Caffe's names, so a
Caffe prototxt and its caffemodel run here unchanged::

    layer { name: "lstm1" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
            recurrent_param { num_output: 256 weight_filler { type: "uniform" min: -0.08
                              max: 0.08 } } }

Bottoms ``x`` (T, N, ...), ``cont`` (T, N) (0 where a sequence starts: the
state entering step t is multiplied by cont[t]), an optional ``x_static``
(N, ...) added to every step's input; with ``expose_hidden`` the initial
states (1, N, num_output) follow as bottoms (LSTM: h_0, c_0) and the final
states as extra tops (LSTM: h_T, c_T). Top 0 is (T, N, num_output).

Blobs, in Caffe's order and shapes (D = x's size per step, S = x_static's):

* LSTM: W_xc (4H, D), b_c (4H,), [W_xc_static (4H, S)], W_hc (4H, H); gates
  i, f, o, g as Caffe's LSTMUnit.
* RNN: W_xh (H, D), b_h (H,), [W_xh_static (H, S)], W_hh (H, H), W_ho (H, H),
  b_o (H,); h_t = tanh(W_xh x_t + b_h + W_hh (cont_t h_{t-1})) and the top is
  o_t = tanh(W_ho h_t + b_o).

As in Caffe, without ``expose_hidden`` the state carries over from one
forward to the next (step 0 starts from the previous batch's final state,
multiplied by cont[0]); :meth:`RecurrentLayer.reset` zeroes it. Where unroll
differs: T may change between batches (one hidden net per T is built and
cached, all over the layer's own blobs), and with ``expose_hidden`` the
gradient flows into h_0 and c_0 and from the h_T and c_T tops (Caffe leaves
those diffs unset), so the whole layer matches finite differences.

:func:`unroll.tools.caffe_prototxt.unrolled_net` writes out what the layers hide: the
same net with each LSTM and RNN layer replaced by its unrolled layers
(``unroll expand NET.prototxt``).
"""

from __future__ import annotations

import logging
import math

from unroll.core.proto import LayerParameter, NetParameter
from unroll.engine.backend import device_of
from unroll.engine.fillers import FILLERS
from unroll.engine.hidden_nets import expand
from unroll.engine.layer import Layer, register_layer
from unroll.engine.memory import GRADIENT_CHUNK
from unroll.engine.memory_traits import MemoryTraits
from unroll.engine.param_store import LearnableParam, ParamStore

__all__ = ["LSTMLayer", "RNNLayer", "RecurrentLayer"]

log = logging.getLogger(__name__)


class RecurrentLayer(Layer):
    """Caffe's RecurrentLayer: runs a hidden net unrolled over axis 0 of bottom 0.

    Subclasses name their step template, recurrent states, hidden output blob
    and blobs (:meth:`blob_specs`), and may add layers after the recurrence
    (:meth:`output_layers`).
    """

    # its forward carries the hidden state to the next batch
    memory = MemoryTraits(recomputable=False)

    template = ""
    states: tuple = ()
    output = ""
    #: the param projecting x, next to which the x_static term is added
    input_weight = ""
    # backward runs the hidden net, which keeps its own copies of the bottoms
    backward_reads = ()
    param_messages = ("recurrent_param",)

    def __init__(self, param, *args, **kwargs):
        super().__init__(param, *args, **kwargs)
        self.expose = param.recurrent_param.expose_hidden

    def counts(self) -> tuple:
        exposed = len(self.states) if self.expose else 0
        return (2 + exposed, 3 + exposed), (1 + exposed, 1 + exposed)

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1  # no gradient for the sequence continuation indicators

    # -- what a subclass defines ----------------------------------------------------
    def blob_specs(self, D: int, S: int | None) -> list:
        """[(Caffe's param name, shape, filler)] in Caffe's blob order."""
        raise NotImplementedError

    def gate_width(self) -> int:
        """Width of the projected input (4H for the LSTM's gates, H for the RNN)."""
        raise NotImplementedError

    def output_layers(self) -> list:
        """Layers after the unrolled recurrence that make the output blob from ``h``."""
        return []

    # -- setup ------------------------------------------------------------------------
    def layer_setup(self, bottoms, tops):
        p = self.param.recurrent_param
        if p.num_output < 1:
            raise self.error(f"recurrent_param.num_output must be > 0, found {p.num_output}")
        for what in ("weight_filler", "bias_filler"):
            filler = getattr(p, what)
            if filler.type not in FILLERS:
                raise self.error(f"recurrent_param.{what}: filler type '{filler.type}' is not "
                                 f"supported (supported: {', '.join(FILLERS)})")
            if filler.type == "gaussian" and filler.sparse >= 0:
                raise self.error(f"recurrent_param.{what}: the gaussian filler's 'sparse' is "
                                 f"not supported")
        self.H = p.num_output
        self.static = len(bottoms) > self.counts()[0][0]
        x = bottoms[0].shape
        if len(x) < 3:
            raise self.error(f"bottom 0 (x) '{bottoms[0].name}' must be (T, N, ...) with at "
                             f"least 3 axes, found {x}")
        self.D = math.prod(x[2:])
        self.S = math.prod(bottoms[2].shape[1:]) if self.static else None
        self.blob_names = []
        for name, shape, filler in self.blob_specs(self.D, self.S):
            self.param_blob(shape, filler)
            self.blob_names.append(name)
        # the hidden nets' params ARE self.blobs: every net built over this store shares them
        self.store = ParamStore()
        for name, blob in zip(self.blob_names, self.blobs):
            self.store.add(LearnableParam(name, blob, owner=self.name))
        self.nets = {}
        self.carried = None

    def reset(self) -> None:
        """Zero the state carried between batches (Caffe's RecurrentLayer::Reset)."""
        self.carried = None

    # -- the hidden net ---------------------------------------------------------------
    def unrolled_param(self, T: int, shapes: dict) -> NetParameter:
        """The hidden net for T steps: inputs x, cont, [x_static], h_0...; outputs, h_T...

        ``shapes`` gives the shapes of "x" and, with a static input, "x_static".
        """
        x_shape = tuple(shapes["x"])
        N = x_shape[1]
        # chunked as the weight gradients are, so recomputed segments are cut between both;
        # a static input is added to x's projection, which must then be one layer
        net = expand(self.template, steps=T, batch=N, input_dim=self.D, hidden=self.H,
                     expose_hidden=True, chunk=None if self.static else GRADIENT_CHUNK)
        layers = list(net.layer)
        for lp in layers:
            if lp.type == "Input" and "x" in lp.top:
                shape = lp.input_param.shape[list(lp.top).index("x")]
                del shape.dim[:]
                shape.dim.extend(x_shape)
        if self.static:
            layers = self._with_static_input(layers, T, tuple(shapes["x_static"]))
        layers += self.output_layers()
        del net.layer[:]
        net.layer.extend(layers)
        net.name = f"{self.name}_unrolled_T{T}"
        # no loss inside: backward starts from the diffs the layer writes into the outputs
        net.force_backward = True
        return net

    def _with_static_input(self, layers: list, T: int, static_shape: tuple) -> list:
        """``layers`` with W_static x_static added to the projected input of every step."""
        W = self.input_weight
        at = [i for i, lp in enumerate(layers) if any(p.name == W for p in lp.param)]
        if len(at) != 1:
            raise self.error(f"template '{self.template}' must project x in one layer with "
                             f"param '{W}', found {len(at)}")
        i = at[0]
        projected = layers[i].top[0]
        layers[i].top[0] = f"{W}_x"
        static_in = LayerParameter(name="static_input", type="Input", top=["x_static"])
        static_in.input_param.shape.add().dim.extend(static_shape)
        ip = LayerParameter(name=f"{W}_x_static", type="InnerProduct", bottom=["x_static"],
                            top=[f"{W}_x_static_preshape"])
        ip.param.add(name=f"{W}_static")
        ip.inner_product_param.num_output = self.gate_width()
        ip.inner_product_param.bias_term = False
        ip.inner_product_param.axis = 1
        reshape = LayerParameter(name=f"{W}_x_static_reshape", type="Reshape",
                                 bottom=[ip.top[0]], top=[f"{W}_x_static"])
        reshape.reshape_param.shape.dim.extend([1, -1, self.gate_width()])
        added = [ip, reshape]
        static = reshape.top[0]
        if T > 1:  # the same (1, N, G) term for every step
            tile = LayerParameter(name=f"{W}_x_static_tile", type="Concat",
                                  bottom=[static] * T, top=[f"{W}_x_static_tiled"])
            tile.concat_param.axis = 0
            added.append(tile)
            static = tile.top[0]
        added.append(LayerParameter(name=f"{W}_x_sum", type="Eltwise",
                                    bottom=[f"{W}_x", static], top=[projected]))
        return [static_in, *layers[: i + 1], *added, *layers[i + 1:]]

    def _net(self, T: int, shapes: dict):
        from unroll.engine.net import Net  # unroll.engine.net imports the layer registry

        if T not in self.nets:
            param = self.unrolled_param(T, shapes)
            # force_backward would also compute the gradient of every cont slice: refuse it
            conts = {"cont"} | {t for lp in param.layer if "cont" in lp.bottom for t in lp.top}
            for lp in param.layer:
                if conts & set(lp.bottom):
                    del lp.propagate_down[:]
                    lp.propagate_down.extend(b not in conts for b in lp.bottom)
            # debug_info logs every hidden blob after a run: only an unplanned net keeps them
            net = Net(param, phase=self.phase, device=device_of(self.xp), dtype=self.dtype,
                      param_store=self.store,
                      plan_memory=not self.param.recurrent_param.debug_info)
            extra = [p.name for p in self.store][len(self.blobs):]
            if extra:
                raise self.error(f"template '{self.template}' has params {extra} beyond "
                                 f"Caffe's {self.blob_names}")
            self.nets[T] = net
        return self.nets[T]

    # -- the contract -----------------------------------------------------------------
    def reshape(self, bottoms, tops):
        x, cont = bottoms[0], bottoms[1]
        if x.ndim < 3 or math.prod(x.shape[2:]) != self.D:
            raise self.error(f"bottom 0 (x) '{x.name}' has shape {x.shape}; expected (T, N, ...) "
                             f"with {self.D} values per step, as W has")
        T, N = x.shape[:2]
        if cont.shape != (T, N):
            raise self.error(f"bottom 1 (cont) '{cont.name}' has shape {cont.shape}; expected "
                             f"(T, N) = {(T, N)} as x '{x.name}' {x.shape}")
        shapes = {"x": x.shape}
        if self.static:
            s = bottoms[2]
            if s.ndim < 1 or s.shape[0] != N or math.prod(s.shape[1:]) != self.S:
                raise self.error(f"bottom 2 (x_static) '{s.name}' has shape {s.shape}; "
                                 f"expected (N = {N}, ...) with {self.S} values per stream")
            shapes["x_static"] = s.shape
        state_shape = (1, N, self.H)
        for b in self._state_bottoms(bottoms):
            if b.shape != state_shape:
                raise self.error(f"initial state bottom '{b.name}' has shape {b.shape}; "
                                 f"expected {state_shape}")
        self.active = self._net(T, shapes)
        tops[0].reshape((T, N, self.H))
        for top in tops[1:]:
            top.reshape(state_shape)

    def _state_bottoms(self, bottoms):
        return bottoms[2 + self.static:] if self.expose else []

    def forward(self, bottoms, tops):
        net = self.active
        net.set_input("x", bottoms[0].data)
        net.set_input("cont", bottoms[1].data)
        if self.static:
            net.set_input("x_static", bottoms[2].data)
        state_shape = tops[0].shape[1:2]
        if self.expose:
            for state, b in zip(self.states, self._state_bottoms(bottoms)):
                net.set_input(f"{state}_0", b.data)
        else:
            carried = self.carried
            if carried is None or carried[self.states[0]].shape[1:2] != state_shape:
                carried = {s: self.xp.zeros((1, *state_shape, self.H), self.dtype)
                           for s in self.states}
            for state in self.states:
                net.set_input(f"{state}_0", carried[state])
        net.forward()
        tops[0].data[...] = net.blobs[self.output].data
        finals = [net.blobs[f"{state}_T"].data for state in self.states]
        if self.expose:
            for top, final in zip(tops[1:], finals):
                top.data[...] = final
        else:
            self.carried = {s: final.copy() for s, final in zip(self.states, finals)}
        if self.param.recurrent_param.debug_info:
            _debug_info(self, net, "Forward")

    def backward(self, tops, propagate_down, bottoms):
        net = self.active
        net.blobs[self.output].diff[...] = tops[0].diff
        for k, state in enumerate(self.states):
            final = net.blobs[f"{state}_T"].diff
            if self.expose:
                final[...] = tops[1 + k].diff
            else:
                final.fill(0)  # a carried state gets no gradient across batches (Caffe)
        net.backward()
        inputs = ["x", "cont"] + (["x_static"] if self.static else [])
        if self.expose:
            inputs += [f"{state}_0" for state in self.states]
        for down, name, bottom in zip(propagate_down, inputs, bottoms):
            if down:
                bottom.diff[...] = net.blobs[f"{name}@0"].diff
        if self.param.recurrent_param.debug_info:
            _debug_info(self, net, "Backward")


@register_layer("LSTM")
class LSTMLayer(RecurrentLayer):
    """Caffe's LSTM: c_t = cont_t f c_{t-1} + i g, h_t = o tanh(c_t); blobs W_xc, b_c, W_hc."""

    param_blobs = ("W_xc (4H, D)", "b_c (4H,)", "W_xc_static (4H, S), with x_static",
                   "W_hc (4H, H)")
    template = "lstm"
    states = ("h", "c")
    output = "h"
    input_weight = "W_xc"

    def gate_width(self):
        return 4 * self.H

    def blob_specs(self, D, S):
        p, G, H = self.param.recurrent_param, 4 * self.H, self.H
        specs = [("W_xc", (G, D), p.weight_filler), ("b_c", (G,), p.bias_filler)]
        if S is not None:
            specs.append(("W_xc_static", (G, S), p.weight_filler))
        return specs + [("W_hc", (G, H), p.weight_filler)]


@register_layer("RNN")
class RNNLayer(RecurrentLayer):
    """Caffe's RNN: h_t = tanh(W_xh x_t + b_h + W_hh cont_t h_{t-1}), o_t = tanh(W_ho h_t + b_o)."""

    param_blobs = ("W_xh (H, D)", "b_h (H,)", "W_xh_static (H, S), with x_static", "W_hh (H, H)",
                   "W_ho (H, H)", "b_o (H,)")
    template = "rnn"
    states = ("h",)
    output = "o"
    input_weight = "W_xh"

    def gate_width(self):
        return self.H

    def blob_specs(self, D, S):
        p, H = self.param.recurrent_param, self.H
        specs = [("W_xh", (H, D), p.weight_filler), ("b_h", (H,), p.bias_filler)]
        if S is not None:
            specs.append(("W_xh_static", (H, S), p.weight_filler))
        return specs + [("W_hh", (H, H), p.weight_filler), ("W_ho", (H, H), p.weight_filler),
                        ("b_o", (H,), p.bias_filler)]

    def output_layers(self):
        ip = LayerParameter(name="W_ho_h", type="InnerProduct", bottom=["h"], top=["W_ho_h"])
        ip.param.add(name="W_ho")
        ip.param.add(name="b_o")
        ip.inner_product_param.num_output = self.H
        ip.inner_product_param.axis = 2
        return [ip, LayerParameter(name="o_neuron", type="TanH", bottom=["W_ho_h"], top=["o"])]


def _debug_info(layer: RecurrentLayer, net, direction: str) -> None:
    """Log the mean |value| of each hidden blob and param, as Caffe's debug_info does."""
    forward = direction == "Forward"
    rows = []
    for lp in net.net_param.layer if forward else reversed(net.net_param.layer):
        names = lp.top if forward else lp.bottom
        for name in names:
            blob = net.blobs[name]
            value = blob.data if forward else blob.diff
            rows.append(f"[{direction}] Layer {lp.name}, {'top' if forward else 'bottom'} blob "
                        f"{name} {'data' if forward else 'diff'}: {_mean_abs(value):.6g}")
    for k, (name, blob) in enumerate(zip(layer.blob_names, layer.blobs)):
        value = blob.data if forward else blob.diff
        rows.append(f"[{direction}] param blob {k} ({name}) {'data' if forward else 'diff'}: "
                    f"{_mean_abs(value):.6g}")
    log.info("layer '%s' (%s), hidden net:\n  %s", layer.name, layer.type, "\n  ".join(rows))


def _mean_abs(array) -> float:
    return float(abs(array).mean()) if array.size else 0.0
