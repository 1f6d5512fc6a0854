
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import Net, NetError, testing
from unroll.engine import trace
from unroll.engine.backend import to_numpy
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


@pytest.mark.parametrize("value", [6.0, np.inf])
def test_position_past_the_cells_is_an_error(value):
    with pytest.raises(NetError, match=rf"layer 'put' \(Scatter\).*{value!r} at index \(1,\)"
                                       rf".*-1 or .*\[0, 6\).*\(2, 3\)"):
        run(SCATTER, [np.ones((2, 4)), np.array([1.0, value]), np.zeros((2, 3))])


@pytest.mark.parametrize("value", [-2.0, 0.5, np.nan, -np.inf])
def test_position_not_a_cell_index_is_an_error(value):
    with pytest.raises(NetError, match=rf"layer 'put' \(Scatter\).*{value!r} at index \(1,\)"
                                       rf"; expected -1 or a whole number >= 0"):
        run(SCATTER, [np.ones((2, 4)), np.array([1.0, value]), np.zeros((2, 3))])


def test_repeated_position_is_an_error():
    with pytest.raises(NetError, match=r"layer 'put' \(Scatter\).*cell 3 more than once"):
        run(SCATTER, [np.ones((3, 4)), np.array([3.0, 1.0, 3.0]), np.zeros(6)])


PUT = """
layer { name: "in" type: "Input" top: "x" top: "at" top: "like"
        input_param { shape { dim: 3 dim: 2 } shape { dim: 3 } shape { dim: 2 dim: 3 } } }
layer { name: "put" type: "Scatter" bottom: "x" bottom: "at" bottom: "like" top: "y" }
"""


@pytest.mark.parametrize("at, message", [
    ([0.0, 6.0, -1.0], r"bottom 'at' holds 6.0 at index \(1,\); expected -1 or an integer in "
                       r"\[0, 6\) \(a cell of 'like' \(2, 3\)\)"),
    ([0.0, 2.5, -1.0], r"bottom 'at' holds 2.5 at index \(1,\); expected -1 or a whole number"),
    ([4.0, 1.0, 4.0], r"bottom 'at' names cell 4 more than once"),
])
def test_a_device_net_checks_positions_on_the_host_before_they_are_sent(at, message):
    net = Net(PUT, device="trace")
    with trace.measure() as c, pytest.raises(NetError, match=r"layer 'put' \(Scatter\): "
                                                               + message):
        net.forward(at=np.array(at), x=np.ones((3, 2)), like=np.zeros((2, 3)))
    # a position past the cells is known only once 'like' has its shape: forward tells,
    # on the host, with nothing read back; the others stop the positions before they are sent
    assert (c.h2d, c.syncs) == ((3, 0) if "6.0" in message else (0, 0))


def test_a_device_forward_reads_nothing_back_and_takes_the_new_cells():
    net = Net(PUT, device="trace")
    x = np.arange(6.0).reshape(3, 2)
    with trace.measure() as c:
        # cell 7 is past the 6 cells the net was built with, but 'like' grows in the
        # same forward: checked against the new shape
        y = net.forward(x=x, at=np.array([7.0, -1.0, 0.0]), like=np.zeros((2, 4)))["y"]
    assert c.syncs == 0 and c.d2h == 0
    want = np.zeros((8, 2))
    want[[7, 0]] = x[[0, 2]]
    np.testing.assert_array_equal(to_numpy(y), want.reshape(2, 4, 2))


def test_unchecked_device_positions_out_of_range_are_dropped_not_written_elsewhere():
    net = Net(PUT, device="trace")
    at = trace.asarray(np.array([9.0, np.nan, 1.0], np.float32))  # a device array: no check
    y = net.forward(x=np.ones((3, 2)), at=at, like=np.zeros((2, 3)))["y"]
    want = np.zeros((6, 2))
    want[1] = 1
    np.testing.assert_array_equal(to_numpy(y), want.reshape(2, 3, 2))


def test_row_count_mismatch_is_an_error():
    with pytest.raises(NetError, match=r"'bottom0' \(3, 4\) holds 3 rows of 4, but 'bottom1' "
                                       r"\(2,\) gives 2 positions"):
        run(SCATTER, [np.ones((3, 4)), np.array([0.0, 1.0]), np.zeros(6)])
