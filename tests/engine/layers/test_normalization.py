import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError, testing
from unroll.engine.backend import to_numpy
from unroll.testing import run_layer as run


def gradients(layer, bs, tops, gy, propagate):
    """Bottom and param diffs after one backward of top diff ``gy`` (param diffs zeroed first)."""
    xp = layer.xp
    for b in layer.blobs:
        b.diff[...] = 0
    tops[0].diff[...] = xp.asarray(gy)
    layer.backward(tops, propagate, bs)
    return [to_numpy(b.diff).copy() for b in bs + layer.blobs]


# -- BatchNorm ----------------------------------------------------------------


def bn(use_global=None, eps=1e-5, fraction=0.999):
    stats = "" if use_global is None else f"use_global_stats: {str(use_global).lower()}"
    return (
        f'name: "bn" type: "BatchNorm" batch_norm_param {{ {stats} eps: {eps!r} '
        f"moving_average_fraction: {fraction} }}"
    )


@given(data=st.data())
def test_batch_norm_gradient_batch_stats(data):
    shape = data.draw(testing.shapes(max_dims=4))
    eps = data.draw(st.sampled_from([1e-2, 0.1, 1.0]), "eps")
    fraction = data.draw(st.sampled_from([0.0, 0.5, 0.999]), "moving_average_fraction")
    spec = bn(data.draw(st.sampled_from([None, False]), "use_global_stats"), eps, fraction)
    # the statistics blobs are not learned: their diffs stay 0 and the output ignores them
    testing.check_layer_gradient(spec, [data.draw(testing.arrays(shape), "x")])


@given(data=st.data())
def test_batch_norm_gradient_global_stats(data):
    shape = data.draw(testing.shapes(max_dims=4))
    C = shape[1] if len(shape) > 1 else 1
    phase, use_global = data.draw(st.sampled_from([("test", None), ("train", True)]), "mode")
    layer, bs, tops = run(
        bn(use_global, eps=data.draw(st.sampled_from([1e-5, 0.1]))),
        [data.draw(testing.arrays(shape), "x")],
        phase=phase,
    )
    stats = data.draw(testing.arrays((2 * C,), low=0.0, high=2.0), "stats")
    layer.blobs[0].data[...] = stats[:C]
    layer.blobs[1].data[...] = stats[C:]
    layer.blobs[2].data[...] = data.draw(st.sampled_from([0.0, 1.0, 2.5]), "factor")
    gy = np.random.default_rng(0).uniform(-1, 1, shape)

    def f():
        layer.forward(bs, tops)
        return float((tops[0].data * gy).sum())

    f()
    analytic = gradients(layer, bs, tops, gy, [True])[0]
    numeric = testing.numeric_gradient(f, bs[0].data, 1e-6)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-4, atol=1e-6)


def test_batch_norm_forward_and_moving_stats(xp):
    rng = np.random.default_rng(0)
    x1, x2 = rng.normal(size=(2, 2, 3, 3, 2)) * [[[[1]], [[2]], [[3]]]]
    layer, bs, tops = run(bn(eps=2**-10, fraction=0.75), [x1], xp)
    mean, var = x1.mean(axis=(0, 2, 3)), x1.var(axis=(0, 2, 3))
    want = (x1 - mean[:, None, None]) / np.sqrt(var[:, None, None] + 2**-10)
    np.testing.assert_allclose(to_numpy(tops[0].data), want, rtol=1e-12)
    bs[0].data[...] = xp.asarray(x2)
    layer.forward(bs, tops)
    m = 2 * 3 * 2
    np.testing.assert_allclose(to_numpy(layer.blobs[2].data), [0.75 + 1])
    np.testing.assert_allclose(
        to_numpy(layer.blobs[0].data), 0.75 * mean + x2.mean(axis=(0, 2, 3)), rtol=1e-12
    )
    np.testing.assert_allclose(
        to_numpy(layer.blobs[1].data),
        (0.75 * var + x2.var(axis=(0, 2, 3))) * m / (m - 1),
        rtol=1e-12,
    )


def test_batch_norm_test_phase_uses_scaled_moving_stats(xp):
    x = np.random.default_rng(1).normal(size=(4, 2))
    layer, bs, tops = run(bn(eps=2**-10), [x], xp, phase="test")
    layer.blobs[0].data[...] = xp.asarray([1.0, -2.0])
    layer.blobs[1].data[...] = xp.asarray([4.0, 0.5])
    layer.blobs[2].data[...] = 2.0
    layer.forward(bs, tops)
    want = (x - [0.5, -1.0]) / np.sqrt(np.array([2.0, 0.25]) + 2**-10)
    np.testing.assert_allclose(to_numpy(tops[0].data), want, rtol=1e-12)


@pytest.mark.parametrize("phase", ["train", "test"])
def test_batch_norm_in_place_equals_out_of_place(xp, phase):
    rng = np.random.default_rng(2)
    x, gy = rng.normal(size=(2, 5, 3, 3))
    out = run(bn(), [x], xp, phase)
    inp = run(bn(), [x], xp, phase, in_place=True)
    assert inp[0].in_place and inp[0].backward_reads == ()
    np.testing.assert_allclose(to_numpy(inp[2][0].data), to_numpy(out[2][0].data), rtol=1e-14)
    want = gradients(*out, gy, [True])
    for got, w in zip(gradients(*inp, gy, [True]), want):
        np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-14)


def test_batch_norm_channel_change_is_an_error():
    layer, bs, tops = run(bn(), [np.zeros((2, 3, 4))])
    bs[0].reshape((2, 4, 4))
    with pytest.raises(NetError, match=r"layer 'bn' \(BatchNorm\).*\(2, 4, 4\).*4 channels.*3"):
        layer.reshape(bs, tops)


