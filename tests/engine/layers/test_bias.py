import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError, testing
from unroll.engine.backend import to_numpy
from unroll.testing import run_layer as run


@st.composite
def bias_cases(draw):
    """(bottom shape, axis, num_axes) with the bias fitting the bottom."""
    shape = draw(testing.shapes(min_dims=1, max_dims=4, max_side=3))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    start = axis % len(shape)
    num_axes = draw(st.integers(-1, len(shape) - start))
    return shape, axis, num_axes


def spec(axis, num_axes, filler='type: "uniform" min: -1 max: 1'):
    return (f'name: "b" type: "Bias" '
            f'bias_param {{ axis: {axis} num_axes: {num_axes} filler {{ {filler} }} }}')


@given(case=bias_cases(), data=st.data())
def test_learned_bias_gradient(case, data):
    shape, axis, num_axes = case
    testing.check_layer_gradient(spec(axis, num_axes), [data.draw(testing.arrays(shape))])


@given(case=bias_cases(), data=st.data())
def test_bias_from_a_second_bottom_gradient(case, data):
    shape, axis, num_axes = case
    start = axis % len(shape)
    end = len(shape) if num_axes == -1 else start + num_axes
    x = data.draw(testing.arrays(shape))
    b = data.draw(testing.arrays(shape[start:end]))
    layer = testing.check_layer_gradient(f'type: "Bias" bias_param {{ axis: {axis} }}', [x, b])
    assert layer.blobs == []


def test_bias_forward_broadcasts_over_the_other_axes(xp):
    x = np.arange(24.0).reshape(2, 3, 4)
    layer, _, (y,) = run(spec(1, 1, 'type: "constant" value: 0'), [x], xp)
    layer.blobs[0].data[...] = xp.asarray([10.0, 20.0, 30.0])
    layer.forward(_, [y])
    np.testing.assert_array_equal(to_numpy(y.data), x + np.array([10, 20, 30])[None, :, None])
    # Caffe's default: filler constant 0, axis 1, one axis
    default, _, (y0,) = run('type: "Bias"', [x], xp)
    assert default.blobs[0].shape == (3,)
    np.testing.assert_array_equal(to_numpy(y0.data), x)


def test_bias_in_place_keeps_the_gradient(xp):
    x = np.random.default_rng(0).normal(size=(2, 3))
    layer, (bottom,), (top,) = run(spec(0, -1), [x], xp, in_place=True)
    assert top is bottom
    gy = np.random.default_rng(1).normal(size=(2, 3))
    top.diff[...] = xp.asarray(gy)
    layer.blobs[0].diff[...] = 0
    layer.backward([top], [True], [bottom])
    np.testing.assert_allclose(to_numpy(bottom.diff), gy)
    np.testing.assert_allclose(to_numpy(layer.blobs[0].diff), gy)


def test_bias_that_does_not_fit_names_the_layer_and_shapes():
    with pytest.raises(NetError, match=r"layer 'b' \(Bias\).*2-D bias at axis 1.*\(2, 3\)"):
        run(spec(1, 2), [np.zeros((2, 3))])
    with pytest.raises(NetError, match="num_axes must be >= -1"):
        run(spec(0, -2), [np.zeros((2, 3))])
    with pytest.raises(NetError, match=r"has \(3,\) from axis 1; the bias has shape \(4,\)"):
        run('name: "b" type: "Bias"', [np.zeros((2, 3)), np.zeros(4)])
