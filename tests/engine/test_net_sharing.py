"""Splits (a reader each, gradients summed) and weight sharing by param name.

Gradients are checked in float64 against finite differences (``unroll.testing``).
"""


import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.net_helpers import T2, X, assert_names, f64, host, inputs, ip, layer, loss, run
from unroll import NetError, testing
from unroll.engine.param_store import ParamStore

# -- splits ---------------------------------------------------------------------


def fan_out_net(readers, force=True):
    """h = ip(x) read by ``readers`` different layers, their outputs summed into the loss."""
    kinds = ["TanH", "Sigmoid", "ReLU", "InnerProduct"]
    text = ("force_backward: true\n" if force else "") + inputs(x=(4, 3), t=(4, 2))
    text += ip("ip", "x", "h", 2)
    tops = []
    for k in range(readers):
        kind = kinds[k % len(kinds)]
        if kind == "InnerProduct":
            text += ip(f"r{k}", "h", f"a{k}", 2)
        else:
            text += layer(f"r{k}", kind, "h", f"a{k}")
        tops.append(f"a{k}")
    text += (
        'layer { name: "sum" type: "Eltwise" '
        + " ".join(f'bottom: "{t}"' for t in tops)
        + ' top: "s" }\n'
        + loss("s")
    )
    return text


def test_split_naming_and_memory():
    net = f64(fan_out_net(3), plan_memory=False)
    names = [layer.name for layer in net.layers_run]
    assert names[:3] == ["in", "ip", "h_ip_0_split"]
    split = net.layers_run[2]
    assert split.type == "Split"
    tops = [net.blobs[f"h_ip_0_split_{k}"] for k in range(3)]
    net.forward(x=X, t=T2)
    for top in tops:
        assert np.shares_memory(top.data, net.blobs["h"].data)
        assert not np.shares_memory(top.diff, net.blobs["h"].diff)
    assert not np.shares_memory(tops[0].diff, tops[1].diff)
    # the Input layer's x (read once) and t (read once) get no split
    assert not any("x_in" in n or "t_in" in n for n in names)


@given(readers=st.integers(2, 4), x=testing.arrays((4, 3)))
def test_split_backward_sums_the_readers_gradients(readers, x):
    net = f64(fan_out_net(readers), plan_memory=False)
    net.forward(x=x, t=T2)
    net.backward()
    total = sum(host(net.blobs[f"h_ip_0_split_{k}"].diff) for k in range(readers))
    np.testing.assert_allclose(net.blobs["h"].diff, total, rtol=1e-12, atol=1e-12)
    testing.check_net_gradient(net, wrt=["x"])


# -- weight sharing -------------------------------------------------------------


def shared_net(T, shared=True, force=False):
    """T InnerProducts (one per "timestep" input x{t}); shared by name or not."""
    shapes = {f"x{t}": (2, 3) for t in range(T)}
    text = ("force_backward: true\n" if force else "") + inputs(**shapes, t=(2, 2 * T))
    spec = 'param { name: "w" } param { name: "b" }' if shared else ""
    for t in range(T):
        text += ip(f"ip{t}", f"x{t}", f"h{t}", 2, spec)
        text += layer(f"act{t}", "TanH", f"h{t}", f"a{t}")
    text += (
        'layer { name: "cat" type: "Concat" '
        + " ".join(f'bottom: "a{t}"' for t in range(T))
        + ' top: "y" }\n'
        + loss("y")
    )
    return text


def test_shared_layers_on_one_bottom_give_identical_tops():
    spec = 'param { name: "w" } param { name: "b" }'
    net = f64(inputs(x=(4, 3)) + ip("ip1", "x", "y1", 5, spec) + ip("ip2", "x", "y2", 5, spec))
    out = net.forward(x=X)
    np.testing.assert_array_equal(out["y1"], out["y2"])
    assert np.abs(out["y1"]).sum() > 0
    assert [p.name for p in net.learnable_params] == ["w", "b"]
    assert [p.owner for p in net.learnable_params] == ["ip1", "ip1"]


@given(T=st.integers(2, 4), data=st.data())
def test_owner_diff_is_the_sum_of_the_unshared_gradients(T, data):
    values = {f"x{t}": data.draw(testing.arrays((2, 3)), f"x{t}") for t in range(T)}
    values["t"] = data.draw(testing.arrays((2, 2 * T)), "t")
    shared, unshared = f64(shared_net(T)), f64(shared_net(T, shared=False))
    for t in range(T):
        for k in range(2):
            unshared.params[f"ip{t}"][k].data[...] = shared.params["ip0"][k].data
    assert run(shared, **values) == pytest.approx(run(unshared, **values), rel=1e-12)
    owners = {p.name: p for p in shared.learnable_params}
    assert set(owners) == {"w", "b"}
    for k, name in enumerate(["w", "b"]):
        total = sum(host(unshared.params[f"ip{t}"][k].diff) for t in range(T))
        np.testing.assert_allclose(owners[name].blob.diff, total, rtol=1e-10, atol=1e-12)


@given(T=st.integers(1, 3), x=testing.arrays((2, 3)))
def test_shared_weight_gradient_matches_finite_differences(T, x):
    net = f64(shared_net(T, force=True))
    for t in range(T):
        net.set_input(f"x{t}", x * (t + 1))
    net.set_input("t", np.linspace(-1, 1, 4 * T).reshape(2, 2 * T))
    testing.check_net_gradient(net, wrt=["x0"])


