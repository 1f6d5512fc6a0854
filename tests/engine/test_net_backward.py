"""need_backward: which layers and bottoms get gradients (Caffe's rules).

Gradients are checked in float64 against finite differences (``unroll.testing``).
"""


import numpy as np
import pytest

from tests.net_helpers import BN_RELU, SIMPLE, T2, X, f64, inputs, ip, loss, run
from unroll import NetError, testing

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
    net = f64(text, plan_memory=False)
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
    assert net.bottom_need_backward[net.layer_names.index("top")] == (False,)
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
    assert net.bottom_need_backward[net.layer_names.index("ip")] == (False,)
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
    assert net.bottom_need_backward[net.layer_names.index("loss")] == (True, False)
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
