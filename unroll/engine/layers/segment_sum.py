"""SegmentSum: rows of a bottom added up by segment (each tree node's children, summed).

The tree unroller's child sum (``docs/design.md``, "Unrolling over trees"):
level l of a bottom-up tree net adds the messages of every row below it into
its parent's slot. The segment ids are an input, like cont, so the net's
shape depends only on the level widths, not on which node has which children.
"""

from __future__ import annotations

import numpy as np

from unroll.engine.layer import Layer, register_layer
from unroll.engine.layers.embed import scatter_add_rows, sorted_add_rows
from unroll.engine.layers.scatter import first_non_index, gather_backward


@register_layer("SegmentSum")
class SegmentSumLayer(Layer):
    """y[s] = sum of x[p] over the rows p with seg[p] == s; x (P, ...), seg (P,), like (S, ...).

    The top is (S,) + x.shape[1:], S the rows of ``like`` (whose values are
    not read). A segment no row names is 0; a row with seg -1 is dropped.
    Backward gathers: x.diff[p] = y.diff[seg[p]] (0 for a dropped row);
    neither ``seg`` nor ``like`` has a gradient. The ids are checked on the
    host, where they enter the net.

    >>> from unroll.testing import run_layer
    >>> x, seg = np.array([[1.0, 2], [3, 4], [5, 6]]), np.array([1.0, -1, 1])
    >>> run_layer('type: "SegmentSum"', [x, seg, np.zeros((2, 1))])[2][0].data.tolist()
    [[0.0, 0.0], [6.0, 8.0]]
    """

    num_bottoms = (3, 3)
    # backward reads the ids saved in forward, never a bottom
    backward_reads = ()
    checks_host_bottoms = True
    # the largest id the host check saw: ``like`` may take its shape after the check
    _checked_max: tuple | None = None

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def check_host_bottom(self, index: int, values: np.ndarray, name: str) -> None:
        """Raise a NetError unless host ``values`` (ids ``name``) are -1 or whole numbers >= 0;
        forward then tests the largest against the rows of ``like``.

        >>> from unroll.testing import run_layer
        >>> add, _, _ = run_layer('name: "add" type: "SegmentSum"',
        ...                       [np.zeros((1, 1)), np.array([0.0]), np.zeros(1)])
        >>> add.check_host_bottom(1, np.array([0.5]), "seg")
        Traceback (most recent call last):
        unroll.core.errors.NetError: layer 'add' (SegmentSum): bottom 'seg' holds 0.5 at index 0; \
expected -1 or a segment (a row of 'bottom2')
        """
        if index != 1:
            return
        at = values.reshape(-1)
        k = first_non_index(at)
        if k is not None:
            raise self.error(f"bottom '{name}' holds {float(at[k])!r} at index {k}; expected -1 "
                             f"or a segment (a row of '{self.like_name}')")
        self._checked_max = None
        if at.size:
            k = int(np.argmax(at))
            self._checked_max = (float(at[k]), k, name)

    def reshape(self, bottoms, tops):
        x, seg, like = bottoms
        if x.ndim < 1 or seg.ndim != 1 or seg.shape[0] != x.shape[0] or like.ndim < 1:
            raise self.error(f"bottoms '{x.name}' {x.shape}, '{seg.name}' {seg.shape} and "
                             f"'{like.name}' {like.shape}: expected rows (P, ...), one segment "
                             f"id per row (P,) and the segments' rows (S, ...)")
        self.segments, self.like_name = like.shape[0], like.name
        self.width = int(np.prod(x.shape[1:], dtype=np.int64))
        tops[0].reshape((self.segments,) + x.shape[1:])
        # one spare segment past the real ones takes the dropped rows: no data-dependent shape
        self.reserve("index", seg.shape, self.xp.intp)
        self.reserve("grid", (self.segments + 1, self.width), x.dtype, lives="forward")
        self.reserve("grid_diff", (self.segments + 1, self.width), x.dtype, lives="backward")

    def forward(self, bottoms, tops):
        xp, (x, seg, like) = self.xp, bottoms
        if xp is np:  # on a device the ids were checked on the host, where they entered
            self.check_host_bottom(1, seg.data, seg.name)
        checked, self._checked_max = self._checked_max, None
        if checked is not None and checked[0] >= self.segments:
            value, k, name = checked
            raise self.error(f"bottom '{name}' holds {value!r} at index {k}; expected -1 or a "
                             f"segment in [0, {self.segments}) (a row of '{like.name}' "
                             f"{like.shape})")
        at = seg.data
        index, grid = self.scratch("index"), self.scratch("grid")
        # an unchecked id out of range (a device array given as is) goes to the spare segment
        xp.copyto(index, xp.where((at >= 0) & (at < self.segments), at, self.segments),
                  casting="unsafe")
        grid[...] = 0
        if index.size:
            add_rows = sorted_add_rows if xp is np else scatter_add_rows
            add_rows(xp, grid, index, x.data.reshape(index.size, self.width))
        tops[0].data[...] = grid[: self.segments].reshape(tops[0].shape)

    def backward(self, tops, propagate_down, bottoms):
        gather_backward(self, tops, propagate_down, bottoms, self.segments, self.width)
