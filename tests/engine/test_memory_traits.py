"""What a layer tells the memory plan: one MemoryTraits declaration a layer author may skip
(docs/design.md, 2. The net engine and 6. Memory)."""

import sys

import numpy as np
import pytest

from unroll.core.errors import MemoryBudgetError, NetError
from unroll.core.proto import LayerParameter
from unroll.engine.blob import Blob
from unroll.engine.layer import LAYERS, Layer, register_layer
from unroll.engine.memory_traits import BatchedParamGradient, MemoryTraits
from unroll.engine.net import Net

#: a layer of the user's own that declares nothing of the memory plan, as a Python layer
#: module; ``declares`` is what its class body adds
LAYER_MODULE = """
from unroll.engine.layer import Layer
from unroll.engine.memory_traits import MemoryTraits

FORWARDS = []


class Sine(Layer):
    '''y = sin(x): backward reads its bottom.'''
    {declares}

    def reshape(self, bottoms, tops):
        tops[0].reshape(bottoms[0].shape)

    def forward(self, bottoms, tops):
        FORWARDS.append(self.name)
        self.xp.sin(bottoms[0].data, out=tops[0].data)

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            bottoms[0].diff[...] = self.xp.cos(bottoms[0].data) * tops[0].diff
"""

STEPS, N, D = 8, 3, 4


def chain(sine: str, ip: str = "InnerProduct", shared: bool = False) -> str:
    """x -> TanH -> (``ip``, then ``sine``) x STEPS -> EuclideanLoss: a chain a memory budget cuts
    into segments; ``shared``: the ``ip`` share W, whose gradient the net may batch."""
    layers = [f'layer {{ name: "in" type: "Input" top: "x" top: "target" input_param {{ '
              f'shape {{ dim: {N} dim: {D} }} shape {{ dim: {N} dim: {D} }} }} }}',
              'layer { name: "x_in" type: "TanH" bottom: "x" top: "h_in" }']
    bottom = "h_in"
    param = 'param { name: "W" } ' if shared else ""
    for t in range(STEPS):
        layers.append(f'layer {{ name: "ip{t}" type: "{ip}" bottom: "{bottom}" top: "a{t}" '
                      f'{param}inner_product_param {{ num_output: {D} bias_term: false '
                      f'weight_filler {{ type: "gaussian" std: 0.5 }} }} }}')
        layers.append(sine % {"name": f"sine{t}", "bottom": f"a{t}", "top": f"h{t}"})
        bottom = f"h{t}"
    layers.append(f'layer {{ name: "loss" type: "EuclideanLoss" bottom: "{bottom}" '
                  f'bottom: "target" top: "loss" }}')
    return "force_backward: true\n" + "\n".join(layers) + "\n"


def python_sine(module: str) -> str:
    return ('layer { name: "%(name)s" type: "Python" bottom: "%(bottom)s" top: "%(top)s" '
            f'python_param {{ module: "{module}" layer: "Sine" }} }}')


BUILT_IN_SINE = 'layer { name: "%(name)s" type: "TanH" bottom: "%(bottom)s" top: "%(top)s" }'


@pytest.fixture
def sine_module(tmp_path, monkeypatch):
    """A function ``declares -> module name``: the Sine layer with ``declares`` in its class
    body, importable from tmp_path."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made = []

    def make(declares: str = "") -> str:
        name = f"sine_layer_{tmp_path.name.replace('-', '_')}_{len(made)}"
        (tmp_path / f"{name}.py").write_text(LAYER_MODULE.format(declares=declares))
        made.append(name)
        return name

    yield make
    for name in made:
        sys.modules.pop(name, None)


def train_step(net):
    """One forward and backward on fixed inputs: the loss, x's diff, the param diffs."""
    rng = np.random.default_rng(1)
    net.forward(x=rng.uniform(-1, 1, (N, D)), target=rng.uniform(-1, 1, (N, D)))
    net.clear_param_diffs()
    net.backward()
    return (net.loss, np.array(net.blobs["x"].diff),
            [np.array(p.blob.diff) for p in net.learnable_params])


def assert_identical(got, want):
    assert got[0] == want[0]
    np.testing.assert_array_equal(got[1], want[1])
    for a, b in zip(got[2], want[2]):
        np.testing.assert_array_equal(a, b)


def smallest_budget(text) -> int:
    with pytest.raises(MemoryBudgetError) as error:
        Net(text, dtype="float64", memory_budget=1, allow_python_layers=True)
    return error.value.smallest


def test_a_layer_that_declares_nothing_gets_the_safe_defaults():
    class Plain(Layer):
        pass

    traits = Plain.memory
    assert traits is Layer.memory == MemoryTraits()
    assert (traits.shares_bottom, traits.parts_of_whole, traits.passes_diff,
            traits.batched_param_gradient, traits.recomputable) == ((), None, None, None, True)
    # backward reads what backward_reads declares
    layer = Plain(LayerParameter(name="p"))
    assert traits.reads_in_backward(layer, 0, [True])
    Plain.backward_reads = ()
    assert not traits.reads_in_backward(layer, 0, [True])


