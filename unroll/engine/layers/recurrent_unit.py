"""The gate non-linearities of one recurrent step: LSTMUnit (Caffe's) and GRUUnit.

Each unit runs as one fused kernel (numba on the CPU, CuPy on the GPU; see
``unroll.engine.kernels``) or as its ``xp`` reference, which the tests hold the
kernels to. The ``engine`` attribute, set from ``$UNROLL_ENGINE`` (default
"fused"), picks one; the reference also runs when a blob is not C-contiguous.
Nothing is saved between forward and backward: backward recomputes the gates
from its bottoms, which in a fused kernel costs no more than writing them out
and reading them back, and keeps no per-step memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from unroll.engine.kernels import default_engine, fused_kernels
from unroll.engine.layer import Layer, register_layer


class Kernels(NamedTuple):
    """A unit's forward and backward functions (fused kernels, or its reference)."""

    forward: Callable
    backward: Callable


class RecurrentUnit(Layer):
    """Bottoms: a state (..., H), projections (..., gates * H) and cont (...); tops of the
    state's shape. Forward calls ``<kernel>_forward(*bottoms, *tops)`` (data) of the kernel
    module for the device, or ``reference_forward`` with the same arrays; backward calls
    ``<kernel>_backward`` or ``reference_backward`` with the bottoms' data, the tops' diffs
    and the diffs of the bottoms but cont (None where not propagated)."""

    #: the kernels' name in ``unroll.engine.kernels``
    kernel = ""
    #: the bottoms' names in messages: state, projections, cont
    roles: tuple = ()
    #: width of each projection bottom, in units of H
    gates = 1
    #: the reference's working arrays: name -> width in units of H
    buffers: dict = {}

    def allow_force_backward(self, bottom_index):
        return bottom_index != self.num_bottoms[0] - 1  # cont, the last bottom

    def layer_setup(self, bottoms, tops):
        try:
            self.engine = default_engine()
        except ValueError as e:
            raise self.error(str(e)) from None
        self.working = {}
        self.found_kernels = None

    @property
    def kernels(self) -> Kernels:
        """The unit's fused forward and backward for its device, looked up on its first run:
        numba's import takes a third of a second, which a net built only to be planned
        (``unroll memory``) never needs. A device without kernels switches the unit to the
        reference, whose functions take the same arrays.

        >>> from unroll.testing import run_layer
        >>> import numpy as np
        >>> lstm, _, _ = run_layer('type: "LSTMUnit"', [np.zeros((1, 2)), np.zeros((1, 8)),
        ...                                             np.ones(1)], n_tops=2)
        >>> lstm.kernels.forward.__name__, lstm.kernels.backward.__name__
        ('lstm_unit_forward', 'lstm_unit_backward')
        """
        if self.found_kernels is None:  # stored by name, so the class keys stay shared
            module = fused_kernels(self.xp)
            if module is None:
                self.engine = "reference"
                self.found_kernels = Kernels(self.reference_forward, self.reference_backward)
            else:
                self.found_kernels = Kernels(getattr(module, f"{self.kernel}_forward"),
                                             getattr(module, f"{self.kernel}_backward"))
        return self.found_kernels

    def reshape(self, bottoms, tops):
        state, *projections, cont = bottoms
        lead, hidden = state.shape[:-1], state.shape[-1:]
        if (not hidden or cont.shape != lead
                or any(p.shape != (*lead, self.gates * hidden[0]) for p in projections)):
            found = ", ".join(f"{r} '{b.name}' {b.shape}" for r, b in zip(self.roles, bottoms))
            want = ["(..., H)"] + [f"(..., {self.gates}H)"] * len(projections) + ["(...)"]
            raise self.error(f"bottoms {found}: expected {', '.join(want)}")
        self.H = hidden[0]
        for top in tops:
            top.reshape(state.shape)

    def reference_buffers(self, lead) -> dict:
        """The reference's working arrays (``buffers``) for states of lead shape ``lead``,
        allocated here only, on the reference's first run at that shape."""
        shapes = {name: (*lead, width * self.H) for name, width in self.buffers.items()}
        if {name: a.shape for name, a in self.working.items()} != shapes:
            self.working = {name: self.xp.zeros(s, self.dtype) for name, s in shapes.items()}
        return self.working

    def forward(self, bottoms, tops):
        arrays = [b.data for b in bottoms] + [t.data for t in tops]
        if self.fusable(arrays):
            self.kernels.forward(*arrays)
        else:
            self.reference_forward(*arrays)

    def backward(self, tops, propagate_down, bottoms):
        # cont, the last bottom, has no diff
        diffs = [b.diff if down else None for b, down in zip(bottoms[:-1], propagate_down)]
        written = [d for d in diffs if d is not None]
        if not written:
            return
        arrays = [b.data for b in bottoms] + [t.diff for t in tops]
        if self.fusable(arrays + written):
            self.kernels.backward(*arrays, *diffs)
        else:
            self.reference_backward(*arrays, *diffs)

    def fusable(self, arrays) -> bool:
        """Whether the fused kernels run: engine "fused" and every array C-contiguous."""
        if self.engine != "fused":
            return False
        for a in arrays:
            if not a.flags.c_contiguous:
                return False
        return True

    def split(self, gates):
        """The per-gate views (..., H) of a (..., gates * H) array."""
        H = self.H
        return [gates[..., k * H:(k + 1) * H] for k in range(self.gates)]

    def sigmoid(self, v, out):
        """The logistic as 0.5 tanh(v / 2) + 0.5: free of overflow (the kernels' form too)."""
        self.xp.multiply(v, 0.5, out=out)
        self.xp.tanh(out, out=out)
        out *= 0.5
        out += 0.5


