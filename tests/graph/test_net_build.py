"""Building a net: sources, legacy inputs, name resolution, phases and rules, bad input.

Gradients are checked in float64 against finite differences (``unroll.testing``).
"""

import re

import numpy as np
import pytest

from tests.net_helpers import SIMPLE, T2, X, assert_names, f64, inputs, layer
from unroll import NetError
from unroll.core.proto import TEST, TRAIN, NetParameter, PrototxtError, parse_text
from unroll.engine.net import Net
from unroll.graph.rules import filter_layers

# -- building -------------------------------------------------------------------

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
        net = f64(text, keep=keep, plan_memory=False)
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
