import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unroll import NetError
from unroll.backend import to_numpy
from unroll.blob import Blob
from unroll.layer import layer_class
from unroll.proto import LayerParameter, parse_text
from unroll.testing import arrays, check_layer_gradient

with_xp = settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)

SPEC = 'name: "lstm" type: "LSTMUnit" top: "c" top: "h"'


def run(values, xp=np, spec=SPEC):
    param = parse_text(spec, LayerParameter())
    layer = layer_class(param)(param, xp=xp, dtype=np.float64)
    bottoms = [Blob(np.shape(v), xp, np.float64, n) for v, n in zip(values, "cxk")]
    for b, v in zip(bottoms, values):
        b.data[...] = xp.asarray(v)
    tops = [Blob((), xp, np.float64, "c"), Blob((), xp, np.float64, "h")]
    layer.set_up(bottoms, tops)
    layer.forward(bottoms, tops)
    return layer, bottoms, tops


def reference(c_prev, x, cont):
    """Caffe's LSTMUnit, written out directly."""
    H = c_prev.shape[-1]
    sig = 1 / (1 + np.exp(-x[..., :3 * H]))
    i, f, o = sig[..., :H], sig[..., H:2 * H], sig[..., 2 * H:]
    g = np.tanh(x[..., 3 * H:])
    c = cont[..., None] * f * c_prev + i * g
    return c, o * np.tanh(c)


@st.composite
def lstm_inputs(draw):
    """c_prev (..., N, H), x (..., N, 4H), cont (..., N): Caffe's (1, N, .) or other leads."""
    lead = draw(st.sampled_from([(1,), (2,), ()])) + (draw(st.integers(1, 3)),)
    H = draw(st.integers(1, 3))
    c_prev = draw(arrays(lead + (H,)))
    x = draw(arrays(lead + (4 * H,), -3, 3))
    binary = st.sampled_from([0.0, 1.0])
    cont = draw(arrays(lead, 0, 1) | arrays(lead).map(lambda a: (a > 0).astype(float)) | binary
                .map(lambda v: np.full(lead, v)))
    return c_prev, x, cont


@with_xp
@given(inputs=lstm_inputs())
def test_lstm_unit_forward_matches_numpy(xp, inputs):
    _, _, (c, h) = run(inputs, xp)
    want_c, want_h = reference(*inputs)
    np.testing.assert_allclose(to_numpy(c.data), want_c, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(to_numpy(h.data), want_h, rtol=1e-12, atol=1e-14)


@with_xp
@given(inputs=lstm_inputs())
def test_lstm_unit_gradient(xp, inputs):
    layer = check_layer_gradient(SPEC, list(inputs), xp=xp)
    assert not layer.allow_force_backward(2)


def test_cont_zero_cuts_the_state():
    c_prev, x = np.full((1, 2, 3), 5.0), np.zeros((1, 2, 12))
    layer, bottoms, (c, h) = run([c_prev, x, np.array([[0.0, 1.0]])])
    np.testing.assert_allclose(c.data[0, 0], 0.0)  # i * g = 0.5 * tanh(0) = 0
    np.testing.assert_allclose(c.data[0, 1], 2.5)  # f * c_prev = 0.5 * 5
    c.diff[...], h.diff[...] = 1.0, 0.0
    layer.backward([c, h], [True, True, False], bottoms)
    np.testing.assert_allclose(bottoms[0].diff[0, 0], 0.0)
    np.testing.assert_allclose(bottoms[0].diff[0, 1], 0.5)


@pytest.mark.parametrize(
    "shapes_",
    [[(1, 2, 3), (1, 2, 11), (1, 2)], [(1, 2, 3), (1, 3, 12), (1, 2)],
     [(1, 2, 3), (1, 2, 12), (2, 1)], [(1, 2, 3), (1, 2, 12), (1, 2, 1)]],
)
def test_bad_shapes_name_the_layer(shapes_):
    with pytest.raises(NetError, match="'lstm'.*c_prev"):
        run([np.zeros(s) for s in shapes_])
