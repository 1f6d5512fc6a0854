"""LSTMUnit against Caffe's equations; both units' fused kernels against their reference.

The reference is each unit's ``xp`` code (engine "reference"); the fused kernels
(numba on the CPU, CuPy on a GPU) must give the same tops and bottom diffs for
any shape, cont pattern and ``propagate_down``, in float32 and float64, and pass
the float64 finite-difference checks themselves.
"""

from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError
from unroll.engine.backend import to_numpy
from unroll.engine.kernels import ENGINE_VARIABLE, ENGINES, KERNEL_MODULES
from unroll.testing import arrays, check_layer_gradient, run_layer

SPEC = 'name: "lstm" type: "LSTMUnit" top: "c" top: "h"'
UNITS = {  # type: (spec, gates, projection bottoms, tops)
    "LSTMUnit": (SPEC, 4, 1, 2),
    "GRUUnit": ('name: "gru" type: "GRUUnit" top: "h"', 3, 2, 1),
}
TOLERANCE = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-11, atol=1e-13)}


@contextmanager
def engine(name):
    """Units built inside take engine ``name``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENGINE_VARIABLE, name)
        yield


def conts(lead):
    """cont patterns: 0/1 mixes (sequence starts), all 0, all 1, and fractions."""
    binary = arrays(lead).map(lambda a: (a > 0).astype(float))
    constant = st.sampled_from([0.0, 1.0]).map(lambda v: np.full(lead, v))
    return binary | constant | arrays(lead, 0, 1)


@st.composite
def unit_inputs(draw, unit, max_hidden=3):
    """[state (..., H), projections (..., gates H), cont (...)] with Caffe's (1, N) lead
    or others; H up to ``max_hidden``."""
    _, gates, n_projections, _ = UNITS[unit]
    lead = draw(st.sampled_from([(1,), (2,), ()])) + (draw(st.integers(1, 3)),)
    H = draw(st.integers(1, max_hidden))
    projections = [draw(arrays(lead + (gates * H,), -3, 3)) for _ in range(n_projections)]
    return [draw(arrays(lead + (H,))), *projections, draw(conts(lead))]


def forward_backward(unit, values, name, xp=np, dtype=np.float64, propagate=None, seed=0):
    """Tops and bottom diffs of one forward and backward; diffs not propagated stay NaN."""
    spec, _, _, n_tops = UNITS[unit]
    with engine(name):
        layer, bottoms, tops = run_layer(spec, values, xp, n_tops=n_tops, dtype=dtype)
    assert layer.engine == name
    rng = np.random.default_rng(seed)
    for top in tops:
        top.diff[...] = xp.asarray(rng.uniform(-1, 1, top.shape))
    for bottom in bottoms:
        bottom.diff[...] = np.nan
    if propagate is None:
        propagate = [layer.allow_force_backward(i) for i in range(len(bottoms))]
    layer.backward(tops, propagate, bottoms)
    return [to_numpy(t.data) for t in tops], [to_numpy(b.diff) for b in bottoms]


# -- LSTMUnit is Caffe's ----------------------------------------------------------------


def caffe_lstm_unit(c_prev, x, cont):
    """Caffe's LSTMUnit, written out directly."""
    H = c_prev.shape[-1]
    sig = 1 / (1 + np.exp(-x[..., :3 * H]))
    i, f, o = sig[..., :H], sig[..., H:2 * H], sig[..., 2 * H:]
    g = np.tanh(x[..., 3 * H:])
    c = cont[..., None] * f * c_prev + i * g
    return c, o * np.tanh(c)


