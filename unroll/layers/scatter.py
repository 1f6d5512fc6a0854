"""Scatter: rows placed at given positions of a zero-filled top (the inverse of a gather).

A tagger's character model reads only a batch's real words, packed several
to a column; Scatter takes each word's output at its last character to the
word's cell of the (T, N) word grid, zeros at padding cells, and drops the
outputs at every other character.
"""

from __future__ import annotations

import numpy as np

from unroll.layer import Layer, register_layer


@register_layer("Scatter")
class ScatterLayer(Layer):
    """y.reshape(-1, D)[i[k]] = x.reshape(-1, D)[k], zeros elsewhere; y is like.shape + (D,).

    Bottoms: ``x`` (..., D) holding K rows of its last axis D, ``i`` the K
    row positions (any shape; distinct integers in [0, like.count), or -1 to
    drop the row), and ``like``, whose shape (not values) is the top's
    leading shape. Backward gathers: x.diff[k] = y.diff[i[k]] (0 for a
    dropped row). Neither ``i`` nor ``like`` has a gradient.

    >>> from unroll.testing import run_layer
    >>> x, i, like = np.array([[1.0, 2], [3, 4], [5, 6]]), np.array([2.0, -1, 0]), np.zeros((2, 2))
    >>> run_layer('type: "Scatter"', [x, i, like])[2][0].data.tolist()
    [[[5.0, 6.0], [0.0, 0.0]], [[1.0, 2.0], [0.0, 0.0]]]
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
        # one spare row past the cells takes the dropped rows (forward) and gives them
        # zero gradients (backward): no data-dependent shapes, so no device sync. Scratch,
        # so a net's grid comes from its workspace; only the positions live until backward
        rows = (self.cells + 1, self.rows)
        self.reserve("grid", rows, x.dtype, lives="forward")
        self.reserve("grid_diff", rows, x.dtype, lives="backward")
        self.reserve("index", (i.count,), self.xp.intp)

    def forward(self, bottoms, tops):
        xp, (x, i, like) = self.xp, bottoms
        at = i.data.reshape(-1)
        bad = ~((at >= -1) & (at < self.cells) & (at == xp.floor(at)))
        index, grid = self.scratch("index"), self.scratch("grid")
        xp.copyto(index, xp.where(bad | (at < 0), self.cells, at), casting="unsafe")
        taken = xp.bincount(index, minlength=self.cells + 1)[: self.cells]
        if bool(bad.any() | (taken > 1).any()):  # one host read for both checks
            self._refuse(at, bad, taken, i, like)
        grid[...] = 0
        grid[index] = x.data.reshape(-1, self.rows)
        tops[0].data[...] = grid[: self.cells].reshape(tops[0].shape)

    def _refuse(self, at, bad, taken, i, like):
        if bad.any():
            k = int(self.xp.argmax(bad))
            where = tuple(int(n) for n in np.unravel_index(k, i.shape))
            raise self.error(
                f"bottom '{i.name}' holds {float(at[k])!r} at index {where}; expected -1 or "
                f"an integer in [0, {self.cells}) (a cell of '{like.name}' {like.shape})"
            )
        raise self.error(f"bottom '{i.name}' names cell {int(self.xp.argmax(taken))} more than "
                         f"once; each row needs a cell of its own")

    def backward(self, tops, propagate_down, bottoms):
        x, i, like = bottoms
        if propagate_down[0]:
            grid = self.scratch("grid_diff")
            grid[: self.cells] = tops[0].diff.reshape(self.cells, self.rows)
            grid[self.cells] = 0
            x.diff[...] = grid[self.scratch("index")].reshape(x.shape)
        # positions are piecewise constant and ``like`` gives only a shape: zero gradients
        for down, blob in zip(propagate_down[1:], (i, like)):
            if down:
                blob.diff[...] = 0
