"""The layer contract: Caffe's SetUp sequence and class-level contract attributes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unroll import Net, NetError, expand, testing
from unroll.core.proto import LayerParameter
from unroll.engine import trace
from unroll.engine.blob import Blob
from unroll.engine.layer import CONTRACT, LAYERS, Layer

X = np.random.default_rng(0).normal(size=(4, 3))


def blobs(*shapes):
    return [Blob(s, np, np.float64, f"b{i}") for i, s in enumerate(shapes)]


def test_set_up_checks_counts_then_sets_up_then_reshapes():
    calls = []

    class Traced(Layer):
        def layer_setup(self, bottoms, tops):
            calls.append(("layer_setup", bottoms[0].shape, tops[0].shape))

        def reshape(self, bottoms, tops):
            calls.append(("reshape",))
            tops[0].reshape(bottoms[0].shape)

    layer = Traced(LayerParameter(name="t"), dtype=np.float64)
    bottom, top = blobs((2, 3), ())
    layer.set_up([bottom], [top])
    assert calls == [("layer_setup", (2, 3), ()), ("reshape",)]
    assert top.shape == (2, 3)
    calls.clear()
    with pytest.raises(NetError, match=r"layer 't' \(\?\): takes 1 tops, found 2"):
        layer.set_up([bottom], blobs((), ()))
    assert calls == []


def test_set_up_cannot_be_overridden():
    with pytest.raises(TypeError, match="Sneaky overrides set_up; override layer_setup"):
        class Sneaky(Layer):
            def set_up(self, bottoms, tops):
                pass


def test_a_contract_changed_in_layer_setup_is_refused():
    class Mutating(Layer):
        def layer_setup(self, bottoms, tops):
            self.backward_reads = ("top",)

        def reshape(self, bottoms, tops):
            tops[0].reshape(bottoms[0].shape)

    with pytest.raises(TypeError, match=r"Mutating.layer_setup sets \['backward_reads'\]"):
        Mutating(LayerParameter(name="m")).set_up(*map(list, zip(blobs((2,), ()))))


def test_built_in_layers_keep_their_contract_on_the_class():
    tagger = expand("tagger", steps=3, batch=2, vocab=7, tags=4, embed=5, hidden=4)
    net = Net(tagger, dtype="float64")
    types = {layer.type for layer in net.layers}
    assert {"Embed", "InnerProduct", "LSTMUnit", "Scale", "SoftmaxWithLoss"} <= types
    for layer in net.layers:
        assert [a for a in CONTRACT if a in vars(layer)] == [], layer
        assert LAYERS[layer.type] is type(layer)


def test_a_layer_without_rng_draws_on_its_own_device():
    layer = LAYERS["Dropout"](LayerParameter(name="d", type="Dropout"))
    assert isinstance(layer.rng, np.random.Generator)
    traced = LAYERS["Dropout"](LayerParameter(name="d", type="Dropout"), xp=trace)
    assert isinstance(traced.rng, trace.Generator)


# -- Scale's contract is static ---------------------------------------------------------


def scale_net(top, relu_in_place=False):
    """x -> ip -> h -> Scale (learned, top ``top``) -> ip_out -> loss; optionally ReLU on h."""
    relu = (
        'layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }\n' if relu_in_place else ""
    )
    return f"""
