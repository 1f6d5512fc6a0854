"""In-place layers: run in place exactly when that is provably safe.

Gradients are checked in float64 against finite differences (``unroll.testing``).
"""


import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.net_helpers import (
    BN_RELU,
    T2,
    X,
    assert_names,
    f64,
    host,
    inputs,
    ip,
    layer,
    loss,
    param_diffs,
    rng,
    run,
)
from unroll import NetError, testing

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
        f64(chain_net(kinds, [False] * len(kinds)), phase=phase, seed=seed,
            plan_memory=False),
        f64(chain_net(kinds, in_place), phase=phase, seed=seed, plan_memory=False),
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
    from unroll.engine.layer import LAYERS, Layer, register_layer

    if "TestSquareReadsBottom" not in LAYERS:

        @register_layer("TestSquareReadsBottom")
        class Square(Layer):
            in_place = True
            backward_reads = ("bottom",)

    with pytest.raises(NetError, match="reads its bottom") as e:
        f64(inputs(x=(4, 3)) + layer("sq", "TestSquareReadsBottom", "x", "x"))
    assert_names(e, "sq", "x")


def test_keep_preserves_a_value_an_in_place_layer_would_overwrite():
    x = X + np.arange(3)
    expected = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5)
    kept = f64(BN_RELU, keep=["bn"], plan_memory=False)
    out = kept.forward(x=x)
    assert (expected < 0).any()
    np.testing.assert_allclose(kept.blobs["bn@0"].data, expected, rtol=1e-10)
    np.testing.assert_allclose(kept.blobs["bn"].data, np.maximum(expected, 0), rtol=1e-10)
    assert not np.shares_memory(kept.blobs["bn@0"].data, kept.blobs["bn@1"].data)
    assert any("keep" in r and "'relu'" in r for r in kept.in_place_fallbacks)

    shared = f64(BN_RELU, plan_memory=False)
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

    in_place = f64(text("a"), seed=7, plan_memory=False)
    out_of_place = f64(text("d"), seed=7, plan_memory=False)
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
    in_place = f64(text("r"), keep=keep, seed=3, plan_memory=False)
    out_of_place = f64(text("d"), keep=keep, seed=3, plan_memory=False)
    assert len(in_place.in_place_fallbacks) == 1
    assert "'rs'" in in_place.in_place_fallbacks[0]
    compare_runs([out_of_place, in_place], [dict(x=X, t=rng.normal(size=(4, 8)))])
    if hazard == "keep":
        W, b = in_place.params["act"][0].data, in_place.params["act"][1].data
        h0 = in_place.blobs["h0"].data
        np.testing.assert_allclose(in_place.blobs["h"].data, h0 @ W.T + b)
