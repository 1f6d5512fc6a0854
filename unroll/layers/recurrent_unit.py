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

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def setup(self, bottoms, tops):
        self.acts = self.tanh_c = None

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
        if self.acts is None or self.acts.shape != x.shape:
            self.acts = self.xp.zeros(x.shape, self.dtype)
            self.tanh_c = self.xp.zeros(c_prev.shape, self.dtype)

    def gates(self):
        H, a = self.H, self.acts
        return a[..., :H], a[..., H:2 * H], a[..., 2 * H:3 * H], a[..., 3 * H:]

    def forward(self, bottoms, tops):
        xp, H3, a = self.xp, 3 * self.H, self.acts
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
        xp.tanh(c, out=self.tanh_c)
        xp.multiply(o, self.tanh_c, out=h)

    def backward(self, tops, propagate_down, bottoms):
        if not (propagate_down[0] or propagate_down[1]):
            return
        c_prev, cont = bottoms[0].data, bottoms[2].data[..., None]
        dc, dh, tanh_c = tops[0].diff, tops[1].diff, self.tanh_c
        i, f, o, g = self.gates()
        dct = dc + dh * o * (1 - tanh_c * tanh_c)  # total gradient reaching c
        if propagate_down[0]:
            self.xp.multiply(dct * f, cont, out=bottoms[0].diff)
        if propagate_down[1]:
            H, gx = self.H, bottoms[1].diff
            self.xp.multiply(dct * g, i * (1 - i), out=gx[..., :H])
            self.xp.multiply(dct * cont * c_prev, f * (1 - f), out=gx[..., H:2 * H])
            self.xp.multiply(dh * tanh_c, o * (1 - o), out=gx[..., 2 * H:3 * H])
            self.xp.multiply(dct * i, 1 - g * g, out=gx[..., 3 * H:])
