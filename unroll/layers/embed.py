"""Embed: a lookup table indexed by integer-valued bottoms."""

from __future__ import annotations

import numpy as np

from unroll.layer import Layer, register_layer


@register_layer("Embed")
class EmbedLayer(Layer):
    """y[..., :] = W[x[...], :] + b; x any shape of indices in [0, input_dim), y x.shape + (D,)."""

    # backward reads the indices saved in forward, never the bottom itself
    backward_reads = ()

    def setup(self, bottoms, tops):
        p = self.param.embed_param
        self.num_output, self.input_dim, self.bias_term = p.num_output, p.input_dim, p.bias_term
        if self.num_output < 1 or self.input_dim < 1:
            raise self.error(
                f"embed_param needs num_output >= 1 and input_dim >= 1, found "
                f"num_output {p.num_output}, input_dim {p.input_dim}"
            )
        self.param_blob((self.input_dim, self.num_output), p.weight_filler)
        if self.bias_term:
            self.param_blob((self.num_output,), p.bias_filler)

    def allow_force_backward(self, bottom_index):
        return False

    def reshape(self, bottoms, tops):
        shape = bottoms[0].shape
        tops[0].reshape(shape + (self.num_output,))
        self.reserve("index", (bottoms[0].count,), self.xp.intp)

    def forward(self, bottoms, tops):
        xp, x = self.xp, bottoms[0].data.reshape(-1)
        bad = ~((x >= 0) & (x < self.input_dim) & (x == xp.floor(x)))
        if bad.any():
            i = int(xp.argmax(bad))
            at = tuple(int(k) for k in np.unravel_index(i, bottoms[0].shape))
            raise self.error(
                f"bottom '{bottoms[0].name}' holds {float(x[i])!r} at index {at}; "
                f"expected an integer in [0, {self.input_dim})"
            )
        index = self.scratch("index")
        xp.copyto(index, x, casting="unsafe")
        y = tops[0].data.reshape(-1, self.num_output)
        xp.take(self.blobs[0].data, index, axis=0, out=y)
        if self.bias_term:
            y += self.blobs[1].data

    def backward(self, tops, propagate_down, bottoms):
        xp, gy = self.xp, tops[0].diff.reshape(-1, self.num_output)
        # rows sorted by index, then one sum per distinct index: several times faster
        # than add.at when many rows repeat a few indices (characters, affixes)
        index = self.scratch("index")
        if index.size:
            order = xp.argsort(index, kind="stable")
            ids = index[order]
            starts = xp.flatnonzero(xp.concatenate((xp.ones(1, bool), ids[1:] != ids[:-1])))
            self.blobs[0].diff[ids[starts]] += xp.add.reduceat(gy[order], starts, axis=0)
        if self.bias_term:
            self.blobs[1].diff += gy.sum(axis=0)
        if propagate_down[0]:
            # indices are piecewise constant: their gradient is zero wherever it exists
            bottoms[0].diff[...] = 0
