"""BatchReindex, AbsVal and Threshold: the Caffe layers a Scatter is exported with."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from unroll import NetError, testing
from unroll.engine.backend import to_numpy
from unroll.testing import run_layer


@given(data=st.data())
def test_batch_reindex_gradient(data):
    shape = data.draw(testing.shapes(max_dims=3), "x shape")
    x = data.draw(testing.arrays(shape), "x")
    idx = data.draw(hnp.arrays(np.float64, st.integers(0, 5), elements=st.integers(
        0, shape[0] - 1).map(float)), "idx")
    # repeated indices add up in x's gradient; the indices take none
    layer = testing.check_layer_gradient('type: "BatchReindex"', [x, idx])
    assert not layer.allow_force_backward(1)


def test_batch_reindex_forward_and_backward(xp):
    x = np.arange(6.0).reshape(3, 2)
    layer, bottoms, (y,) = run_layer('type: "BatchReindex"', [x, np.array([2.0, 0, 2])], xp)
    np.testing.assert_array_equal(to_numpy(y.data), x[[2, 0, 2]])
    y.diff[...] = xp.asarray(np.array([[1.0, 2], [3, 4], [5, 6]]))
    layer.backward([y], [True, False], bottoms)
    np.testing.assert_array_equal(to_numpy(bottoms[0].diff), [[3, 4], [0, 0], [6, 8]])


@pytest.mark.parametrize("idx, found", [(np.array([3.0]), "3.0"), (np.array([0.5]), "0.5"),
                                        (np.array([-1.0]), "-1.0")])
def test_batch_reindex_refuses_an_index_outside_the_rows(idx, found):
    with pytest.raises(NetError, match=rf"bottom 'bottom1' holds {found} at index 0; "
                                       r"expected an integer in \[0, 3\)"):
        run_layer('type: "BatchReindex"', [np.zeros((3, 2)), idx])


def test_batch_reindex_needs_one_dimensional_indices():
    with pytest.raises(NetError, match=r"expected rows \(K, \.\.\.\) and indices \(M,\)"):
        run_layer('type: "BatchReindex"', [np.zeros((3, 2)), np.zeros((1, 1))])


@given(x=testing.arrays(testing.shapes(), away_from=[0.0]))
def test_abs_val_gradient(x):
    testing.check_layer_gradient('type: "AbsVal"', [x])
    _, _, (y,) = run_layer('type: "AbsVal"', [x])
    np.testing.assert_array_equal(y.data, np.abs(x))


def test_threshold_is_a_step_at_zero_without_gradient(xp):
    x = np.array([[-1.0, 0.0, 1e-9, 3.0]])
    layer, bottoms, (y,) = run_layer('type: "Threshold"', [x], xp)
    np.testing.assert_array_equal(to_numpy(y.data), [[0, 0, 1, 1]])
    assert not layer.allow_force_backward(0)
    layer.backward([y], [True], bottoms)
    np.testing.assert_array_equal(to_numpy(bottoms[0].diff), np.zeros_like(x))
