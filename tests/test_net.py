"""The net engine: building, splits, weight sharing, in-place safety, need_backward, I/O.

Gradients are checked in float64 against finite differences (``unroll.testing``);
in-place and shared nets are compared with their out-of-place and unshared twins.
"""

import os
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import NetError, testing
from unroll.backend import to_numpy
from unroll.net import Net, filter_layers
from unroll.param_store import ParamStore
from unroll.proto import TEST, TRAIN, NetParameter, PrototxtError, parse_text

GAUSS = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 }'


def ip(name, bottom, top, n, extra=""):
    """An InnerProduct layer with random weights and bias."""
    return (
        f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{top}" {extra}\n'
        f"  inner_product_param {{ num_output: {n} {GAUSS} }} }}\n"
    )


def inputs(**shapes):
    """One Input layer named "in" with a top per keyword, of the given shapes."""
    tops = " ".join(f'top: "{n}"' for n in shapes)
    dims = " ".join("shape { " + " ".join(f"dim: {d}" for d in s) + " }" for s in shapes.values())
    return f'layer {{ name: "in" type: "Input" {tops} input_param {{ {dims} }} }}\n'


def layer(name, type_, bottom, top, extra=""):
    return f'layer {{ name: "{name}" type: "{type_}" bottom: "{bottom}" top: "{top}" {extra} }}\n'


def loss(bottom, target="t", name="loss"):
    return (
        f'layer {{ name: "{name}" type: "EuclideanLoss" bottom: "{bottom}" bottom: "{target}" '
        f'top: "{name}" }}\n'
    )


def f64(text, **kwargs):
    return Net(text, dtype="float64", **kwargs)


def host(array):
    return to_numpy(array).copy()


def param_diffs(net):
    return {p.name: host(p.blob.diff) for p in net.learnable_params}


def run(net, **values):
    """One iteration: clear param diffs, forward, backward; returns the loss."""
    net.clear_param_diffs()
    net.forward(**values)
    net.backward()
    return net.loss


rng = np.random.default_rng(0)
X = rng.normal(size=(4, 3))
T2 = rng.normal(size=(4, 2))


# -- building -------------------------------------------------------------------

SIMPLE = inputs(x=(4, 3), t=(4, 2)) + ip("ip", "x", "y", 2) + loss("y")


