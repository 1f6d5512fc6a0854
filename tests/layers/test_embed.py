import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from unroll import NetError, testing
from unroll.backend import to_numpy
from unroll.testing import run_layer as run


def spec(num_output, input_dim, bias=True, wf='type: "gaussian" std: 1'):
    return (
        f'name: "emb" type: "Embed" embed_param {{ num_output: {num_output} '
        f"input_dim: {input_dim} bias_term: {str(bias).lower()} weight_filler {{ {wf} }} "
        'bias_filler { type: "uniform" min: -1 max: 1 } }'
    )


def indices(shape, input_dim):
    return hnp.arrays(np.float64, shape, elements=st.integers(0, input_dim - 1).map(float))


@given(data=st.data())
def test_gradient(data):
    input_dim = data.draw(st.integers(1, 5), "input_dim")
    layer_spec = spec(
        data.draw(st.integers(1, 4), "num_output"),
        input_dim,
        data.draw(st.booleans(), "bias_term"),
        data.draw(testing.fillers(), "weight_filler"),
    )
    x = data.draw(indices(testing.shapes(max_dims=3), input_dim), "x")
    # no gradient flows to the indices: only the weights (repeated rows add up) and bias
    layer = testing.check_layer_gradient(layer_spec, [x])
    assert not layer.allow_force_backward(0)


def test_forward_matches_numpy(xp):
    x = np.array([[0, 3, 3], [1, 0, 2]], np.float64)
    layer, _, tops = run(spec(4, 5), [x], xp)
    W, b = (to_numpy(blob.data) for blob in layer.blobs)
    y = to_numpy(tops[0].data)
    assert y.shape == (2, 3, 4)
    np.testing.assert_array_equal(y, W[x.astype(int)] + b)


def test_backward_accumulates_repeated_rows(xp):
    x = np.array([2.0, 0.0, 2.0, 2.0])
    layer, bs, tops = run(spec(3, 4, bias=False), [x], xp)
    gy = np.arange(12.0).reshape(4, 3)
    tops[0].diff[...] = xp.asarray(gy)
    bs[0].diff[...] = 7
    layer.backward(tops, [True], bs)
    want = np.zeros((4, 3))
    want[2] = gy[0] + gy[2] + gy[3]
    want[0] = gy[1]
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].diff), want)
    # asked anyway, the index bottom gets the zero gradient of a piecewise constant input
    np.testing.assert_array_equal(to_numpy(bs[0].diff), 0)
    layer.backward(tops, [False], bs)
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].diff), 2 * want)


def test_backward_reads_only_saved_indices():
    layer, bs, tops = run(spec(2, 3), [np.array([1.0, 2.0])])
    assert layer.backward_reads == ()
    bs[0].data[...] = 0  # clobbered after forward: the gradient still goes to rows 1 and 2
    tops[0].diff[...] = 1
    layer.backward(tops, [False], bs)
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].diff), [[0, 0], [1, 1], [1, 1]])


@pytest.mark.parametrize(
    "value, where", [(5.0, r"\(1, 0\)"), (-1.0, r"\(1, 0\)"), (1.5, r"\(1, 0\)"), (np.nan, "")]
)
def test_bad_index_is_an_error(value, where):
    x = np.array([[0.0, 1.0], [value, 2.0]])
    with pytest.raises(NetError, match=rf"layer 'emb' \(Embed\).*{value!r}.*{where}.*\[0, 5\)"):
        run(spec(2, 5), [x])


def test_missing_sizes_are_an_error():
    with pytest.raises(NetError, match=r"layer 'emb' \(Embed\).*input_dim 0"):
        run('name: "emb" type: "Embed" embed_param { num_output: 2 }', [np.zeros(2)])
