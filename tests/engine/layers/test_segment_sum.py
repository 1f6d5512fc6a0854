"""SegmentSum: the child sum of the tree unroller (docs/design.md, "Unrolling over trees")."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError, testing
from unroll.engine.backend import to_numpy
from unroll.testing import run_layer as run

SUM = 'name: "add" type: "SegmentSum"'


@st.composite
def segment_sums(draw):
    """(x (P, D...), seg (P,), like (S, 1)): any ids in -1..S-1, repeats and gaps included."""
    segments = draw(st.integers(1, 4))
    rows = draw(st.integers(0, 6))
    seg = np.array(draw(st.lists(st.integers(-1, segments - 1), min_size=rows, max_size=rows)),
                   np.float64)
    tail = draw(st.lists(st.integers(1, 3), max_size=2))
    x = draw(testing.arrays((rows, *tail)))
    return x, seg, np.zeros((segments, 1))


@given(segment_sums())
def test_gradient(case):
    layer = testing.check_layer_gradient(SUM, list(case))
    assert [layer.allow_force_backward(k) for k in range(3)] == [True, False, False]


@given(segment_sums())
def test_forward_adds_each_segments_rows(case):
    x, seg, like = case
    _, _, (y,) = run(SUM, [x, seg, like])
    want = np.zeros((like.shape[0],) + x.shape[1:])
    for p, s in enumerate(seg.astype(int)):
        if s >= 0:
            want[s] += x[p]
    np.testing.assert_allclose(to_numpy(y.data), want)


def test_forward_and_backward_on_every_device(xp):
    x = np.arange(8.0).reshape(4, 2)
    seg = np.array([2.0, -1, 0, 2])
    layer, bs, (y,) = run(SUM, [x, seg, np.zeros((3, 5))], xp)
    np.testing.assert_array_equal(to_numpy(y.data), [[4, 5], [0, 0], [6, 8]])
    y.diff[...] = xp.asarray(np.array([[1.0, 2], [3, 4], [5, 6]]))
    layer.backward([y], [True, False, False], bs)
    np.testing.assert_array_equal(to_numpy(bs[0].diff), [[5, 6], [0, 0], [1, 2], [5, 6]])


@pytest.mark.parametrize("seg, found", [([0.5], "0.5"), ([-2.0], "-2.0")])
def test_refuses_ids_that_are_not_segments(seg, found):
    with pytest.raises(NetError, match=rf"layer 'add' \(SegmentSum\): bottom 'bottom1' holds "
                                       rf"{found} at index 0; expected -1 or a segment"):
        run(SUM, [np.zeros((1, 2)), np.array(seg), np.zeros((2, 1))])


def test_refuses_an_id_past_the_segments():
    with pytest.raises(NetError, match=r"holds 3\.0 at index 1; expected -1 or a segment in "
                                       r"\[0, 2\)"):
        run(SUM, [np.zeros((2, 2)), np.array([0.0, 3.0]), np.zeros((2, 1))])


def test_needs_one_id_per_row():
    with pytest.raises(NetError, match=r"one segment id per row \(P,\)"):
        run(SUM, [np.zeros((3, 2)), np.zeros(2), np.zeros((2, 1))])