def test_build_from_text_path_and_message(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(SIMPLE)
    message = parse_text(SIMPLE, NetParameter())
    nets = [
        f64(SIMPLE),
        f64(str(path)),
        f64(path),
        f64(message),
    ]
    losses = [net.forward(x=X, t=T2)["loss"] for net in nets]
    assert all(float(v) == float(losses[0]) for v in losses)
    for net in nets:
        assert net.inputs == ["x", "t"]
        assert net.outputs == ["loss"]
        assert [layer.name for layer in net.layers] == ["in", "ip", "loss"]
        assert set(net.params) == {"ip"}


def test_missing_prototxt_file_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.prototxt"):
        Net(str(tmp_path / "nope.prototxt"))


@pytest.mark.parametrize(
    "header, shape",
    [
        ('input: "x" input_shape { dim: 4 dim: 3 }', (4, 3)),
        ('input: "x" input_dim: 4 input_dim: 3 input_dim: 1 input_dim: 1', (4, 3, 1, 1)),
    ],
)
def test_legacy_net_inputs(header, shape):
    net = f64(header + "\n" + layer("r", "ReLU", "x", "y"))
    assert net.inputs == ["x"]
    assert net.blobs["x"].shape == shape
    out = net.forward(x=X.reshape(shape))["y"]
    np.testing.assert_array_equal(out.reshape(4, 3), np.maximum(X, 0))


def test_legacy_inputs_need_shapes():
    with pytest.raises(NetError, match="input_shape or input_dim"):
        Net('input: "x"')
    with pytest.raises(NetError, match="4 dims per input"):
        Net('input: "x" input_dim: 4 input_dim: 3')


def test_bottom_names_the_most_recent_top():
    # s@0 = x, s@1 = 2 s@0 (in place), z = 3 s: the reader sees the latest version
    scale = 'scale_param {{ filler {{ type: "constant" value: {} }} }} param {{ lr_mult: 0 }}'
    text = (
        inputs(x=(4, 3))
        + layer("copy", "Scale", "x", "s", scale.format(1))
        + layer("double", "Scale", "s", "s", scale.format(2))
        + layer("triple", "Scale", "s", "z", scale.format(3))
    )
    for keep in ((), ("s",)):
        net = f64(text, keep=keep)
        out = net.forward(x=X)
        np.testing.assert_allclose(out["z"], 6 * X)
        np.testing.assert_allclose(net.blobs["s"].data, 2 * X)
        assert net.blobs["s"] is net.blobs["s@1"]
        assert net.blobs.versions("s") == [net.blobs["s@0"], net.blobs["s@1"]]
        if keep:  # kept apart: version 0 still holds the first value
            np.testing.assert_allclose(net.blobs["s@0"].data, X)
        else:
            assert net.blobs["s@0"] is net.blobs["s@1"]
    with pytest.raises(KeyError):
        net.blobs["s@2"]
    with pytest.raises(KeyError):
        net.blobs["nothing"]


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
    net = f64(fan_out_net(3))
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
    net = f64(fan_out_net(readers))
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
    assert [(p.owner, p.index) for p in net.learnable_params] == [("ip1", 0), ("ip1", 1)]


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
        + loss("b")
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


def assert_names(error, *names):
    for name in names:
        assert f"'{name}'" in str(error.value), (name, str(error.value))


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
    net = f64(text)
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


# -- in place ---------------------------------------------------------------------

IN_PLACE_KINDS = {
    "BatchNorm": "batch_norm_param { eps: 0.1 }",
    "Scale": 'scale_param { bias_term: true filler { type: "uniform" min: 0.5 max: 1.5 } '
    'bias_filler { type: "gaussian" std: 0.3 } }',
    "ReLU": "relu_param { negative_slope: 0.1 }",
    "Dropout": "dropout_param { dropout_ratio: 0.3 }",
    "Sigmoid": "",
    "TanH": "",
}


def chain_net(kinds, in_place):
    """x -> ip -> kinds[0] -> ... -> ip_out -> loss; layer i in place where in_place[i]."""
    text = "force_backward: true\n" + inputs(x=(4, 3), t=(4, 2)) + ip("ip", "x", "h", 3)
    prev = "h"
    for i, (kind, inplace) in enumerate(zip(kinds, in_place)):
        top = prev if inplace else f"a{i}"
        text += layer(f"l{i}", kind, prev, top, IN_PLACE_KINDS[kind])
        prev = top
    return text + ip("ip_out", prev, "y", 2) + loss("y")


def compare_runs(nets, batches):
    """Run every net on the same batches; all losses, outputs and gradients must agree."""
    for values in batches:
        results = []
        for net in nets:
            run(net, **values)
            results.append(
                (net.loss, host(net.blobs["y"].data), host(net.blobs["x"].diff), param_diffs(net))
            )
        ref = results[0]
        for res in results[1:]:
            assert res[0] == pytest.approx(ref[0], rel=1e-12, abs=1e-12)
            np.testing.assert_allclose(res[1], ref[1], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(res[2], ref[2], rtol=1e-10, atol=1e-12)
            assert res[3].keys() == ref[3].keys()
            for name in ref[3]:
                np.testing.assert_allclose(res[3][name], ref[3][name], rtol=1e-10, atol=1e-12)


@given(
    chain=st.lists(st.tuples(st.sampled_from(sorted(IN_PLACE_KINDS)), st.booleans()), max_size=6),
    phase=st.sampled_from(["train", "test"]),
    seed=st.integers(0, 2**16),
    x=testing.arrays((4, 3)),
)
def test_in_place_gives_the_out_of_place_results(chain, phase, seed, x):
    kinds = [k for k, _ in chain]
    in_place = [p for _, p in chain]
    nets = [
        f64(chain_net(kinds, [False] * len(kinds)), phase=phase, seed=seed),
        f64(chain_net(kinds, in_place), phase=phase, seed=seed),
    ]
    batches = [dict(x=x, t=T2), dict(x=x[::-1] * 0.5, t=-T2)]
    compare_runs(nets, batches)


@given(
    # smooth layers only: a ReLU kink or a random Dropout mask defeats finite differences
    chain=st.permutations(["BatchNorm", "Scale", "Sigmoid", "TanH"]),
    in_place=st.lists(st.booleans(), min_size=4, max_size=4),
    x=testing.arrays((4, 3)),
)
def test_in_place_chain_gradient_matches_finite_differences(chain, in_place, x):
    net = f64(chain_net(chain, in_place))
    net.set_input("x", x)
    net.set_input("t", T2)
    testing.check_net_gradient(net, wrt=["x"], rtol=1e-4, atol=1e-6)


def test_in_place_layers_share_memory_when_safe():
    kinds = ["BatchNorm", "Scale", "ReLU"]
    net = f64(chain_net(kinds, [True] * 3))
    # all three write into ip's top: no backward reads a value another one overwrites
    blobs = net.blobs.versions("h")
    assert len(blobs) == 4
    assert all(b is blobs[0] for b in blobs)
    assert net.in_place_fallbacks == []


@pytest.mark.parametrize(
    "type_, extra",
    [
        ("InnerProduct", "inner_product_param { num_output: 3 }"),
        ("Softmax", ""),
        ("Embed", "embed_param { num_output: 2 input_dim: 5 }"),
    ],
)
def test_illegal_in_place_is_refused_at_build_time(type_, extra):
    with pytest.raises(NetError, match="in place") as e:
        f64(inputs(x=(4, 3)) + layer("bad", type_, "x", "x", extra))
    assert_names(e, "bad", "x")
    assert type_ in str(e.value)


def test_in_place_layer_whose_backward_reads_its_bottom_is_refused():
    from unroll.layer import LAYERS, Layer, register_layer

    if "TestSquareReadsBottom" not in LAYERS:

        @register_layer("TestSquareReadsBottom")
        class Square(Layer):
            in_place = True
            backward_reads = ("bottom",)

    with pytest.raises(NetError, match="reads its bottom") as e:
        f64(inputs(x=(4, 3)) + layer("sq", "TestSquareReadsBottom", "x", "x"))
    assert_names(e, "sq", "x")


BN_RELU = (
    inputs(x=(4, 3))
    + layer("bn", "BatchNorm", "x", "bn")
    + layer("relu", "ReLU", "bn", "bn")
    + layer("out", "Scale", "bn", "y", "param { lr_mult: 0 }")
)


def test_keep_preserves_a_value_an_in_place_layer_would_overwrite():
    x = X + np.arange(3)
    expected = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5)
    kept = f64(BN_RELU, keep=["bn"])
    out = kept.forward(x=x)
    assert (expected < 0).any()
    np.testing.assert_allclose(kept.blobs["bn@0"].data, expected, rtol=1e-10)
    np.testing.assert_allclose(kept.blobs["bn"].data, np.maximum(expected, 0), rtol=1e-10)
    assert not np.shares_memory(kept.blobs["bn@0"].data, kept.blobs["bn@1"].data)
    assert any("keep" in r and "'relu'" in r for r in kept.in_place_fallbacks)

    shared = f64(BN_RELU)
    np.testing.assert_array_equal(shared.forward(x=x)["y"], out["y"])
    assert shared.blobs["bn@0"] is shared.blobs["bn@1"]
    assert np.shares_memory(shared.blobs["bn@0"].data, shared.blobs["bn"].data)
    assert (shared.blobs["bn@0"].data >= 0).all()
    assert shared.in_place_fallbacks == []


@pytest.mark.parametrize("keep", [(), ("x",)])
def test_an_input_overwritten_in_place_is_still_filled_by_forward(keep):
    # "s" reads x before the in-place ReLU: the ReLU (or keep) forces x@1 out of place,
    # and forward(x=...) must fill the Input's x@0, not the ReLU's output
    text = (
        inputs(x=(4, 3))
        + layer("s", "Scale", "x", "a", 'scale_param { filler { type: "constant" value: 3 } }')
        + layer("relu", "ReLU", "x", "x")
    )
    net = f64(text, keep=keep)
    assert net.blobs["x@0"] is not net.blobs["x@1"]
    for x in (X, X[:2] - 1):
        out = net.forward(x=x)
        np.testing.assert_array_equal(out["a"], 3 * x)
        np.testing.assert_array_equal(out["x"], np.maximum(x, 0))
        np.testing.assert_array_equal(net.blobs["x@0"].data, x)


def test_keep_of_an_unknown_blob_is_an_error():
    with pytest.raises(NetError, match="'nothing'"):
        f64(BN_RELU, keep=["nothing"])


@pytest.mark.parametrize("producer", ["TanH", "Sigmoid", "ReLU", "Softmax"])
def test_producer_reading_its_top_is_not_clobbered(producer):
    # TanH's backward reads its top; an in-place Dropout (train) would overwrite it
    def text(top):
        return (
            "force_backward: true\n"
            + inputs(x=(4, 3), t=(4, 2))
            + ip("ip", "x", "h", 3)
            + layer("act", producer, "h", "a")
            + layer("drop", "Dropout", "a", top, "dropout_param { dropout_ratio: 0.5 }")
            + ip("ip_out", top, "y", 2)
            + loss("y")
        )

    in_place, out_of_place = f64(text("a"), seed=7), f64(text("d"), seed=7)
    assert len(in_place.in_place_fallbacks) == 1
    assert "'drop'" in in_place.in_place_fallbacks[0]
    assert "'act'" in in_place.in_place_fallbacks[0]
    assert out_of_place.in_place_fallbacks == []
    compare_runs([out_of_place, in_place], [dict(x=X, t=T2), dict(x=2 * X, t=T2)])


@pytest.mark.parametrize("hazard", ["fan-out", "keep", "producer"])
def test_in_place_through_a_view_is_checked_too(hazard):
    # r = Reshape(h) is a view of h: writing r in place writes h as well
    act = "TanH" if hazard == "producer" else "InnerProduct"
    extra = "inner_product_param { num_output: 6 }" if act == "InnerProduct" else ""

    def text(top):
        t = "force_backward: true\n" + inputs(x=(4, 3), t=(4, 8))
        t += ip("ip", "x", "h0", 6) + layer("act", act, "h0", "h", extra)
        t += layer("rs", "Reshape", "h", "r", "reshape_param { shape { dim: 0 dim: 2 dim: 3 } }")
        t += layer("drop", "Dropout", "r", top, "dropout_param { dropout_ratio: 0.5 }")
        t += layer("flat", "Flatten", top, "f")
        if hazard == "fan-out":
            t += ip("other", "h", "o", 2)
        else:
            t += ip("other", "h0", "o", 2)
        t += 'layer { name: "cat" type: "Concat" bottom: "f" bottom: "o" top: "y" }\n'
        return t + loss("y")

    keep = ["h"] if hazard == "keep" else []
    in_place = f64(text("r"), keep=keep, seed=3)
    out_of_place = f64(text("d"), keep=keep, seed=3)
    assert len(in_place.in_place_fallbacks) == 1
    assert "'rs'" in in_place.in_place_fallbacks[0]
    compare_runs([out_of_place, in_place], [dict(x=X, t=rng.normal(size=(4, 8)))])
    if hazard == "keep":
        W, b = in_place.params["act"][0].data, in_place.params["act"][1].data
        h0 = in_place.blobs["h0"].data
        np.testing.assert_allclose(in_place.blobs["h"].data, h0 @ W.T + b)


# -- need_backward ------------------------------------------------------------------


def need(net, name):
    return net.layer_need_backward[net.layer_names.index(name)]


def test_layers_not_reaching_the_loss_are_skipped():
    net = f64(
        inputs(x=(4, 3), t=(4, 2)) + ip("side", "x", "s", 3) + ip("main", "x", "y", 2) + loss("y")
    )
    assert not need(net, "side") and need(net, "main")
    run(net, x=X, t=T2)
    assert not net.params["side"][0].diff.any()
    assert net.params["main"][0].diff.any()


def test_propagate_down_false_stops_the_gradient():
    text = (
        inputs(x=(4, 3), t=(4, 2))
        + ip("ip1", "x", "h", 3)
        + ip("ip2", "h", "y", 2, "propagate_down: false")
        + loss("y")
    )
    net = f64(text)
    assert not need(net, "ip1")  # every reader of its top refuses the gradient (Caffe)
    assert need(net, "ip2")
    net.blobs["h"].diff[...] = 7.0
    run(net, x=X, t=T2)
    assert (net.blobs["h"].diff == 7.0).all()  # never written
    assert not net.params["ip1"][0].diff.any()
    assert net.params["ip2"][0].diff.any()


def test_propagate_down_per_bottom():
    text = (
        inputs(x=(4, 3), z=(4, 3))
        + ip("ipa", "x", "a", 2)
        + ip("ipb", "z", "b", 2)
        + 'layer { name: "loss" type: "EuclideanLoss" bottom: "a" bottom: "b" top: "loss" '
        "propagate_down: true propagate_down: false }\n"
    )
    net = f64(text)
    assert need(net, "ipa") and not need(net, "ipb")
    run(net, x=X, z=X[::-1])
    assert net.params["ipa"][0].diff.any()
    assert not net.params["ipb"][0].diff.any()


def test_propagate_down_count_must_match_the_bottoms():
    with pytest.raises(NetError, match="propagate_down"):
        f64(
            inputs(x=(4, 3), t=(4, 2))
            + ip("ip", "x", "y", 2, "propagate_down: true propagate_down: false")
            + loss("y")
        )


def test_lr_mult_zero_params_need_no_backward():
    frozen = "param { lr_mult: 0 } param { lr_mult: 0 }"
    net = f64(
        inputs(x=(4, 3), t=(4, 2))
        + ip("frozen", "x", "h", 3, frozen)
        + ip("top", "h", "y", 2)
        + loss("y")
    )
    assert not need(net, "frozen") and need(net, "top")
    assert net._bottom_need[net.layer_names.index("top")] == [False]
    run(net, x=X, t=T2)
    assert not net.params["frozen"][0].diff.any()
    assert [p.lr_mult for p in net.learnable_params] == [0.0, 0.0, 1.0, 1.0]

    # frozen between two learned layers: it still passes the gradient down
    net = f64(
        inputs(x=(4, 3), t=(4, 2))
        + ip("low", "x", "g", 3)
        + ip("frozen", "g", "h", 3, frozen)
        + ip("top", "h", "y", 2)
        + loss("y")
    )
    assert need(net, "frozen")
    run(net, x=X, t=T2)
    assert net.params["low"][0].diff.any()


def test_batch_norm_statistics_are_not_learned():
    # Caffe masks BatchNorm's mean, variance and factor from the solver: lr_mult 0, no decay
    net = f64(BN_RELU)
    assert [(p.owner, p.lr_mult, p.decay_mult) for p in net.learnable_params] == [
        ("bn", 0.0, 0.0),
        ("bn", 0.0, 0.0),
        ("bn", 0.0, 0.0),
        ("out", 0.0, 1.0),
    ]
    assert not any(net.layer_need_backward)


def test_input_gets_a_diff_only_with_force_backward():
    net = f64(SIMPLE)
    assert net._bottom_need[net.layer_names.index("ip")] == [False]
    net.blobs["x"].diff[...] = 7.0
    run(net, x=X, t=T2)
    assert (net.blobs["x"].diff == 7.0).all()

    forced = f64("force_backward: true\n" + SIMPLE)
    run(forced, x=X, t=T2)
    assert forced.blobs["x"].diff.any()
    testing.check_net_gradient(forced, wrt=["x"])


def test_force_backward_gives_labels_no_gradient():
    text = (
        "force_backward: true\n"
        + inputs(x=(4, 3), label=(4,))
        + ip("ip", "x", "s", 3)
        + 'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "s" bottom: "label" top: "loss" }'
    )
    net = f64(text)
    assert net._bottom_need[net.layer_names.index("loss")] == [True, False]
    net.set_input("x", X)
    net.set_input("label", [0, 1, 2, 1])
    testing.check_net_gradient(net, wrt=["x"])


def test_loss_weight():
    base = f64(SIMPLE)
    heavy = f64(SIMPLE.replace('top: "loss" }', 'top: "loss" loss_weight: 2.5 }'))
    run(base, x=X, t=T2)
    run(heavy, x=X, t=T2)
    assert heavy.loss == pytest.approx(2.5 * base.loss)
    np.testing.assert_allclose(heavy.params["ip"][0].diff, 2.5 * base.params["ip"][0].diff)

    off = f64(SIMPLE.replace('top: "loss" }', 'top: "loss" loss_weight: 0 }'))
    run(off, x=X, t=T2)
    assert off.loss == 0 and not any(off.layer_need_backward)

    # any top may carry a loss weight: the loss is then weight * sum(top)
    net = f64(inputs(x=(4, 3)) + ip("ip", "x", "y", 2, "loss_weight: 0.5"))
    net.forward(x=X)
    assert net.loss == pytest.approx(0.5 * net.blobs["y"].data.sum())
    net.set_input("x", X)
    testing.check_net_gradient(net)


# -- phases, stages, levels ----------------------------------------------------------


def rule_net(rule, state=""):
    return parse_text(
        f"state {{ {state} }}\n" + inputs(x=(2, 3)) + layer("r", "ReLU", "x", "y", rule),
        NetParameter(),
    )


@pytest.mark.parametrize(
    "rule, state, in_train, in_test",
    [
        ("", "", True, True),
        ("include { phase: TRAIN }", "", True, False),
        ("include { phase: TEST }", "", False, True),
        ("exclude { phase: TEST }", "", True, False),
        ("include { phase: TRAIN } include { phase: TEST }", "", True, True),
        ('include { stage: "deploy" }', "", False, False),
        ('include { stage: "deploy" }', 'stage: "deploy"', True, True),
        ('include { stage: "a" stage: "b" }', 'stage: "a"', False, False),
        ('include { stage: "a" stage: "b" }', 'stage: "a" stage: "b"', True, True),
        ('include { not_stage: "deploy" }', 'stage: "deploy"', False, False),
        ('exclude { stage: "deploy" }', 'stage: "deploy"', False, False),
        ("include { min_level: 2 }", "level: 1", False, False),
        ("include { min_level: 2 }", "level: 2", True, True),
        ("include { max_level: 2 }", "level: 3", False, False),
        ("include { phase: TEST min_level: 1 }", "level: 1", False, True),
    ],
)
def test_include_exclude_rules(rule, state, in_train, in_test):
    message = rule_net(rule, state)
    for phase, phase_name, wanted in ((TRAIN, "train", in_train), (TEST, "test", in_test)):
        names = [lp.name for lp in filter_layers(message, phase)]
        assert ("r" in names) == wanted
        assert ("r" in Net(message, phase=phase_name).layer_names) == wanted


def test_include_and_exclude_together_is_an_error():
    with pytest.raises(NetError, match="'r'"):
        Net(rule_net("include { phase: TRAIN } exclude { phase: TEST }"))


def test_unknown_phase_is_an_error():
    with pytest.raises(ValueError, match="phase"):
        Net(SIMPLE, phase="deploy")


# -- bad input ------------------------------------------------------------------------


def test_malformed_prototxt_names_the_line(tmp_path):
    text = SIMPLE + 'layer {\n  name: "oops"\n  type: ReLU\n}\n'
    line = text.splitlines().index("  type: ReLU") + 1
    with pytest.raises(PrototxtError, match=rf"<prototxt>:{line}:") as e:
        Net(text)
    assert "type: ReLU" in str(e.value)
    path = tmp_path / "bad.prototxt"
    path.write_text(text)
    with pytest.raises(PrototxtError, match=rf"{re.escape(str(path))}:{line}:"):
        Net(path)
    with pytest.raises(PrototxtError, match=':2:.*no field named "bogus"'):
        Net('layer { name: "a"\n  bogus: 1 }')


def test_unknown_layer_type():
    with pytest.raises(NetError, match="unknown layer type 'Convolutionz'") as e:
        Net(inputs(x=(2, 3)) + layer("conv", "Convolutionz", "x", "y"))
    assert_names(e, "conv")


def test_undefined_bottom():
    with pytest.raises(NetError, match="not produced") as e:
        Net(inputs(x=(2, 3)) + layer("r", "ReLU", "x", "y") + layer("s", "ReLU", "z", "w"))
    assert_names(e, "s", "z")


def test_bottom_defined_only_below_is_undefined():
    with pytest.raises(NetError, match="not produced") as e:
        Net(inputs(x=(2, 3)) + layer("s", "ReLU", "y", "w") + layer("r", "ReLU", "x", "y"))
    assert_names(e, "s", "y")


def test_duplicate_top():
    with pytest.raises(NetError, match="already produced") as e:
        Net(inputs(x=(2, 3)) + layer("r1", "ReLU", "x", "y") + layer("r2", "TanH", "x", "y"))
    assert_names(e, "r2", "y", "r1")


def test_duplicate_layer_name():
    with pytest.raises(NetError, match="'r'"):
        Net(inputs(x=(2, 3)) + layer("r", "ReLU", "x", "y") + layer("r", "TanH", "y", "z"))


def test_wrong_number_of_bottoms():
    with pytest.raises(NetError, match="'loss'.*bottoms"):
        Net(inputs(x=(2, 3)) + layer("loss", "EuclideanLoss", "x", "l"))


def test_inner_product_fed_a_wrong_k_after_reshape():
    net = f64(SIMPLE)
    net.forward(x=X, t=T2)
    with pytest.raises(NetError, match="K = 3") as e:
        net.forward(x=np.zeros((4, 5)), t=T2)
    assert_names(e, "ip", "x")
    assert "(4, 5)" in str(e.value)


def test_eltwise_with_different_shapes():
    text = (
        inputs(x=(4, 3), z=(3, 4))
        + 'layer { name: "sum" type: "Eltwise" bottom: "x" bottom: "z" top: "s" }'
    )
    with pytest.raises(NetError) as e:
        Net(text)
    assert_names(e, "sum", "x", "z")
    assert "(4, 3)" in str(e.value) and "(3, 4)" in str(e.value)


def test_setting_an_unknown_input():
    with pytest.raises(NetError, match="'h'"):
        f64(SIMPLE).forward(h=X)


# -- weights: to_proto, copy_from, save ------------------------------------------------

SHARED_IO = (
    inputs(x=(4, 3))
    + ip("ip1", "x", "h1", 3, 'param { name: "w" } param { name: "b" }')
    + ip("ip2", "h1", "h2", 3, 'param { name: "w" } param { name: "b" }')
    + ip("ip3", "h2", "h3", 3, 'param { name: "w" } param { name: "b3" }')
    + ip("ip4", "h3", "y", 2)
)


def test_weights_round_trip_through_a_caffemodel(tmp_path):
    source = f64(SHARED_IO, seed=0)
    path = tmp_path / "snap" / "w.caffemodel"
    source.save(path)
    fresh = f64(SHARED_IO, seed=1)
    assert not np.allclose(fresh.params["ip1"][0].data, source.params["ip1"][0].data)
    fresh.copy_from(str(path))
    for a, b in zip(source.learnable_params, fresh.learnable_params):
        assert a.name == b.name
        np.testing.assert_array_equal(a.blob.data, b.blob.data)
    np.testing.assert_array_equal(fresh.forward(x=X)["y"], source.forward(x=X)["y"])

    # float32 nets write Caffe's float data; a NetParameter loads as well as a path
    single, other = Net(SHARED_IO), Net(SHARED_IO, seed=5)
    other.copy_from(single.to_proto())
    np.testing.assert_array_equal(other.params["ip4"][0].data, single.params["ip4"][0].data)


def test_caffemodel_leaves_out_layers_whose_params_are_all_shared():
    proto = f64(SHARED_IO).to_proto()
    assert [lp.name for lp in proto.layer] == ["ip1", "ip3", "ip4"]
    assert [len(lp.blobs) for lp in proto.layer] == [2, 2, 2]


def test_copy_from_mismatches():
    source = f64(SHARED_IO).to_proto()
    source.layer[2].blobs[0].shape.dim[:] = [1, 6]
    with pytest.raises(NetError, match="'ip4'.*shape"):
        f64(SHARED_IO).copy_from(source)
    other = parse_text(ip("elsewhere", "x", "y", 2), NetParameter())
    other.layer[0].blobs.add().CopyFrom(source.layer[0].blobs[0])
    f64(SHARED_IO).copy_from(other)  # layers this net lacks are skipped, as in Caffe
    with pytest.raises(NetError, match="'elsewhere'"):
        f64(SHARED_IO).copy_from(other, strict=True)


def test_save_is_atomic(tmp_path, monkeypatch):
    net = f64(SHARED_IO)
    path = tmp_path / "w.caffemodel"
    path.write_bytes(b"previous snapshot")

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        net.save(path)
    assert path.read_bytes() == b"previous snapshot"
    assert os.listdir(tmp_path) == ["w.caffemodel"]  # no half-written temp file left
    monkeypatch.undo()
    net.save(path)
    assert os.listdir(tmp_path) == ["w.caffemodel"]
    loaded = NetParameter()
    loaded.ParseFromString(path.read_bytes())
    assert loaded == net.to_proto()


# -- reshape -------------------------------------------------------------------------

RESHAPE = (
    "force_backward: true\n"
    + inputs(x=(4, 3), t=(4, 2))
    + ip("ip", "x", "h", 5)
    + layer("bn", "BatchNorm", "h", "h")
    + layer("relu", "ReLU", "h", "h")
    + ip("ip2", "h", "y", 2)
    + loss("y")
)


def arrays_of(net):
    out = [a for blob in net.blobs.values() for a in (blob.data, blob.diff)]
    return out + [a for p in net.learnable_params for a in (p.blob.data, p.blob.diff)]


def test_forward_with_the_same_shape_allocates_nothing():
    net = f64(RESHAPE)
    run(net, x=X, t=T2)
    before = arrays_of(net)
    run(net, x=X * 2, t=T2)
    run(net)
    after = arrays_of(net)
    assert len(before) == len(after)
    assert all(a is b for a, b in zip(before, after))


def test_forward_with_a_new_shape_reallocates_and_works():
    net = f64(RESHAPE)
    run(net, x=X, t=T2)
    x, t = (
        np.random.default_rng(2).normal(size=(7, 3)),
        np.random.default_rng(3).normal(size=(7, 2)),
    )
    out = run(net, x=x, t=t)
    assert net.blobs["y"].shape == (7, 2) and net.blobs["h"].shape == (7, 5)
    fresh = f64(RESHAPE.replace("dim: 4", "dim: 7"))
    fresh.copy_from(net.to_proto())
    # BatchNorm's running statistics differ, but train-phase output uses batch statistics
    assert run(fresh, x=x, t=t) == pytest.approx(out, rel=1e-12)
    np.testing.assert_allclose(net.blobs["x"].diff, fresh.blobs["x"].diff, rtol=1e-10)
    back = run(net, x=X, t=T2)
    assert net.blobs["y"].shape == (4, 2) and np.isfinite(back)


# -- devices --------------------------------------------------------------------------


def test_a_net_gives_the_same_results_on_every_device(xp):
    from unroll.backend import device_of

    text = "force_backward: true\n" + SHARED_IO + ip("head", "y", "p", 2) + loss("p")
    text = text.replace(inputs(x=(4, 3)), inputs(x=(4, 3), t=(4, 2)))
    cpu, net = f64(text), f64(text, device=device_of(xp))
    assert net.xp is xp
    for values in (dict(x=X, t=T2), dict(x=-X, t=T2)):
        assert run(net, **values) == pytest.approx(run(cpu, **values), rel=1e-10)
        np.testing.assert_allclose(host(net.blobs["x"].diff), cpu.blobs["x"].diff, rtol=1e-10)
        for a, b in zip(net.learnable_params, cpu.learnable_params):
            np.testing.assert_allclose(host(a.blob.diff), b.blob.diff, rtol=1e-10, atol=1e-14)
