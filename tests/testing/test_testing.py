"""The gradient checkers themselves: they catch wrong backwards, and refuse what they cannot check.

Every gradient test of unroll rests on unroll.testing, so here deliberately
wrong layers (3x for 2x, a dropped term, a param gradient summed over the
wrong axis) must raise GradientMismatch, in the layer checker and in the net
checker, while their correct twins pass.
"""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from unroll.core.proto import FillerParameter
from unroll.engine.layer import Layer, register_layer
from unroll.engine.net import Net
from unroll.frontend.unroller import expand
from unroll.testing import GradientMismatch, check_layer_gradient, check_net_gradient


class _Elementwise(Layer):
    backward_reads = ("bottom",)

    def reshape(self, bottoms, tops):
        tops[0].reshape(bottoms[0].shape)


@register_layer("TestingDouble")
class DoubleLayer(_Elementwise):
    """y = 2x."""

    factor = 2.0

    def forward(self, bottoms, tops):
        tops[0].data[...] = 2 * bottoms[0].data

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            bottoms[0].diff[...] = self.factor * tops[0].diff


@register_layer("TestingDoubleWrong")
class DoubleWrongLayer(DoubleLayer):
    """y = 2x with the backward of 3x."""

    factor = 3.0


@register_layer("TestingSquarePlus")
class SquarePlusLayer(_Elementwise):
    """y = x^2 + x."""

    dropped = False

    def forward(self, bottoms, tops):
        x = bottoms[0].data
        tops[0].data[...] = x * x + x

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            slope = 2 * bottoms[0].data + (0 if self.dropped else 1)
            bottoms[0].diff[...] = slope * tops[0].diff


@register_layer("TestingSquarePlusDropped")
class SquarePlusDroppedLayer(SquarePlusLayer):
    """y = x^2 + x with the backward of x^2 (the + 1 dropped)."""

    dropped = True


@register_layer("TestingChannelScale")
class ChannelScaleLayer(_Elementwise):
    """y[n, c, i] = x[n, c, i] * w[c], w a learned (C,) param."""

    grad_axes = (0, 2)

    def layer_setup(self, bottoms, tops):
        self.param_blob((bottoms[0].shape[1],), FillerParameter(type="uniform", min=-1, max=1))

    def forward(self, bottoms, tops):
        tops[0].data[...] = bottoms[0].data * self.blobs[0].data[None, :, None]

    def backward(self, tops, propagate_down, bottoms):
        gy, x = tops[0].diff, bottoms[0].data
        self.blobs[0].diff += (gy * x).sum(axis=self.grad_axes)
        if propagate_down[0]:
            bottoms[0].diff[...] = gy * self.blobs[0].data[None, :, None]


@register_layer("TestingChannelScaleWrongAxis")
class ChannelScaleWrongAxisLayer(ChannelScaleLayer):
    """The param gradient summed over axes (0, 1) instead of (0, 2): same shape, wrong values."""

    grad_axes = (0, 1)


X = np.random.default_rng(0).uniform(-1, 1, (2, 3, 3))
PAIRS = [("TestingDouble", "TestingDoubleWrong", "bottom 0"),
         ("TestingSquarePlus", "TestingSquarePlusDropped", "bottom 0"),
         ("TestingChannelScale", "TestingChannelScaleWrongAxis", "param 0")]


@pytest.mark.parametrize("right, wrong, blob", PAIRS)
def test_layer_checker_catches_a_wrong_backward(right, wrong, blob):
    check_layer_gradient(f'name: "l" type: "{right}"', [X])
    with pytest.raises(GradientMismatch, match=f"layer 'l' \\({wrong}\\) {blob}"):
        check_layer_gradient(f'name: "l" type: "{wrong}"', [X])


def _net_through(layer_type):
    return Net(f"""
        force_backward: true
        layer {{ name: "in" type: "Input" top: "x" top: "y"
                input_param {{ shape {{ dim: 2 dim: 3 dim: 3 }}
                              shape {{ dim: 2 dim: 3 dim: 3 }} }} }}
        layer {{ name: "l" type: "{layer_type}" bottom: "x" top: "z" }}
        layer {{ name: "loss" type: "EuclideanLoss" bottom: "z" bottom: "y" top: "loss" }}
    """, dtype="float64")


@pytest.mark.parametrize("right, wrong, blob", PAIRS)
def test_net_checker_catches_a_wrong_backward(right, wrong, blob):
    rng = np.random.default_rng(1)
    target = rng.uniform(-1, 1, X.shape)
    good = _net_through(right)
    good.forward(x=X, y=target)
    check_net_gradient(good, wrt=["x"])
    bad = _net_through(wrong)
    bad.forward(x=X, y=target)
    what = "net input 'x'" if blob == "bottom 0" else "param 'l.0'"
    with pytest.raises(GradientMismatch, match=what):
        check_net_gradient(bad, wrt=["x"])


def test_net_checker_refuses_inputs_without_force_backward():
    """Once a false 'analytic 0' mismatch on any net; now a refusal naming force_backward."""
    net_param = expand("lstm", steps=2, batch=1, input_dim=2, hidden=2)
    target = net_param.layer.add(name="target", type="Input", top=["y"])
    target.input_param.shape.add().dim.extend([2, 1, 2])
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "y"], top=["loss"])
    net = Net(net_param, dtype="float64")
    net.forward(x=np.ones((2, 1, 2)), y=np.zeros((2, 1, 2)))
    with pytest.raises(ValueError, match="force_backward"):
        check_net_gradient(net, wrt=["x"])
    check_net_gradient(net)  # the params alone are checkable
    net_param.force_backward = True
    forced = Net(net_param, dtype="float64")
    forced.forward(x=np.ones((2, 1, 2)), y=np.zeros((2, 1, 2)))
    check_net_gradient(forced, wrt=["x"])


BLOCK_HYPOTHESIS = textwrap.dedent("""
    import sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "hypothesis" or name.startswith("hypothesis."):
                raise ImportError(f"blocked: {name}")

    sys.meta_path.insert(0, Block())
""")


def test_testing_imports_and_checks_without_hypothesis():
    code = BLOCK_HYPOTHESIS + textwrap.dedent("""
        import numpy as np
        import unroll.testing as t
        t.check_layer_gradient('type: "TanH"', [np.linspace(-1, 1, 4)])
        try:
            t.shapes()
        except ImportError as e:
            print("strategies:", e)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "strategies: unroll.testing's strategies need hypothesis" in done.stdout