def test_a_python_layer_that_declares_nothing_plans_runs_and_is_run_again(sine_module):
    module = sine_module()
    text = chain(python_sine(module))
    full = Net(text, dtype="float64", seed=3, allow_python_layers=True)
    want = train_step(full)
    kept = Net(text, dtype="float64", seed=3, allow_python_layers=True, plan_memory=False)
    assert_identical(train_step(kept), want)
    forwards = sys.modules[module].FORWARDS
    forwards.clear()
    net = Net(text, dtype="float64", seed=3, allow_python_layers=True,
              memory_budget=smallest_budget(text))
    assert_identical(train_step(net), want)
    assert len(forwards) > STEPS  # recomputable by default: backward ran some again
    assert net.inspect().recompute["recomputed_steps"] > 0


def test_a_python_layer_that_declares_traits_gets_them(sine_module):
    module = sine_module("memory = MemoryTraits(recomputable=False)")
    text = chain(python_sine(module))
    want = train_step(Net(text, dtype="float64", seed=3, allow_python_layers=True))
    forwards = sys.modules[module].FORWARDS
    forwards.clear()
    net = Net(text, dtype="float64", seed=3, allow_python_layers=True,
              memory_budget=smallest_budget(text))
    assert_identical(train_step(net), want)
    assert len(forwards) == STEPS  # never run again: its values are kept
    assert net.inspect().recompute["recomputed_steps"] > 0  # the InnerProducts are


@register_layer("TestInnerProductSubclass")
class InnerProductSubclass(LAYERS["InnerProduct"]):
    """A user's subclass of a built-in layer that declares nothing: it inherits the
    built-in's memory traits."""


def test_a_user_subclass_inherits_its_layers_traits_and_plans_as_it():
    assert InnerProductSubclass.memory is LAYERS["InnerProduct"].memory
    built_in = Net(chain(BUILT_IN_SINE, shared=True), dtype="float64", seed=3)
    subclass = Net(chain(BUILT_IN_SINE, "TestInnerProductSubclass", shared=True),
                   dtype="float64", seed=3)
    assert_identical(train_step(subclass), train_step(built_in))
    got, want = subclass.inspect(), built_in.inspect()
    assert got.batched_gradients == want.batched_gradients == {"W": STEPS}
    assert got.recompute["planned_bytes"] == want.recompute["planned_bytes"]


def gradient_backward(layer, x, gy):
    """A batched gradient's backward alone, where its BatchedParamGradient belongs."""


BATCHED = "a BatchedParamGradient of three functions, or None"


@pytest.mark.parametrize("field, value, want", [
    ("shares_bottom", ("data", "grad"), 'a tuple of "data" and/or "diff"'),
    ("shares_bottom", "data", 'a tuple of "data" and/or "diff"'),
    ("parts_of_whole", "rows", '"bottoms", "tops" or None'),
    ("passes_diff", True, r"a function \(layer, k\) -> bool, or None"),
    ("reads_in_backward", None, r"a function \(layer, k, bottom_need\) -> bool"),
    ("batched_param_gradient", gradient_backward, BATCHED),
    ("batched_param_gradient", BatchedParamGradient(len, len, None), BATCHED),
    ("recomputable", "no", "True or False"),
])
def test_an_invalid_declaration_is_refused_naming_the_class_and_the_field(field, value, want):
    with pytest.raises(TypeError, match=rf"^Bad\.memory: {field} must be {want}, found ") as e:
        type("Bad", (Layer,), {"memory": MemoryTraits(**{field: value})})
    assert "\n" not in str(e.value)


def test_a_declaration_that_is_no_memory_traits_is_refused():
    with pytest.raises(TypeError, match=r"^Bad\.memory must be a MemoryTraits "
                                        r"\(unroll.engine.memory_traits\), found dict$"):
        type("Bad", (Layer,), {"memory": {"recomputable": False}})


def test_a_python_layer_with_an_invalid_declaration_is_a_one_line_net_error(sine_module):
    module = sine_module('memory = MemoryTraits(parts_of_whole="rows")')
    with pytest.raises(NetError, match=rf"^layer 'sine0' .*importing module '{module}' raised "
                                       r"TypeError: Sine\.memory: parts_of_whole must be ") as e:
        Net(chain(python_sine(module)), allow_python_layers=True)
    assert "\n" not in str(e.value)


def test_an_instance_may_not_change_its_classs_declaration():
    class Mutating(Layer):
        def layer_setup(self, bottoms, tops):
            self.memory = MemoryTraits(recomputable=False)

        def reshape(self, bottoms, tops):
            tops[0].reshape(bottoms[0].shape)

    bottom, top = Blob((2,), np, np.float64, "x"), Blob((), np, np.float64, "y")
    with pytest.raises(TypeError, match=r"Mutating.layer_setup sets \['memory'\]"):
        Mutating(LayerParameter(name="m")).set_up([bottom], [top])
