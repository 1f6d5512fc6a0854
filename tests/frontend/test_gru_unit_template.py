"""The ``gru`` template (GRUUnit) against ``gru_primitive`` (the same step in primitive layers).

The two unrolled nets have the same params and must give the same outputs and
gradients for any sizes, lengths, direction and depth; the fused net also
passes a finite-difference check of its own. (tests/frontend/test_templates.py holds
``gru`` to a step-by-step NumPy recurrence.)
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.net_helpers import assert_nets_agree
from unroll.engine.kernels import ENGINE_VARIABLE, ENGINES
from unroll.engine.net import Net
from unroll.frontend.unroller import expand
from unroll.testing import check_net_gradient
from unroll.train.bucketing import cont_from_lengths


def gru_net(template, T, N, D, H, **kw):
    net_param = expand(template, steps=T, batch=N, input_dim=D, hidden=H, **kw)
    net_param.force_backward = True  # no loss layer: the diff of h is set by the test
    return Net(net_param, dtype="float64")



@st.composite
def cases(draw):
    T, N = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    return dict(T=T, N=N, D=draw(st.integers(1, 4)), H=draw(st.integers(1, 4)),
                lengths=draw(st.lists(st.integers(1, T), min_size=N, max_size=N)),
                seed=draw(st.integers(0, 2**32 - 1)))


@pytest.mark.parametrize("engine", ENGINES)
@given(case=cases(), direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
       layers=st.integers(1, 2))
def test_gru_equals_gru_primitive(engine, case, direction, layers):
    T, N, D, H = case["T"], case["N"], case["D"], case["H"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENGINE_VARIABLE, engine)
        fused = gru_net("gru", T, N, D, H, direction=direction, layers=layers)
    primitive = gru_net("gru_primitive", T, N, D, H, direction=direction, layers=layers)
    assert_nets_agree(primitive, fused, np.random.default_rng(case["seed"]),
                      cont_from_lengths(case["lengths"], T))


def test_gru_steps_are_one_unit_each():
    types = [layer.type for layer in expand("gru", steps=3, batch=2, input_dim=2,
                                            hidden=2).layer]
    assert types.count("GRUUnit") == 3
    assert not {"Sigmoid", "TanH", "Eltwise"} & set(types)
    primitive = [layer.type for layer in expand("gru_primitive", steps=3, batch=2, input_dim=2,
                                                hidden=2).layer]
    assert "GRUUnit" not in primitive and primitive.count("Sigmoid") == 6


def test_fused_gru_net_gradient():
    """Finite differences of a Euclidean loss on h w.r.t. x and every param, fused engine."""
    net_param = expand("gru", steps=3, batch=2, input_dim=2, hidden=3, direction="bidirectional")
    target = net_param.layer.add(name="target", type="Input", top=["target"])
    target.input_param.shape.add(dim=[3, 2, 6])
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"], top=["loss"])
    net_param.force_backward = True  # a gradient for the input x too
    net = Net(net_param, dtype="float64")
    assert {layer.engine for layer in net.layers if layer.type == "GRUUnit"} == {"fused"}
    rng = np.random.default_rng(0)
    for p in net.learnable_params:
        p.blob.data[...] = rng.uniform(-0.8, 0.8, p.blob.shape)
    for name in ("x", "target"):
        net.blobs[name].data[...] = rng.uniform(-1, 1, net.blobs[name].shape)
    net.blobs["cont"].data[...] = cont_from_lengths([3, 2], 3)
    check_net_gradient(net, wrt=["x"])
