"""Tile (Caffe's TileLayer): copies of the bottom side by side along one axis."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError, testing
from unroll.engine.backend import to_numpy
from unroll.testing import run_layer as run


@given(shape=testing.shapes(min_dims=1, max_dims=3, max_side=3), tiles=st.integers(1, 3),
       data=st.data())
def test_tile_gradient(shape, tiles, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    testing.check_layer_gradient(f'type: "Tile" tile_param {{ axis: {axis} tiles: {tiles} }}',
                                 [data.draw(testing.arrays(shape))])


def test_tile_puts_whole_copies_side_by_side(xp):
    x = np.arange(6.0).reshape(1, 2, 3)
    _, _, (y,) = run('type: "Tile" tile_param { tiles: 2 }', [x], xp)  # Caffe's axis 1
    np.testing.assert_array_equal(to_numpy(y.data), np.concatenate([x, x], axis=1))
    _, _, (y,) = run('type: "Tile" tile_param { axis: -1 tiles: 3 }', [x], xp)
    np.testing.assert_array_equal(to_numpy(y.data), np.tile(x, (1, 1, 3)))


@pytest.mark.parametrize("tiles", [0, -2])
def test_tiles_must_be_positive(tiles):
    with pytest.raises(NetError, match=rf"layer 't' \(Tile\): tile_param.tiles must be a "
                                       rf"positive number of copies, found {tiles}"):
        run(f'name: "t" type: "Tile" tile_param {{ tiles: {tiles} }}', [np.ones((2, 3))])