@pytest.mark.parametrize("name", ENGINES)
@given(inputs=unit_inputs("LSTMUnit"))
def test_lstm_unit_forward_matches_caffe(xp, name, inputs):
    (c, h), _ = forward_backward("LSTMUnit", inputs, name, xp)
    want_c, want_h = caffe_lstm_unit(*inputs)
    np.testing.assert_allclose(c, want_c, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(h, want_h, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ENGINES)
def test_cont_zero_cuts_the_state(name):
    c_prev, x = np.full((1, 2, 3), 5.0), np.zeros((1, 2, 12))
    (c, h), (dc_prev, _, _) = forward_backward("LSTMUnit", [c_prev, x, np.array([[0.0, 1.0]])],
                                               name)
    np.testing.assert_allclose(c[0, 0], 0.0)  # i * g = 0.5 * tanh(0) = 0
    np.testing.assert_allclose(c[0, 1], 2.5)  # f * c_prev = 0.5 * 5
    np.testing.assert_allclose(dc_prev[0, 0], 0.0)
    assert (dc_prev[0, 1] != 0).all()


@pytest.mark.parametrize(
    "shapes_",
    [[(1, 2, 3), (1, 2, 11), (1, 2)], [(1, 2, 3), (1, 3, 12), (1, 2)],
     [(1, 2, 3), (1, 2, 12), (2, 1)], [(1, 2, 3), (1, 2, 12), (1, 2, 1)]],
)
def test_bad_shapes_name_the_layer(shapes_):
    with pytest.raises(NetError, match=r"'lstm'.*c_prev 'bottom0' \(1, 2, 3\), x 'bottom1'"):
        run_layer(SPEC, [np.zeros(s) for s in shapes_], n_tops=2)


# -- both units: fused kernels against the reference ---------------------------------------


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@given(data=st.data())
def test_fused_equals_reference(xp, unit, dtype, data):
    """Forward and backward, every propagate_down pattern; the reference runs on NumPy,
    so on a GPU this compares the CUDA kernels with their NumPy twin."""
    values = data.draw(unit_inputs(unit, max_hidden=40), label="inputs")
    propagate = data.draw(st.lists(st.booleans(), min_size=len(values) - 1,
                                   max_size=len(values) - 1), label="propagate") + [False]
    tops, diffs = forward_backward(unit, values, "fused", xp, dtype, propagate)
    want_tops, want_diffs = forward_backward(unit, values, "reference", np, dtype, propagate)
    for what, got, want in [("top", tops, want_tops), ("bottom diff", diffs, want_diffs)]:
        for k, (a, b) in enumerate(zip(got, want)):
            np.testing.assert_allclose(a, b, **TOLERANCE[dtype], err_msg=f"{unit} {what} {k}")
    for k, down in enumerate(propagate):
        assert np.isnan(diffs[k]).all() != down, f"{unit}: bottom diff {k}, propagate {down}"


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("name", ENGINES)
@given(data=st.data())
def test_gradient(xp, unit, name, data):
    values = data.draw(unit_inputs(unit))
    with engine(name):
        layer = check_layer_gradient(UNITS[unit][0], values, xp=xp)
    assert layer.engine == name
    assert not layer.allow_force_backward(len(values) - 1), "cont has no gradient"


@pytest.mark.parametrize("unit", UNITS)
def test_non_contiguous_blobs_take_the_reference(unit):
    """A strided bottom or diff (never made by the net, but legal) cannot be handed to a
    kernel as rows without a copy: the unit runs its reference and writes in place."""
    rng = np.random.default_rng(0)
    _, gates, n_projections, _ = UNITS[unit]
    values = [rng.uniform(-1, 1, (2, 3, 4)), *(rng.uniform(-2, 2, (2, 3, gates * 4))
                                               for _ in range(n_projections)), np.ones((2, 3))]
    want = forward_backward(unit, values, "reference")
    spec, _, _, n_tops = UNITS[unit]
    layer, bottoms, tops = run_layer(spec, values, n_tops=n_tops)
    wide = np.zeros((2, 3, 2 * gates * 4))
    bottoms[1].data, bottoms[1].diff = wide[..., ::2], np.zeros((2, 3, 2 * gates * 4))[..., 1::2]
    bottoms[1].data[...] = values[1]
    layer.forward(bottoms, tops)
    for top, w in zip(tops, np.random.default_rng(0).uniform(-1, 1, (n_tops, 2, 3, 4))):
        top.diff[...] = w
    layer.backward(tops, [True] * (len(values) - 1) + [False], bottoms)
    np.testing.assert_allclose(bottoms[1].diff, want[1][1], rtol=1e-12)
    for top, w in zip(tops, want[0]):
        np.testing.assert_allclose(top.data, w, rtol=1e-12)


def test_engine_from_the_environment():
    with engine("reference"):
        layer, _, _ = run_layer(SPEC, [np.zeros((1, 1, 2)), np.zeros((1, 1, 8)), np.ones((1, 1))],
                                n_tops=2)
    assert layer.engine == "reference"
    with engine("fast"), pytest.raises(NetError, match=r"'lstm'.*UNROLL_ENGINE='fast'.*fused"):
        run_layer(SPEC, [np.zeros((1, 1, 2)), np.zeros((1, 1, 8)), np.ones((1, 1))], n_tops=2)


def test_a_device_without_kernels_runs_the_reference():
    values = [np.ones((1, 2, 3)), np.zeros((1, 2, 12)), np.ones((1, 2))]
    with pytest.MonkeyPatch.context() as patch:
        patch.delitem(KERNEL_MODULES, "cpu")
        layer, _, (c, h) = run_layer(SPEC, values, n_tops=2)
    assert layer.engine == "reference"
    np.testing.assert_allclose(c.data, 0.5)  # f * c_prev + i * g = 0.5 * 1 + 0.5 * 0