@register_layer("LSTMUnit")
class LSTMUnitLayer(RecurrentUnit):
    """c = cont*f*c_prev + i*g, h = o*tanh(c); [i f o g] = [sig sig sig tanh](x).

    Bottoms c_prev (..., H), x (..., 4H) (gates i, f, o, g), cont (...) (Caffe: (1, N, H),
    (1, N, 4H), (1, N)); tops c, h (..., H).
    """

    num_bottoms = (3, 3)
    num_tops = (2, 2)
    # backward recomputes the gates from c_prev, x and cont
    backward_reads = ("bottom",)
    kernel = "lstm_unit"
    roles = ("c_prev", "x", "cont")
    gates = 4
    buffers = {"acts": 4, "tanh_c": 1, "c": 1, "h": 1, "dc_total": 1}

    def reference_forward(self, c_prev, x, cont, c, h):
        """c and h by ``xp`` operations; returns the gates and tanh(c) (working arrays)."""
        xp, H3 = self.xp, 3 * self.H
        work = self.reference_buffers(c_prev.shape[:-1])
        a, tanh_c = work["acts"], work["tanh_c"]
        self.sigmoid(x[..., :H3], a[..., :H3])
        xp.tanh(x[..., H3:], out=a[..., H3:])
        i, f, o, g = self.split(a)
        xp.multiply(f, c_prev, out=c)
        c *= cont[..., None]
        xp.multiply(i, g, out=h)
        c += h
        xp.tanh(c, out=tanh_c)
        xp.multiply(o, tanh_c, out=h)
        return a, tanh_c

    def reference_backward(self, c_prev, x, cont, dc, dh, dc_prev, dx):
        # every product below writes into a working array or the bottom diff
        xp, H, work = self.xp, self.H, self.reference_buffers(c_prev.shape[:-1])
        a, tanh_c = self.reference_forward(c_prev, x, cont, work["c"], work["h"])
        i, f, o, g = self.split(a)
        cont, dct = cont[..., None], work["dc_total"]
        # dc + dh * o * (1 - tanh(c)^2): all the gradient reaching c
        xp.multiply(tanh_c, tanh_c, out=dct)
        xp.subtract(1, dct, out=dct)
        dct *= o
        dct *= dh
        dct += dc
        if dc_prev is not None:
            xp.multiply(dct, f, out=dc_prev)
            dc_prev *= cont
        if dx is not None:
            sig, gi, gf, go, gg = dx[..., :3 * H], *self.split(dx)
            xp.subtract(1, a[..., :3 * H], out=sig)  # sigmoid' = s (1 - s)
            sig *= a[..., :3 * H]
            gi *= dct
            gi *= g
            gf *= dct
            gf *= c_prev
            gf *= cont
            go *= dh
            go *= tanh_c
            xp.multiply(g, g, out=gg)  # tanh' = 1 - g^2
            xp.subtract(1, gg, out=gg)
            gg *= dct
            gg *= i


@register_layer("GRUUnit")
class GRUUnitLayer(RecurrentUnit):
    """h = n + z (h' - n), h' = cont h_prev; r, z = sig(x_rz + hh_rz), n = tanh(x_n + r hh_n).

    Caffe has no GRU; this is the GRU of cuDNN and PyTorch (the reset gate scales the
    recurrent projection, bias included). Bottoms h_prev (..., H), x (..., 3H) (the input
    projection W_x x + b_x; gates r, z, n), hh (..., 3H) (the recurrent projection
    W_h h' + b_h), cont (...); top h (..., H). As in a net (the ``gru`` template)::

        layer { type: "GRUUnit" bottom: "h_0" bottom: "x_1" bottom: "hh_1" bottom: "cont_1"
                top: "h_1" }
    """

    num_bottoms = (4, 4)
    num_tops = (1, 1)
    # backward recomputes the gates from h_prev, x, hh and cont
    backward_reads = ("bottom",)
    kernel = "gru_unit"
    roles = ("h_prev", "x", "hh", "cont")
    gates = 3
    buffers = {"acts": 3, "h": 1}

    def reference_forward(self, h_prev, x, hh, cont, h):
        """h by ``xp`` operations; returns the gates [r z n] (a working array)."""
        xp, H2 = self.xp, 2 * self.H
        a = self.reference_buffers(h_prev.shape[:-1])["acts"]
        rz, n = a[..., :H2], a[..., H2:]
        xp.add(x[..., :H2], hh[..., :H2], out=rz)
        self.sigmoid(rz, rz)
        r, z, _ = self.split(a)
        xp.multiply(r, hh[..., H2:], out=n)
        n += x[..., H2:]
        xp.tanh(n, out=n)
        xp.multiply(h_prev, cont[..., None], out=h)
        h -= n
        h *= z
        h += n
        return a

    def reference_backward(self, h_prev, x, hh, cont, dh, dh_prev, dx, dhh):
        H = self.H
        work = self.reference_buffers(h_prev.shape[:-1])
        r, z, n = self.split(self.reference_forward(h_prev, x, hh, cont, work["h"]))
        keep = cont[..., None]
        dn = dh * (1 - z) * (1 - n * n)
        dz = dh * (h_prev * keep - n) * z * (1 - z)
        dr = dn * hh[..., 2 * H:] * r * (1 - r)
        if dh_prev is not None:
            self.xp.multiply(dh * z, keep, out=dh_prev)
        for diff, dn_part in ((dx, dn), (dhh, dn * r)):
            if diff is not None:
                diff[..., :H], diff[..., H:2 * H], diff[..., 2 * H:] = dr, dz, dn_part
