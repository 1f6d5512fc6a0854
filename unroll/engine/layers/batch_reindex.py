"""BatchReindex: rows of a bottom picked by index along axis 0 (Caffe's BatchReindexLayer)."""

from __future__ import annotations

import numpy as np

from unroll.engine.layer import Layer, register_layer
from unroll.engine.layers.embed import scatter_add_rows, sorted_add_rows


@register_layer("BatchReindex")
class BatchReindexLayer(Layer):
    """y[m] = x[idx[m]] along axis 0; x (K, ...), idx (M,) -> y (M, ...).

    Backward adds each top row's gradient into the row it was picked from
    (a row picked twice gets both, one never picked gets 0); the indices
    have no gradient. As in Caffe, idx is 1-D and holds whole numbers in
    [0, K), checked on the host where they enter the net.

    >>> from unroll.testing import run_layer
    >>> x, idx = np.array([[1.0, 2], [3, 4]]), np.array([1.0, 1, 0])
    >>> run_layer('type: "BatchReindex"', [x, idx])[2][0].data.tolist()
    [[3.0, 4.0], [3.0, 4.0], [1.0, 2.0]]
    """

    num_bottoms = (2, 2)
    # backward reads the indices (bottom 1), never the rows
    backward_reads = ("bottom",)
    backward_reads_bottoms = (1,)
    checks_host_bottoms = True

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def check_host_bottom(self, index: int, values: np.ndarray, name: str) -> None:
        """Raise a NetError unless host ``values`` (indices ``name``) are whole numbers in
        [0, K), K the rows of bottom 0.

        >>> from unroll.testing import run_layer
        >>> pick, _, _ = run_layer('name: "pick" type: "BatchReindex"',
        ...                        [np.zeros((2, 1)), np.array([0.0])])
        >>> pick.check_host_bottom(1, np.array([2.0]), "idx")
        Traceback (most recent call last):
        unroll.core.errors.NetError: layer 'pick' (BatchReindex): bottom 'idx' holds 2.0 at \
index 0; expected an integer in [0, 2)
        """
        if index != 1:
            return
        at = values.reshape(-1)
        bad = ~((at >= 0) & (at < self.rows) & (at == np.floor(at)))
        if bad.any():
            k = int(np.argmax(bad))
            raise self.error(f"bottom '{name}' holds {float(at[k])!r} at index {k}; expected an "
                             f"integer in [0, {self.rows})")

    def reshape(self, bottoms, tops):
        x, idx = bottoms
        if x.ndim < 1 or idx.ndim != 1:
            raise self.error(f"bottoms '{x.name}' {x.shape} and '{idx.name}' {idx.shape}: "
                             f"expected rows (K, ...) and indices (M,)")
        self.rows = x.shape[0]
        tops[0].reshape(idx.shape + x.shape[1:])
        self.reserve("index", idx.shape, self.xp.intp)

    def forward(self, bottoms, tops):
        xp, (x, idx) = self.xp, bottoms
        if xp is np:  # on a device the indices were checked on the host, where they entered
            self.check_host_bottom(1, idx.data, idx.name)
        index = self.scratch("index")
        xp.copyto(index, idx.data, casting="unsafe")
        xp.take(x.data, index, axis=0, out=tops[0].data)

    def backward(self, tops, propagate_down, bottoms):
        x, idx = bottoms
        if propagate_down[0]:
            index, gy = self.scratch("index"), tops[0].diff
            # summed in a table of their own: x.diff may be a view that reshape would copy
            gx = self.xp.zeros((self.rows, x.count // max(self.rows, 1)), x.diff.dtype)
            if index.size:
                add_rows = sorted_add_rows if self.xp is np else scatter_add_rows
                add_rows(self.xp, gx, index, gy.reshape(index.size, -1))
            x.diff[...] = gx.reshape(x.shape)
        if propagate_down[1]:
            idx.diff[...] = 0
