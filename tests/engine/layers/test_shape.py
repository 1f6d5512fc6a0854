import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unroll import NetError
from unroll.engine.backend import to_numpy
from unroll.testing import arrays, check_layer_gradient, shapes
from unroll.testing import run_layer as run

with_xp = settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)




def check_reshaped(spec, x, expected, xp):
    """The layer of ``spec`` gives x's data in shape ``expected``, and its gradient checks."""
    _, _, tops = run(spec, [x], xp)
    assert tops[0].shape == expected
    np.testing.assert_array_equal(to_numpy(tops[0].data), x.reshape(expected))
    check_layer_gradient(spec, [x], xp=xp)


@st.composite
def reshape_cases(draw):
    """(bottom shape, reshape_param text, expected top shape)."""
    shape = draw(shapes(min_dims=1, max_dims=4, max_side=3))
    n = len(shape)
    axis = draw(st.integers(-(n + 1), n))
    start = axis if axis >= 0 else n + axis + 1
    num_axes = draw(st.integers(-1, n - start))
    end = n if num_axes == -1 else start + num_axes
    segment = list(shape[start:end])
    size = math.prod(segment)
    kind = draw(st.sampled_from(["same", "merge", "infer", "unit", "split"]))
    if kind == "same":  # the same dims, some written as 0 (copy) and at most one as -1
        dims, middle = list(segment), list(segment)
        for i in draw(st.sets(st.integers(0, len(dims) - 1))) if dims else []:
            dims[i] = 0
        if dims and draw(st.booleans()):
            dims[draw(st.integers(0, len(dims) - 1))] = -1
    elif kind == "merge":
        dims, middle = [size], [size]
    elif kind == "infer":
        dims, middle = [-1], [size]
    elif kind == "unit":
        dims, middle = [*segment, 1], [*segment, 1]
    else:
        dims, middle = [1, -1], [1, size]
    text = " ".join(f"dim: {d}" for d in dims)
    param = f"shape {{ {text} }} axis: {axis} num_axes: {num_axes}"
    return shape, param, (*shape[:start], *middle, *shape[end:])


@with_xp
@given(case=reshape_cases(), data=st.data())
def test_reshape_forward_and_gradient(xp, case, data):
    shape, param, expected = case
    check_reshaped(f'name: "r" type: "Reshape" reshape_param {{ {param} }}',
                   data.draw(arrays(shape)), expected, xp)


@st.composite
def flatten_cases(draw):
    shape = draw(shapes(min_dims=1, max_dims=4, max_side=3))
    n = len(shape)
    axis = draw(st.integers(-n, n - 1))
    start = axis % n
    end = draw(st.integers(start, n - 1))
    end_axis = end - n if draw(st.booleans()) else end
    expected = (*shape[:start], math.prod(shape[start:end + 1]), *shape[end + 1:])
    return shape, f"axis: {axis} end_axis: {end_axis}", expected


@with_xp
@given(case=flatten_cases(), data=st.data())
def test_flatten_forward_and_gradient(xp, case, data):
    shape, param, expected = case
    check_reshaped(f'name: "f" type: "Flatten" flatten_param {{ {param} }}',
                   data.draw(arrays(shape)), expected, xp)


def test_flatten_default_keeps_the_first_axis():
    _, _, tops = run('type: "Flatten"', [np.zeros((2, 3, 4))])
    assert tops[0].shape == (2, 12)


@pytest.mark.parametrize("type_", ["Reshape", "Flatten"])
def test_top_views_the_bottom_and_follows_new_arrays(type_):
    spec = f'type: "{type_}" reshape_param {{ shape {{ dim: -1 }} }} flatten_param {{ axis: 0 }}'
    layer, bottoms, tops = run(spec, [np.arange(6.0).reshape(2, 3)])
    x, y = bottoms[0], tops[0]
    assert np.shares_memory(y.data, x.data) and np.shares_memory(y.diff, x.diff)
    x.data = np.full((2, 3), 5.0)  # a new bottom array: forward must not read the old one
    layer.forward(bottoms, tops)
    np.testing.assert_array_equal(y.data, np.full(6, 5.0))
    x.diff = np.zeros((2, 3))  # a new bottom diff array: backward must still write it
    y.diff[...] = np.arange(6.0)
    layer.backward(tops, [True], bottoms)
    np.testing.assert_array_equal(x.diff, np.arange(6.0).reshape(2, 3))


def test_non_contiguous_bottom_is_copied():
    layer, bottoms, tops = run('type: "Flatten" flatten_param { axis: 0 }', [np.zeros((2, 3))])
    x, y = bottoms[0], tops[0]
    x.data, x.diff = np.arange(6.0).reshape(3, 2).T, np.zeros((3, 2)).T
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    np.testing.assert_array_equal(y.data, np.arange(6.0).reshape(3, 2).T.reshape(-1))
    y.diff[...] = 1.0
    layer.backward(tops, [True], bottoms)
    np.testing.assert_array_equal(x.diff, np.ones((2, 3)))


@pytest.mark.parametrize(
    "spec, shape, match",
    [
        ('name: "r1" type: "Reshape" reshape_param { shape { dim: 5 } }', (2, 3), "r1"),
        ('name: "r2" type: "Reshape" reshape_param { shape { dim: -1 dim: -1 } }', (2, 3), "r2"),
        ('name: "r3" type: "Reshape" reshape_param { shape { dim: 0 dim: 0 dim: 0 } }', (2, 3),
         "r3"),
        ('name: "r4" type: "Reshape" reshape_param { shape { dim: -1 dim: 4 } }', (2, 3), "r4"),
        ('name: "r5" type: "Reshape" reshape_param { shape { dim: 6 } axis: 3 }', (2, 3), "r5"),
        ('name: "r6" type: "Reshape" reshape_param { shape { dim: 6 } num_axes: 3 }', (2, 3),
         "r6"),
        ('name: "f1" type: "Flatten" flatten_param { axis: 2 }', (2, 3), "f1"),
        ('name: "f2" type: "Flatten" flatten_param { axis: 3 end_axis: 0 }', (2, 3, 4, 5), "f2"),
    ],
)
def test_bad_shapes_name_the_layer(spec, shape, match):
    with pytest.raises(NetError, match=match):
        run(spec, [np.zeros(shape)])
