"""Tile: ``tiles`` copies of the bottom side by side along ``axis`` (Caffe's TileLayer)."""

from __future__ import annotations

import math

from unroll.engine.layer import Layer, register_layer


@register_layer("Tile")
class TileLayer(Layer):
    """y = [x, x, ..., x] (``tiles`` copies) concatenated along ``axis``: shape x.shape with
    axis ``axis`` times ``tiles``.

    As Caffe's: ``tile_param { axis tiles }`` (axis 1 by default, tiles > 0 required);
    the backward sums the copies' diffs.

    >>> from unroll.testing import run_layer
    >>> import numpy as np
    >>> _, _, (y,) = run_layer('type: "Tile" tile_param { axis: 1 tiles: 2 }',
    ...                        [np.array([[1.0, 2.0]])])
    >>> y.data.tolist()
    [[1.0, 2.0, 1.0, 2.0]]
    """

    backward_reads = ()

    def layer_setup(self, bottoms, tops):
        tiles = self.param.tile_param.tiles
        if tiles < 1:
            raise self.error(f"tile_param.tiles must be a positive number of copies, "
                             f"found {tiles}")

    def reshape(self, bottoms, tops):
        shape = bottoms[0].shape
        axis = self.canonical_axis(self.param.tile_param.axis, len(shape))
        tiles = self.param.tile_param.tiles
        # Caffe's view: the block from axis on, repeated tiles times within each outer index
        self.view = (math.prod(shape[:axis]), 1, math.prod(shape[axis:]))
        self.tiled = (self.view[0], tiles, self.view[2])
        tops[0].reshape((*shape[:axis], shape[axis] * tiles, *shape[axis + 1:]))

    def forward(self, bottoms, tops):
        tops[0].data.reshape(self.tiled)[...] = bottoms[0].data.reshape(self.view)

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            bottoms[0].diff.reshape(self.view)[...] = \
                tops[0].diff.reshape(self.tiled).sum(axis=1, keepdims=True)
