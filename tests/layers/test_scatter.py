import doctest

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError, testing
from unroll.backend import to_numpy
from unroll.layers import scatter
from unroll.testing import run_layer as run

SCATTER = 'name: "put" type: "Scatter"'


@st.composite
def scatters(draw):
    """(x (K, D), positions (K,), like): distinct cells out of like's and -1s, in any order."""
    like = np.zeros(draw(testing.shapes(max_dims=2)))
    cells = draw(st.permutations(range(like.size)))
    at = cells[: draw(st.integers(0, like.size))] + [-1] * draw(st.integers(0, 3))
    at = draw(st.permutations(at))
    rows = draw(st.integers(1, 3))
    x = draw(st.lists(st.floats(-2, 2), min_size=len(at) * rows, max_size=len(at) * rows))
    return np.array(x).reshape(len(at), rows), np.array(at, np.float64), like


@given(scatters())
def test_gradient(case):
    x, at, like = case
    layer = testing.check_layer_gradient(SCATTER, [x, at, like])
    assert [layer.allow_force_backward(k) for k in range(3)] == [True, False, False]


@given(scatters())
def test_forward_places_rows_and_zeros_elsewhere(case):
    x, at, like = case
    _, _, tops = run(SCATTER, [x, at, like])
    want = np.zeros((like.size, x.shape[1]))
    kept = at >= 0
    want[at[kept].astype(int)] = x[kept]
    np.testing.assert_array_equal(to_numpy(tops[0].data), want.reshape(like.shape + (-1,)))


def test_forward_and_backward_on_every_device(xp):
    x = np.arange(8.0).reshape(2, 2, 2)  # a recurrent layer's outputs: (steps, columns, D)
    at, like = np.array([[-1.0, 4.0], [0.0, 3.0]]), np.zeros((3, 2))
    layer, bs, tops = run(SCATTER, [x, at, like], xp)
    y = to_numpy(tops[0].data)
    assert y.shape == (3, 2, 2)
    np.testing.assert_array_equal(y.reshape(6, 2)[[4, 0, 3]], x.reshape(4, 2)[1:])
    np.testing.assert_array_equal(y.reshape(6, 2)[[1, 2, 5]], 0)
    gy = np.arange(12.0).reshape(3, 2, 2)
    tops[0].diff[...] = xp.asarray(gy)
    bs[0].diff[...] = bs[1].diff[...] = 7
    layer.backward(tops, [True, True, False], bs)
    want = np.concatenate([np.zeros((1, 2)), gy.reshape(6, 2)[[4, 0, 3]]]).reshape(2, 2, 2)
    np.testing.assert_array_equal(to_numpy(bs[0].diff), want)
    np.testing.assert_array_equal(to_numpy(bs[1].diff), 0)


def test_new_shapes_reshape_the_top():
    layer, bs, tops = run(SCATTER, [np.ones((2, 1)), np.array([0.0, 1.0]), np.zeros(2)])
    for blob, shape in zip(bs, [(1, 1), (1,), (2, 3)]):
        blob.reshape(shape)
    bs[0].data[...], bs[1].data[...] = 1, 5
    layer.reshape(bs, tops)
    layer.forward(bs, tops)
    assert tops[0].shape == (2, 3, 1)
    np.testing.assert_array_equal(to_numpy(tops[0].data).reshape(-1), [0, 0, 0, 0, 0, 1])


@pytest.mark.parametrize("value", [6.0, -2.0, 0.5, np.nan])
def test_bad_position_is_an_error(value):
    with pytest.raises(NetError, match=rf"layer 'put' \(Scatter\).*{value!r} at index \(1,\)"
                                       rf".*-1 or .*\[0, 6\).*\(2, 3\)"):
        run(SCATTER, [np.ones((2, 4)), np.array([1.0, value]), np.zeros((2, 3))])


def test_repeated_position_is_an_error():
    with pytest.raises(NetError, match=r"layer 'put' \(Scatter\).*cell 3 more than once"):
        run(SCATTER, [np.ones((3, 4)), np.array([3.0, 1.0, 3.0]), np.zeros(6)])


def test_row_count_mismatch_is_an_error():
    with pytest.raises(NetError, match=r"'bottom0' \(3, 4\) holds 3 rows of 4, but 'bottom1' "
                                       r"\(2,\) gives 2 positions"):
        run(SCATTER, [np.ones((3, 4)), np.array([0.0, 1.0]), np.zeros(6)])


def test_docstring_example():
    result = doctest.testmod(scatter)
    assert result.failed == 0 and result.attempted > 0
