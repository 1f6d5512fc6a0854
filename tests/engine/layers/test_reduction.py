"""Reduction (Caffe's ReductionLayer): every axis from ``axis`` on, as Caffe reduces."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError, testing
from unroll.engine.backend import to_numpy
from unroll.testing import run_layer as run

OPS = ["SUM", "ASUM", "SUMSQ", "MEAN"]


@given(shape=testing.shapes(min_dims=1, max_dims=4, max_side=3), op=st.sampled_from(OPS),
       data=st.data())
def test_reduction_gradient(shape, op, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = data.draw(testing.arrays(shape))
    if op == "ASUM":  # |x| has no derivative at 0: keep the differences away from it
        x = np.where(np.abs(x) < 0.05, 0.5, x)
    testing.check_layer_gradient(
        f'type: "Reduction" reduction_param {{ operation: {op} axis: {axis} coeff: -0.7 }}', [x])


def test_reduction_reduces_every_axis_from_axis_on_as_caffe(xp):
    x = np.arange(24.0).reshape(2, 3, 4) - 10
    for axis, shape in ((0, ()), (1, (2,)), (2, (2, 3)), (-1, (2, 3)), (-3, ())):
        _, _, (y,) = run(f'type: "Reduction" reduction_param {{ axis: {axis} }}', [x], xp)
        assert y.shape == shape
        np.testing.assert_allclose(to_numpy(y.data), x.reshape(*shape, -1).sum(-1))
    _, _, (y,) = run('type: "Reduction" reduction_param { operation: MEAN axis: 1 coeff: 2 }',
                     [x], xp)
    np.testing.assert_allclose(to_numpy(y.data), 2 * x.reshape(2, -1).mean(1))
    _, _, (y,) = run('type: "Reduction" reduction_param { operation: ASUM axis: 1 }', [x], xp)
    np.testing.assert_allclose(to_numpy(y.data), np.abs(x).reshape(2, -1).sum(1))


def test_reduction_defaults_are_caffes():
    _, _, (y,) = run('type: "Reduction"', [np.ones((2, 3))])
    assert y.shape == () and float(y.data) == 6.0  # SUM over every axis (axis 0), coeff 1


def test_an_axis_out_of_range_is_refused_naming_the_layer():
    with pytest.raises(NetError, match=r"layer 'r' \(Reduction\): axis 2 out of range for a "
                                       r"2-D bottom"):
        run('name: "r" type: "Reduction" reduction_param { axis: 2 }', [np.ones((2, 3))])
