import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError, testing
from unroll.engine.backend import to_numpy
from unroll.testing import run_layer as run


def spec(num_output, axis=1, bias=True, transpose=False, wf='type: "gaussian" std: 0.5'):
    return (
        f'name: "ip" type: "InnerProduct" inner_product_param {{ num_output: {num_output} '
        f"axis: {axis} bias_term: {str(bias).lower()} transpose: {str(transpose).lower()} "
        f'weight_filler {{ {wf} }} bias_filler {{ type: "uniform" min: -1 max: 1 }} }}'
    )


@given(data=st.data())
def test_gradient(data):
    shape = data.draw(testing.shapes(max_dims=3))
    axis = data.draw(testing.axes(len(shape)))
    layer_spec = spec(
        data.draw(st.integers(1, 4), "num_output"),
        axis,
        data.draw(st.booleans(), "bias_term"),
        data.draw(st.booleans(), "transpose"),
        data.draw(testing.fillers(), "weight_filler"),
    )
    testing.check_layer_gradient(layer_spec, [data.draw(testing.arrays(shape), "x")])


@pytest.mark.parametrize(
    "shape, axis, transpose, bias",
    [
        ((3, 4), 1, False, True),
        ((2, 3, 4), 1, True, True),
        ((2, 3, 4), -1, False, False),
        ((2, 3), 0, True, False),
    ],
)
def test_forward_matches_numpy(xp, shape, axis, transpose, bias):
    x = np.random.default_rng(1).normal(size=shape)
    layer, _, tops = run(spec(5, axis, bias, transpose), [x], xp)
    a = axis % len(shape)
    W = to_numpy(layer.blobs[0].data)
    K = int(np.prod(shape[a:]))
    assert W.shape == ((K, 5) if transpose else (5, K))
    x2 = x.reshape(int(np.prod(shape[:a])), -1)
    want = x2 @ (W if transpose else W.T) + (to_numpy(layer.blobs[1].data) if bias else 0)
    y = to_numpy(tops[0].data)
    assert y.shape == shape[:a] + (5,)
    np.testing.assert_allclose(y.reshape(x2.shape[0], 5), want, rtol=1e-12)


def test_backward_adds_into_param_diffs_and_writes_bottom_diff(xp):
    x = np.random.default_rng(2).normal(size=(3, 4))
    layer, bs, tops = run(spec(2), [x], xp)
    tops[0].diff[...] = xp.asarray(np.random.default_rng(3).normal(size=(3, 2)))
    layer.backward(tops, [True], bs)
    first = [to_numpy(b.diff).copy() for b in layer.blobs]
    gx = to_numpy(bs[0].diff).copy()
    layer.backward(tops, [True], bs)
    for blob, g in zip(layer.blobs, first):
        np.testing.assert_allclose(to_numpy(blob.diff), 2 * g)
    np.testing.assert_allclose(to_numpy(bs[0].diff), gx)


def test_input_size_change_is_an_error():
    layer, bs, tops = run(spec(2), [np.zeros((2, 3))])
    bs[0].reshape((2, 4))
    with pytest.raises(NetError, match=r"layer 'ip'.*\(2, 4\).*4 inputs.*K = 3"):
        layer.reshape(bs, tops)


def test_batch_size_change_reuses_weights():
    layer, bs, tops = run(spec(2, axis=2), [np.zeros((2, 3, 4))])
    bs[0].reshape((5, 1, 4))
    layer.reshape(bs, tops)
    layer.forward(bs, tops)
    assert tops[0].shape == (5, 1, 2)


@pytest.mark.parametrize(
    "text, message",
    [(spec(0), "num_output must be >= 1"), (spec(2, axis=3), "axis 3 out of range")],
)
def test_bad_parameters(text, message):
    with pytest.raises(NetError, match=f"layer 'ip' \\(InnerProduct\\): .*{message}"):
        run(text, [np.zeros((2, 3))])
