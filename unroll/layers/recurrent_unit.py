"""LSTMUnit: Caffe's fused LSTM gate non-linearity for one timestep."""

from __future__ import annotations

from unroll.layer import Layer, register_layer


@register_layer("LSTMUnit")
class LSTMUnitLayer(Layer):
    """c = cont*f*c_prev + i*g, h = o*tanh(c); [i f o g] = [sig sig sig tanh](x).

    Bottoms c_prev (..., H), x (..., 4H) (gates i, f, o, g), cont (...) (Caffe: (1, N, H),
    (1, N, 4H), (1, N)); tops c, h (..., H).
    """

    num_bottoms = (3, 3)
    num_tops = (2, 2)
    # the gate activations and tanh(c) are saved by forward; backward reads c_prev and cont
    backward_reads = ("bottom",)
    backward_reads_bottoms = (0, 2)

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def reshape(self, bottoms, tops):
        c_prev, x, cont = bottoms
        lead, hidden = c_prev.shape[:-1], c_prev.shape[-1:]
        if not hidden or x.shape != (*lead, 4 * hidden[0]) or cont.shape != lead:
            raise self.error(
                f"bottoms c_prev '{c_prev.name}' {c_prev.shape}, x '{x.name}' {x.shape}, "
                f"cont '{cont.name}' {cont.shape}: expected (..., H), (..., 4H), (...)"
            )
        self.H = hidden[0]
        for top in tops:
            top.reshape(c_prev.shape)
        self.reserve("acts", x.shape)
        self.reserve("tanh_c", c_prev.shape)
        self.reserve("dc_total", c_prev.shape, lives="backward")

    def gates(self):
        H, a = self.H, self.scratch("acts")
        return a[..., :H], a[..., H:2 * H], a[..., 2 * H:3 * H], a[..., 3 * H:]

    def forward(self, bottoms, tops):
        xp, H3, a = self.xp, 3 * self.H, self.scratch("acts")
        c_prev, x, cont = (b.data for b in bottoms)
        c, h = tops[0].data, tops[1].data
        # sigmoid(v) = 0.5 * tanh(0.5 v) + 0.5, free of overflow
        xp.multiply(x[..., :H3], 0.5, out=a[..., :H3])
        xp.tanh(a[..., :H3], out=a[..., :H3])
        a[..., :H3] *= 0.5
        a[..., :H3] += 0.5
        xp.tanh(x[..., H3:], out=a[..., H3:])
        i, f, o, g = self.gates()
        xp.multiply(f, c_prev, out=c)
        c *= cont[..., None]
        xp.multiply(i, g, out=h)
        c += h
        tanh_c = self.scratch("tanh_c")
        xp.tanh(c, out=tanh_c)
        xp.multiply(o, tanh_c, out=h)

    def backward(self, tops, propagate_down, bottoms):
        if not (propagate_down[0] or propagate_down[1]):
            return
        # every product below writes into a saved buffer or the bottom diff: the
        # unit runs once per step, so temporaries would cost more than the math
        xp, H = self.xp, self.H
        c_prev, cont = bottoms[0].data, bottoms[2].data[..., None]
        dc, dh, tanh_c = tops[0].diff, tops[1].diff, self.scratch("tanh_c")
        i, f, o, g = self.gates()
        dct = self.scratch("dc_total")  # dc + dh * o * (1 - tanh(c)^2): all the gradient reaching c
        xp.multiply(tanh_c, tanh_c, out=dct)
        xp.subtract(1, dct, out=dct)
        dct *= o
        dct *= dh
        dct += dc
        if propagate_down[0]:
            xp.multiply(dct, f, out=bottoms[0].diff)
            bottoms[0].diff *= cont
        if propagate_down[1]:
            gx = bottoms[1].diff
            sig, gi, gf, go, gg = gx[..., :3 * H], *(gx[..., k * H:(k + 1) * H] for k in range(4))
            acts = self.scratch("acts")
            xp.subtract(1, acts[..., :3 * H], out=sig)  # sigmoid' = s (1 - s)
            sig *= acts[..., :3 * H]
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
