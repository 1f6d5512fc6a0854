"""GRUUnit against the GRU equations written out in NumPy.

Its gradients and the fused-versus-reference checks live with LSTMUnit's in
test_recurrent_unit.py; the unrolled ``gru`` template against its primitive
twin in tests/frontend/test_gru_unit_template.py.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError
from unroll.engine.backend import to_numpy
from unroll.engine.kernels import ENGINE_VARIABLE, ENGINES
from unroll.testing import arrays, run_layer

SPEC = 'name: "gru" type: "GRUUnit" top: "h"'


def gru_unit(h_prev, x, hh, cont):
    """h' = cont h_prev; r, z = sigmoid(x + hh); n = tanh(x_n + r hh_n); h = (1 - z) n + z h'."""
    H = h_prev.shape[-1]
    sig = 1 / (1 + np.exp(-(x[..., :2 * H] + hh[..., :2 * H])))
    r, z = sig[..., :H], sig[..., H:]
    n = np.tanh(x[..., 2 * H:] + r * hh[..., 2 * H:])
    return (1 - z) * n + z * (cont[..., None] * h_prev)


@st.composite
def gru_inputs(draw):
    lead = draw(st.sampled_from([(1,), (3,), ()])) + (draw(st.integers(1, 4)),)
    H = draw(st.integers(1, 5))
    cont = draw(arrays(lead, 0, 1) | arrays(lead).map(lambda a: (a > 0).astype(float)))
    return [draw(arrays(lead + (H,))), draw(arrays(lead + (3 * H,), -3, 3)),
            draw(arrays(lead + (3 * H,), -3, 3)), cont]


@pytest.mark.parametrize("engine", ENGINES)
@given(inputs=gru_inputs())
def test_gru_unit_forward_matches_the_equations(xp, engine, inputs):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENGINE_VARIABLE, engine)
        layer, _, (h,) = run_layer(SPEC, inputs, xp)
    assert layer.engine == engine
    np.testing.assert_allclose(to_numpy(h.data), gru_unit(*inputs), rtol=1e-12, atol=1e-14)


def test_cont_zero_cuts_the_state():
    h_prev = np.full((1, 2, 3), 5.0)
    x, hh = np.zeros((1, 2, 9)), np.zeros((1, 2, 9))
    layer, bottoms, (h,) = run_layer(SPEC, [h_prev, x, hh, np.array([[0.0, 1.0]])])
    np.testing.assert_allclose(h.data[0, 0], 0.0)  # n = tanh(0) = 0, h' = 0
    np.testing.assert_allclose(h.data[0, 1], 2.5)  # z h' = 0.5 * 5
    h.diff[...] = 1.0
    layer.backward([h], [True, True, True, False], bottoms)
    np.testing.assert_allclose(bottoms[0].diff[0, 0], 0.0)
    np.testing.assert_allclose(bottoms[0].diff[0, 1], 0.5)
    assert not layer.allow_force_backward(3)


@pytest.mark.parametrize("shapes_", [
    [(1, 2, 3), (1, 2, 9), (1, 2, 8), (1, 2)],
    [(1, 2, 3), (1, 2, 12), (1, 2, 9), (1, 2)],
    [(1, 2, 3), (1, 2, 9), (1, 2, 9), (2,)],
])
def test_bad_shapes_name_the_layer_and_bottoms(shapes_):
    with pytest.raises(NetError, match=r"'gru' \(GRUUnit\).*h_prev .*hh 'bottom2'.*\(\.\.\., 3H\)"):
        run_layer(SPEC, [np.zeros(s) for s in shapes_])