def test_sharers_hold_one_data_and_one_diff_buffer():
    T = 5
    net = f64(shared_net(T))
    w, b = (p.blob for p in net.learnable_params)
    for t in range(T):
        assert net.params[f"ip{t}"][0] is w
        assert net.params[f"ip{t}"][1] is b
    one = f64(shared_net(1))
    assert net.store.nbytes == one.store.nbytes == 2 * (w.data.nbytes + b.data.nbytes)
    run(net, **{f"x{t}": X[:2] for t in range(T)}, t=np.zeros((2, 2 * T)))
    for t in range(T):
        assert np.shares_memory(net.params[f"ip{t}"][0].diff, w.diff)


def test_owner_outside_the_loss_is_still_updated():
    # ip_a owns "w" but its output reaches no loss; ip_b shares "w" and feeds the loss
    spec = 'param { name: "w" } param { name: "b" }'
    net = f64(
        inputs(x=(4, 3), t=(4, 2))
        + ip("ip_a", "x", "a", 2, spec)
        + ip("ip_b", "x", "b", 2, spec)
        + loss("b"),
        plan_memory=False,
    )
    assert net.outputs == ["a", "loss"]
    assert net.layer_need_backward[net.layer_names.index("ip_a")] is False
    out = net.forward(x=X, t=T2)
    before = host(out["a"])
    net.clear_param_diffs()
    net.backward()
    owner = {p.name: p for p in net.learnable_params}
    assert owner["w"].owner == "ip_a"
    assert np.abs(owner["w"].blob.diff).sum() > 0
    assert np.abs(owner["b"].blob.diff).sum() > 0
    for p in net.learnable_params:  # plain SGD through the owners
        p.blob.data[...] -= 0.1 * p.blob.diff
    out = net.forward(x=X, t=T2)
    W, bias = (p.blob.data for p in net.learnable_params)
    np.testing.assert_allclose(out["a"], X @ W.T + bias)
    np.testing.assert_allclose(net.blobs["b"].data, out["a"])
    assert not np.allclose(out["a"], before)


def two_sharers(spec1, spec2, n1=3, n2=3, k2=3):
    return (
        inputs(x=(4, 3), z=(4, k2))
        + ip("ip1", "x", "y1", n1, spec1)
        + ip("ip2", "z", "y2", n2, spec2)
    )


def test_shape_mismatch_is_refused():
    with pytest.raises(NetError, match="shape mismatch") as e:
        f64(two_sharers('param { name: "w" }', 'param { name: "w" }', n2=4))
    assert_names(e, "w", "ip1", "ip2")
    assert "(3, 3)" in str(e.value) and "(4, 3)" in str(e.value)


def test_permissive_count_mismatch_is_refused():
    spec = 'param { name: "w" share_mode: PERMISSIVE }'
    with pytest.raises(NetError, match="count mismatch") as e:
        f64(two_sharers(spec, spec, n2=4))
    assert_names(e, "w", "ip1", "ip2")


@pytest.mark.parametrize("mult", ["lr_mult", "decay_mult"])
def test_multiplier_mismatch_is_refused(mult):
    with pytest.raises(NetError, match=f"{mult} mismatch") as e:
        f64(two_sharers(f'param {{ name: "w" {mult}: 1 }}', f'param {{ name: "w" {mult}: 2 }}'))
    assert_names(e, "w", "ip1", "ip2")


def test_multiplier_set_on_one_side_only_is_adopted():
    net = f64(two_sharers('param { name: "w" }', 'param { name: "w" lr_mult: 2 decay_mult: 0 }'))
    w = net.learnable_params[0]
    assert (w.name, w.lr_mult, w.decay_mult) == ("w", 2.0, 0.0)


def test_permissive_sharing_with_another_shape_of_the_same_count():
    # ip1 holds W (2, 6); ip2 (K = 4, 3 outputs) sees the same 12 numbers as (3, 4)
    spec = 'param { name: "w" share_mode: PERMISSIVE } param { lr_mult: 1 }'
    text = (
        "force_backward: true\n"
        + inputs(x=(4, 6), z=(4, 4), t=(4, 5))
        + ip("ip1", "x", "y1", 2, spec)
        + ip("ip2", "z", "y2", 3, spec)
        + 'layer { name: "cat" type: "Concat" bottom: "y1" bottom: "y2" top: "y" }\n'
        + loss("y")
    )
    net = f64(text, plan_memory=False)
    w1, w2 = net.params["ip1"][0], net.params["ip2"][0]
    assert (w1.shape, w2.shape) == ((2, 6), (3, 4))
    assert np.shares_memory(w1.data, w2.data) and np.shares_memory(w1.diff, w2.diff)
    np.testing.assert_array_equal(w2.data, w1.data.reshape(3, 4))
    assert [p.name for p in net.learnable_params] == ["w", "ip1.1", "ip2.1"]
    r = np.random.default_rng(3)
    out = net.forward(x=r.normal(size=(4, 6)), z=r.normal(size=(4, 4)), t=r.normal(size=(4, 5)))
    np.testing.assert_allclose(
        net.blobs["y2"].data,
        net.blobs["z"].data @ w1.data.reshape(3, 4).T + net.params["ip2"][1].data,
    )
    assert np.isfinite(out["loss"])
    testing.check_net_gradient(net, wrt=["z"])


def test_nets_over_one_param_store_share_the_weights():
    store = ParamStore()
    spec = 'param { name: "w" } param { name: "b" }'
    a = f64(inputs(x=(4, 3)) + ip("ip", "x", "y", 2, spec), param_store=store)
    b = f64(inputs(x=(6, 3)) + ip("ip", "x", "y", 2, spec), param_store=store)
    assert a.params["ip"][0] is b.params["ip"][0]
    assert [p.name for p in b.learnable_params] == ["w", "b"]
    with pytest.raises(NetError, match="no name"):
        f64(inputs(x=(4, 3)) + ip("ip", "x", "y", 2), param_store=store)
