"""Embed: a lookup table indexed by integer-valued bottoms."""

from __future__ import annotations

import numpy as np

from unroll.engine.layer import Layer, register_layer


@register_layer("Embed")
class EmbedLayer(Layer):
    """y[..., :] = W[x[...], :] + b; x any shape of indices in [0, input_dim), y x.shape + (D,).

    The indices are checked on the host, where they enter the net
    (:meth:`check_host_bottom`, called by ``Net.set_input``); forward checks
    them again only on the CPU, where that costs no wait for a device.
    """

    param_blobs = ("weight (input_dim, num_output)", "bias (num_output,), with bias_term")
    # backward reads the indices saved in forward, never the bottom itself
    backward_reads = ()

    def layer_setup(self, bottoms, tops):
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

    checks_host_bottoms = True

    def check_host_bottom(self, index: int, values: np.ndarray, name: str) -> None:
        """Raise a NetError unless host ``values`` (bottom ``name``) are ids in [0, input_dim).

        >>> from unroll.testing import run_layer
        >>> embed, _, _ = run_layer('name: "e" type: "Embed" embed_param { num_output: 2 '
        ...                         'input_dim: 3 }', [np.zeros(2)])
        >>> embed.check_host_bottom(0, np.array([[0.0, 3.0]]), "ids")
        Traceback (most recent call last):
        unroll.core.errors.NetError: layer 'e' (Embed): bottom 'ids' holds 3.0 at index (0, 1); \
expected an integer in [0, 3)
        """
        x = values.reshape(-1)
        bad = ~((x >= 0) & (x < self.input_dim) & (x == np.floor(x)))
        if bad.any():
            i = int(np.argmax(bad))
            at = tuple(int(k) for k in np.unravel_index(i, values.shape))
            raise self.error(
                f"bottom '{name}' holds {float(x[i])!r} at index {at}; "
                f"expected an integer in [0, {self.input_dim})"
            )

    def reshape(self, bottoms, tops):
        shape = bottoms[0].shape
        tops[0].reshape(shape + (self.num_output,))
        self.reserve("index", (bottoms[0].count,), self.xp.intp)

    def forward(self, bottoms, tops):
        xp, x = self.xp, bottoms[0].data
        if xp is np:
            self.check_host_bottom(0, x, bottoms[0].name)
        index = self.scratch("index")
        xp.copyto(index, x.reshape(-1), casting="unsafe")
        y = tops[0].data.reshape(-1, self.num_output)
        xp.take(self.blobs[0].data, index, axis=0, out=y)
        if self.bias_term:
            y += self.blobs[1].data

    def backward(self, tops, propagate_down, bottoms):
        gy = tops[0].diff.reshape(-1, self.num_output)
        index = self.scratch("index")
        if index.size:
            add_rows = sorted_add_rows if self.xp is np else scatter_add_rows
            add_rows(self.xp, self.blobs[0].diff, index, gy)
        if self.bias_term:
            self.blobs[1].diff += gy.sum(axis=0)
        if propagate_down[0]:
            # indices are piecewise constant: their gradient is zero wherever it exists
            bottoms[0].diff[...] = 0


def sorted_add_rows(xp, table, index, rows) -> None:
    """``table[index[i]] += rows[i]`` for every i, repeats adding up: the CPU's way.

    Rows sorted by index, then one sum per distinct index: several times faster
    than ``add.at`` when many rows repeat a few indices (characters, affixes).
    The distinct indices make a data-dependent shape, which a device would have
    to read back: devices use :func:`scatter_add_rows`, its twin.

    >>> table = np.zeros((3, 1))
    >>> sorted_add_rows(np, table, np.array([2, 0, 2]), np.array([[1.0], [2.0], [4.0]]))
    >>> table.ravel().tolist()
    [2.0, 0.0, 5.0]
    """
    order = xp.argsort(index, kind="stable")
    ids = index[order]
    starts = xp.flatnonzero(xp.concatenate((xp.ones(1, bool), ids[1:] != ids[:-1])))
    table[ids[starts]] += xp.add.reduceat(rows[order], starts, axis=0)


def scatter_add_rows(xp, table, index, rows) -> None:
    """:func:`sorted_add_rows` as one scatter-add kernel (``add.at``): no shape depends on
    the data, so a device never waits for the host (CuPy's ``add.at``, atomic adds).

    >>> table = np.zeros((3, 1))
    >>> scatter_add_rows(np, table, np.array([2, 0, 2]), np.array([[1.0], [2.0], [4.0]]))
    >>> table.ravel().tolist()
    [2.0, 0.0, 5.0]
    """
    xp.add.at(table, index, rows)