force_backward: true
layer {{ name: "in" type: "Input" top: "x" top: "t"
        input_param {{ shape {{ dim: 4 dim: 3 }} shape {{ dim: 4 dim: 2 }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "x" top: "h"
        inner_product_param {{ num_output: 3 weight_filler {{ type: "gaussian" std: 1 }} }} }}
layer {{ name: "sc" type: "Scale" bottom: "h" top: "{top}"
        scale_param {{ bias_term: true filler {{ type: "gaussian" std: 1 }} }} }}
{relu}layer {{ name: "ip_out" type: "InnerProduct" bottom: "{top}" top: "y"
        inner_product_param {{ num_output: 2 weight_filler {{ type: "gaussian" std: 1 }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "l" }}
"""


def run(net):
    net.blobs["x"].data[...] = X
    net.blobs["t"].data[...] = np.arange(8.0).reshape(4, 2)
    net.forward()
    net.clear_param_diffs()
    net.backward()
    return [p.diff.copy() for layer in net.layers for p in layer.blobs]


def test_scale_in_place_shares_memory_and_keeps_its_gradient():
    # in place, the write destroys x, which the scale gradient needs: forward saves a copy,
    # which is why the class can declare that backward reads no bottom
    in_place, out_of_place = (Net(scale_net(t), dtype="float64", seed=1) for t in ("h", "s"))
    assert in_place.in_place_fallbacks == []
    assert in_place.blobs["h"] is in_place.blobs["h@0"]
    for got, want in zip(run(in_place), run(out_of_place)):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    testing.check_net_gradient(in_place, wrt=["x"])


def test_a_later_in_place_write_on_scales_bottom_falls_back():
    # out of place, Scale's backward reads h; the ReLU that would overwrite h runs out of place
    net = Net(scale_net("s", relu_in_place=True), dtype="float64", seed=1)
    assert len(net.in_place_fallbacks) == 1 and "'relu'" in net.in_place_fallbacks[0]
    assert "'sc'" in net.in_place_fallbacks[0]
    testing.check_net_gradient(net, wrt=["x"])



def test_every_module_of_the_layers_package_registers_its_layers():
    import pkgutil

    import unroll.engine.layers

    modules = {f"unroll.engine.layers.{m.name}"
               for m in pkgutil.iter_modules(unroll.engine.layers.__path__)}
    assert {cls.__module__ for cls in LAYERS.values()} >= modules


# -- every hook the engine reads is declared on Layer ---------------------------------------
#: the modules that read layers: the net, its plan and checks, inspection, graph capture
ENGINE = ("engine.net", "graph.rules", *(f"engine.memory.{m}" for m in (
    "aliases", "budget", "layout", "liveness", "regions", "schedule", "segments",
    "weight_gradients")),
          "engine.executor",
          "engine.param_sharing", "engine.memory_limit", "engine.host_checks", "engine.workspace",
          "engine.inspection", "engine.cuda_graph")
#: names that stand for a layer in those modules
LAYER_NAMES = {"layer", "sharer", "split", "who"}
#: what every layer has besides CONTRACT: Caffe's run methods and the base's own members
BASE = {"type", "name", "param", "xp", "dtype", "phase", "rng", "blobs", "set_up", "reshape",
        "forward", "backward", "layer_setup", "scratch_specs", "scratch_memory", "reserve",
        "scratch", "error", "compact", "check_counts", "canonical_axis", "apply_layout",
        "parts_in_whole", "diff_aliased", "param_diffs_batched"}


def layer_reads(module) -> set[str]:
    """Attributes ``module`` reads of a layer: ``layer.x``, ``layers[s].x``, getattr/hasattr."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(module))
    found = set()

    def is_layer(node) -> bool:
        return (isinstance(node, ast.Name) and node.id in LAYER_NAMES) or (
            isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
            and node.value.id in ("layers", "layers_run"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_layer(node.value):
            found.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr") and node.args
              and is_layer(node.args[0]) and isinstance(node.args[1], ast.Constant)):
            found.add(f"{node.func.id}:{node.args[1].value}")
    return found


@pytest.mark.parametrize("name", ENGINE)
def test_the_engine_reads_only_what_layer_declares(name):
    import importlib

    reads = layer_reads(importlib.import_module(f"unroll.{name}"))
    probes = {r for r in reads if ":" in r and r != "getattr:axis"}
    assert not probes, f"unroll.{name} probes layers for {probes}: declare them on Layer"
    undeclared = {r for r in reads if ":" not in r} - set(CONTRACT) - BASE
    assert not undeclared, f"unroll.{name} reads {undeclared} of layers, not in CONTRACT"


def test_layer_has_no_member_beyond_the_contract_and_its_own():
    # what only the memory plan reads is one MemoryTraits (``memory``), not members beside
    # Caffe's virtuals that a layer author would have to learn
    public = {name for name in dir(Layer) if not name.startswith("_")}
    assert public - set(CONTRACT) - BASE == {"param_blob", "param_blobs", "param_messages"}


@pytest.mark.parametrize("name", CONTRACT)
def test_every_contract_entry_has_a_default_and_a_doc_on_layer(name):
    import inspect

    assert hasattr(Layer, name), name
    value = getattr(Layer, name)
    if callable(value):
        assert value.__doc__, f"Layer.{name} has no docstring"
    else:  # an attribute is documented by the `#:` comment above it (or above its group)
        source = inspect.getsource(Layer).splitlines()
        at = next(i for i, line in enumerate(source) if line.startswith(f"    {name}"))
        while source[at - 1].strip() and not source[at - 1].strip().startswith("#"):
            at -= 1  # another attribute of the group
        assert source[at - 1].strip().startswith("#:"), f"Layer.{name} has no #: comment"


def test_the_extending_page_lists_every_contract_entry():
    from pathlib import Path

    page = Path(__file__).resolve().parents[3] / "docs" / "guide" / "extending.md"
    missing = [name for name in CONTRACT if f"`{name}" not in page.read_text()]
    assert not missing, f"docs/guide/extending.md does not list {missing}"


#: a hook the engine calls only where the layer's flag says so
FLAGGED_HOOKS = {"check_host_bottom": "checks_host_bottoms"}


@pytest.mark.parametrize("hook", FLAGGED_HOOKS)
def test_a_layer_that_defines_a_hook_raises_its_flag(hook):
    flag = FLAGGED_HOOKS[hook]
    silent = [name for name, cls in LAYERS.items()
              if getattr(cls, hook) is not getattr(Layer, hook) and not getattr(cls, flag)]
    assert not silent, f"{silent} define {hook} but not {flag} = True: the engine never calls it"


# -- same_shape is a promise about shapes --------------------------------------------------
SAME_SHAPE = sorted(name for name, cls in LAYERS.items() if cls.same_shape)


def test_same_shape_is_declared_by_the_shape_keeping_layers():
    # a bucketed model ties every axis of these layers' blobs: the list must hold the neurons
    # and the layers docs/design.md, 2 names, and only layers that exist
    assert {"ReLU", "Sigmoid", "TanH", "Dropout", "Power", "AbsVal", "Threshold", "BatchNorm",
            "Eltwise", "Split", "Softmax"} <= set(SAME_SHAPE)
    assert not {"Scale", "Bias", "Concat", "Slice", "InnerProduct", "Reshape"} & set(SAME_SHAPE)


@pytest.mark.parametrize("name", SAME_SHAPE)
@given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple))
@settings(max_examples=10, deadline=None)
def test_a_same_shape_layer_gives_every_top_its_bottoms_shape(name, shape):
    cls = LAYERS[name]
    n_bottoms, n_tops = cls.num_bottoms[0], max(cls.num_tops[0], 2 if name == "Split" else 1)
    layer = cls(LayerParameter(name="l", type=name), dtype=np.float64)
    tops = blobs(*[()] * n_tops)
    layer.set_up(blobs(*[shape] * n_bottoms), tops)
    assert [t.shape for t in tops] == [shape] * n_tops


def test_a_layer_module_run_again_keeps_its_registration():
    """A layer module executed a second time under its own name (pytest's importlib mode
    does so for a module's doctests once its package has imported it) registers its types
    again without error, and the registry keeps the first classes; another class under a
    taken name is refused."""
    import importlib.util

    from unroll.engine.layer import register_layer
    from unroll.engine.layers import loss_chunks

    first = LAYERS["SoftmaxWithLossChunk"]
    spec = importlib.util.spec_from_file_location(loss_chunks.__name__, loss_chunks.__file__)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert LAYERS["SoftmaxWithLossChunk"] is first

    class SoftmaxWithLossChunkLayer(Layer):
        pass

    with pytest.raises(ValueError, match="'SoftmaxWithLossChunk' is already registered"):
        register_layer("SoftmaxWithLossChunk")(SoftmaxWithLossChunkLayer)
