"""Scatter: rows placed at given positions of a zero-filled top (the inverse of a gather).

A tagger's character model reads only a batch's real words, packed as W rows;
Scatter puts each word's vector back at its cell of the (T, N) word grid,
with zeros at the padding cells, so the per-word layers after it see the grid.
"""

from __future__ import annotations

import numpy as np

from unroll.layer import Layer, register_layer


@register_layer("Scatter")
class ScatterLayer(Layer):
    """y.reshape(-1, D)[i[k]] = x.reshape(-1, D)[k], zeros elsewhere; y is like.shape + (D,).

    Bottoms: ``x`` (..., D) holding K rows of its last axis D, ``i`` the K
    row positions (any shape; distinct integers in [0, like.count)), and
    ``like``, whose shape (not values) is the top's leading shape. Backward
    gathers: x.diff[k] = y.diff[i[k]]. Neither ``i`` nor ``like`` has a gradient.

    >>> from unroll.testing import run_layer
    >>> x, i, like = np.array([[1.0, 2], [3, 4]]), np.array([2.0, 0]), np.zeros((2, 2))
    >>> run_layer('type: "Scatter"', [x, i, like])[2][0].data.tolist()
    [[[3.0, 4.0], [0.0, 0.0]], [[1.0, 2.0], [0.0, 0.0]]]
    """

    num_bottoms = (3, 3)
    # backward reads the positions saved in forward, never a bottom itself
    backward_reads = ()

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def reshape(self, bottoms, tops):
        x, i, like = bottoms
        if not x.shape or x.shape[-1] == 0:
            raise self.error(f"bottom '{x.name}' {x.shape} needs a last axis (the row size D)")
        self.rows = x.shape[-1]
        if x.count != i.count * self.rows:
            raise self.error(
                f"bottom '{x.name}' {x.shape} holds {x.count // self.rows} rows of "
                f"{self.rows}, but '{i.name}' {i.shape} gives {i.count} positions"
            )
        self.cells = like.count
        tops[0].reshape(like.shape + (self.rows,))
        self.index = self.xp.zeros(i.count, self.xp.intp)

    def forward(self, bottoms, tops):
        xp, (x, i, like) = self.xp, bottoms
        at = i.data.reshape(-1)
        bad = ~((at >= 0) & (at < self.cells) & (at == xp.floor(at)))
        if bad.any():
            k = int(xp.argmax(bad))
            where = tuple(int(n) for n in np.unravel_index(k, i.shape))
            raise self.error(
                f"bottom '{i.name}' holds {float(at[k])!r} at index {where}; expected an "
                f"integer in [0, {self.cells}) (a cell of '{like.name}' {like.shape})"
            )
        xp.copyto(self.index, at, casting="unsafe")
        ordered = xp.sort(self.index)
        if bool((ordered[1:] == ordered[:-1]).any()):
            repeated = int(ordered[1:][ordered[1:] == ordered[:-1]][0])
            raise self.error(f"bottom '{i.name}' names cell {repeated} more than once; each "
                             f"row needs a cell of its own")
        y = tops[0].data.reshape(self.cells, self.rows)
        y.fill(0)
        y[self.index] = x.data.reshape(-1, self.rows)

    def backward(self, tops, propagate_down, bottoms):
        x, i, like = bottoms
        gy = tops[0].diff.reshape(self.cells, self.rows)
        if propagate_down[0]:
            x.diff[...] = self.xp.take(gy, self.index, axis=0).reshape(x.shape)
        # positions are piecewise constant and ``like`` gives only a shape: zero gradients
        for down, blob in zip(propagate_down[1:], (i, like)):
            if down:
                blob.diff[...] = 0