# -- Scale --------------------------------------------------------------------


def scale(axis=1, num_axes=1, bias=False, filler=None):
    fill = f"filler {{ {filler} }}" if filler else ""
    return (
        f'name: "sc" type: "Scale" scale_param {{ axis: {axis} num_axes: {num_axes} {fill} '
        f'bias_term: {str(bias).lower()} bias_filler {{ type: "uniform" min: -1 max: 1 }} }}'
    )


@given(data=st.data())
def test_scale_gradient_learned(data):
    shape = data.draw(testing.shapes(max_dims=4))
    axis = data.draw(testing.axes(len(shape)), "axis")
    num_axes = data.draw(st.integers(-1, len(shape) - axis % len(shape)), "num_axes")
    spec = scale(
        axis,
        num_axes,
        data.draw(st.booleans(), "bias_term"),
        data.draw(st.one_of(st.none(), testing.fillers()), "filler"),
    )
    layer = testing.check_layer_gradient(spec, [data.draw(testing.arrays(shape), "x")])
    a = axis % len(shape)
    assert layer.blobs[0].shape == (shape[a:] if num_axes == -1 else shape[a : a + num_axes])


@given(data=st.data())
def test_scale_gradient_scale_bottom(data):
    shape = data.draw(testing.shapes(max_dims=4))
    axis = data.draw(testing.axes(len(shape)), "axis")
    a = axis % len(shape)
    k = data.draw(st.integers(0, len(shape) - a), "scale ndim")
    bottoms = [
        data.draw(testing.arrays(shape), "x"),
        data.draw(testing.arrays(shape[a : a + k]), "scale"),
    ]
    # gradients for both bottoms, and the bias when there is one
    testing.check_layer_gradient(scale(axis, bias=data.draw(st.booleans(), "bias")), bottoms)


def test_scale_default_filler_is_one():
    layer, _, tops = run(scale(), [np.arange(6.0).reshape(2, 3)])
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].data), np.ones(3))
    np.testing.assert_array_equal(to_numpy(tops[0].data), np.arange(6.0).reshape(2, 3))


def test_scale_forward_matches_numpy(xp):
    x = np.random.default_rng(3).normal(size=(2, 3, 4, 5))
    layer, _, tops = run(scale(1, 2, True, 'type: "gaussian" std: 1'), [x], xp)
    s, b = (to_numpy(blob.data) for blob in layer.blobs)
    assert s.shape == b.shape == (3, 4)
    np.testing.assert_allclose(to_numpy(tops[0].data), x * s[:, :, None] + b[:, :, None])


def test_scale_masks_a_recurrent_state_by_cont(xp):
    # state (1, N, H) times cont (1, N), axis 0: each sequence that starts here gets a zero state
    h = np.random.default_rng(4).normal(size=(1, 3, 4))
    cont = np.array([[1.0, 0.0, 1.0]])
    layer, bs, tops = run(scale(axis=0), [h, cont], xp)
    np.testing.assert_array_equal(to_numpy(tops[0].data), h * cont[..., None])
    gy = np.ones((1, 3, 4))
    gh, gcont = gradients(layer, bs, tops, gy, [True, True])
    np.testing.assert_array_equal(gh, gy * cont[..., None])
    np.testing.assert_allclose(gcont, h.sum(axis=2))
    # a new batch size (another bucket) reshapes cleanly
    bs[0].reshape((1, 5, 4))
    bs[1].reshape((1, 5))
    layer.reshape(bs, tops)
    layer.forward(bs, tops)
    assert tops[0].shape == (1, 5, 4)


@pytest.mark.parametrize("two", [False, True])
def test_scale_in_place_equals_out_of_place(xp, two):
    rng = np.random.default_rng(5)
    x, gy = rng.normal(size=(2, 2, 3, 4))
    bottoms = [x, rng.normal(size=(3, 4))] if two else [x]
    spec = scale(1, 2, bias=True, filler='type: "gaussian" std: 1')
    out = run(spec, bottoms, xp)
    inp = run(spec, bottoms, xp, in_place=True)
    np.testing.assert_array_equal(to_numpy(inp[2][0].data), to_numpy(out[2][0].data))
    propagate = [True] * len(bottoms)
    for got, want in zip(gradients(*inp, gy, propagate), gradients(*out, gy, propagate)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_scale_bottom_shape_mismatch_names_both_shapes():
    with pytest.raises(NetError, match=r"layer 'sc' \(Scale\).*'bottom1' of shape \(2,\).*\(3,\)"):
        run(scale(axis=1), [np.zeros((2, 3)), np.zeros(2)])


@pytest.mark.parametrize(
    "text, message",
    [
        (scale(1, 3), r"a 3-D scale at axis 1 does not fit .*\(2, 3\)"),
        (scale(1, -2), "num_axes must be >= -1"),
        (scale(2), "axis 2 out of range"),
    ],
)
def test_scale_bad_parameters(text, message):
    with pytest.raises(NetError, match=rf"layer 'sc' \(Scale\): .*{message}"):
        run(text, [np.zeros((2, 3))])


def test_scale_learned_shape_change_is_an_error():
    layer, bs, tops = run(scale(), [np.zeros((2, 3))])
    bs[0].reshape((2, 4))
    with pytest.raises(NetError, match=r"layer 'sc' \(Scale\).*\(2, 4\) has \(4,\).*\(3,\)"):
        layer.reshape(bs, tops)
