"""Scatter: rows placed at given positions of a zero-filled top (the inverse of a gather).

A tagger's character model reads only a batch's real words, packed several
to a column; Scatter takes each word's output at its last character to the
word's cell of the (T, N) word grid, zeros at padding cells, and drops the
outputs at every other character.
"""

from __future__ import annotations

import numpy as np

from unroll.engine.layer import Layer, register_layer


@register_layer("Scatter")
class ScatterLayer(Layer):
    """y.reshape(-1, D)[i[k]] = x.reshape(-1, D)[k], zeros elsewhere; y is like.shape + (D,).

    Bottoms: ``x`` (..., D) holding K rows of its last axis D, ``i`` the K
    row positions (any shape; distinct integers in [0, like.count), or -1 to
    drop the row), and ``like``, whose shape (not values) is the top's
    leading shape. Backward gathers: x.diff[k] = y.diff[i[k]] (0 for a
    dropped row). Neither ``i`` nor ``like`` has a gradient. The positions are
    checked on the host, where they enter the net (:meth:`check_host_bottom`,
    called by ``Net.set_input``), so a device's forward reads nothing back;
    forward checks them again only on the CPU.

    >>> from unroll.testing import run_layer
    >>> x, i, like = np.array([[1.0, 2], [3, 4], [5, 6]]), np.array([2.0, -1, 0]), np.zeros((2, 2))
    >>> run_layer('type: "Scatter"', [x, i, like])[2][0].data.tolist()
    [[[5.0, 6.0], [0.0, 0.0]], [[1.0, 2.0], [0.0, 0.0]]]
    """

    num_bottoms = (3, 3)
    # backward reads the positions saved in forward, never a bottom itself
    backward_reads = ()
    # the largest position the host check saw, for forward to test against the cells
    # (``like`` may take its new shape after the positions are checked)
    _checked_max: tuple | None = None

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    checks_host_bottoms = True

    def check_host_bottom(self, index: int, values: np.ndarray, name: str) -> None:
        """Raise a NetError unless host ``values`` (positions ``name``) are -1 or distinct
        whole numbers >= 0; forward then tests the largest against the cells of ``like``.

        >>> from unroll.testing import run_layer
        >>> put, _, _ = run_layer('name: "put" type: "Scatter"',
        ...                       [np.zeros((2, 1)), np.array([0.0, 1.0]), np.zeros(2)])
        >>> put.check_host_bottom(1, np.array([[1.0, 0.5]]), "at")
        Traceback (most recent call last):
        unroll.core.errors.NetError: layer 'put' (Scatter): bottom 'at' holds 0.5 at index (0, 1); \
expected -1 or a whole number >= 0 (a cell of 'bottom2')
        """
        if index != 1:
            return
        at = values.reshape(-1)
        k = first_non_index(at)
        if k is not None:
            raise self.error(f"bottom '{name}' holds {float(at[k])!r} at index "
                             f"{_where(k, values.shape)}; expected -1 or a whole number >= 0 "
                             f"(a cell of '{self.like_name}')")
        cells = np.sort(at[at >= 0])
        twice = cells[1:][cells[1:] == cells[:-1]]
        if twice.size:
            raise self.error(f"bottom '{name}' names cell {int(twice[0])} more than once; "
                             f"each row needs a cell of its own")
        self._checked_max = None
        if at.size:
            k = int(np.argmax(at))
            self._checked_max = (float(at[k]), _where(k, values.shape), name)

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
        self.cells, self.like_name = like.count, like.name
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
        if xp is np:  # on a device the positions were checked on the host, where they entered
            self.check_host_bottom(1, i.data, i.name)
        self._check_largest(like)
        at = i.data.reshape(-1)
        # an unchecked position out of range (a device array given as is) is dropped, never
        # written outside the top: NaN fails both tests
        index, grid = self.scratch("index"), self.scratch("grid")
        xp.copyto(index, xp.where((at >= 0) & (at < self.cells), at, self.cells),
                  casting="unsafe")
        grid[...] = 0
        grid[index] = x.data.reshape(-1, self.rows)
        tops[0].data[...] = grid[: self.cells].reshape(tops[0].shape)

    def _check_largest(self, like):
        """The host check's largest position against the cells (read once: the next
        forward's positions may come unchecked, as a device array)."""
        checked, self._checked_max = self._checked_max, None
        if checked is not None and checked[0] >= self.cells:
            value, where, name = checked
            raise self.error(f"bottom '{name}' holds {value!r} at index {where}; expected -1 "
                             f"or an integer in [0, {self.cells}) (a cell of '{like.name}' "
                             f"{like.shape})")

    def backward(self, tops, propagate_down, bottoms):
        gather_backward(self, tops, propagate_down, bottoms, self.cells, self.rows)


def gather_backward(layer, tops, propagate_down, bottoms, count: int, width: int) -> None:
    """The backward of a layer that adds rows of ``x`` into ``count`` cells of ``width``
    by the indices it saved (scratch "index", the extra cell ``count`` for dropped rows):
    x's diff gathers the cells' diffs. The indices are piecewise constant and ``like``
    gives only a shape: their gradients are zero."""
    x, indices, like = bottoms
    if propagate_down[0]:
        grid = layer.scratch("grid_diff")
        grid[:count] = tops[0].diff.reshape(count, width)
        grid[count] = 0
        x.diff[...] = grid[layer.scratch("index")].reshape(x.shape)
    for down, blob in zip(propagate_down[1:], (indices, like)):
        if down:
            blob.diff[...] = 0


def first_non_index(at: np.ndarray) -> int | None:
    """The position of the first value of the flat ``at`` that is neither -1 (no row) nor a
    whole number >= 0; None when every value is one."""
    bad = ~((at >= -1) & (at == np.floor(at)))
    return int(np.argmax(bad)) if bad.any() else None


def _where(k: int, shape) -> tuple:
    """Flat index ``k`` as an index into ``shape``."""
    return tuple(int(n) for n in np.unravel_index(k, shape))
