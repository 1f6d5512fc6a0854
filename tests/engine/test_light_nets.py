"""Unrolled nets are light: what a built net does not hold, and what it still tells."""

import gc
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.hang import limit
from unroll import Net, NetError, expand
from unroll.core.proto import LayerParameter
from unroll.engine.blob import Blob
from unroll.engine.layer import LAYERS

FAN_OUT = '''
  layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
  layer { name: "a" type: "InnerProduct" bottom: "x" top: "a"
          inner_product_param { num_output: 2 } }
  layer { name: "b" type: "InnerProduct" bottom: "x" top: "b"
          inner_product_param { num_output: 2 } }
  layer { name: "relu" type: "ReLU" bottom: "a" top: "a" }'''


def test_an_inserted_split_holds_no_layer_parameter_yet_describes_itself():
    net = Net(FAN_OUT)
    split = next(layer for layer in net.layers_run if layer.type == "Split")
    assert not any(isinstance(v, LayerParameter) for v in vars(split).values())
    lp = split.param
    assert isinstance(lp, LayerParameter)
    assert (lp.name, lp.type, list(lp.bottom), list(lp.top)) == (
        "x_in_0_split", "Split", ["x"], ["x_in_0_split_0", "x_in_0_split_1"])
    assert net.inspect().splits == [("x_in_0_split", "x", 2)]
    # the weights file holds the net's own layers, never the splits
    assert [lp.name for lp in net.to_proto().layer] == ["a", "b"]


def test_a_split_in_the_prototxt_keeps_its_own_layer_parameter():
    net = Net('''
      layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
      layer { name: "s" type: "Split" bottom: "x" top: "xa" top: "xb" }
      layer { name: "a" type: "ReLU" bottom: "xa" top: "a" }
      layer { name: "b" type: "ReLU" bottom: "xb" top: "b" }''')
    split = next(layer for layer in net.layers_run if layer.name == "s")
    assert split.param is split.param and list(split.param.top) == ["xa", "xb"]
    assert any(v is split.param for v in vars(split).values())


@pytest.mark.parametrize("enabled", [True, False])
def test_building_leaves_the_cyclic_collector_as_it_found_it(enabled):
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        Net(FAN_OUT)
        assert gc.isenabled() == enabled
        with pytest.raises(NetError, match="bottom 'nothing'"):
            Net(FAN_OUT + 'layer { name: "r" type: "ReLU" bottom: "nothing" top: "r" }')
        assert gc.isenabled() == enabled
    finally:
        gc.enable() if was else gc.disable()


def test_blob_versions_without_a_list_per_name():
    net = Net(FAN_OUT)
    assert net.blobs.versions("b") == [net.blobs["b"]] == [net.blobs["b@0"]]
    a0, a1 = net.blobs.versions("a")
    assert net.blobs["a@0"] is a0 and net.blobs["a@1"] is a1 is net.blobs["a"]
    for missing in ("b@1", "a@2", "nothing@0", "a@x"):
        with pytest.raises(KeyError):
            net.blobs[missing]


def test_the_graph_table_pairs_every_value_with_its_blob():
    net = Net(FAN_OUT)
    g = net.graph
    assert g.table == [("x", 0), ("a", 1), ("b", 2), ("a", 1),
                       ("x_in_0_split_0", 3), ("x_in_0_split_1", 4)]
    assert all(g.names[b] == name for name, b in g.table)


def test_layers_without_scratch_share_one_empty_table_that_stays_empty():
    net = Net(FAN_OUT)
    # (an InnerProduct of a few rows reserves its transposed product on the CPU)
    relu, data = net.layers[-1], net.layers[0]
    assert relu.scratch_specs is data.scratch_specs and not relu.scratch_specs
    with pytest.raises(TypeError):
        relu.scratch_specs["x"] = ((1,), np.float32, "both")
    with pytest.raises(TypeError, match="reserve"):
        relu.scratch_memory["x"] = np.zeros(1)
    relu.reserve("x", (2,))
    assert relu.scratch("x").shape == (2,) and not data.scratch_specs


def test_nets_of_every_T_share_their_names():
    short, long = (Net(expand("lstm", steps=T, batch=2, input_dim=3, hidden=4)) for T in (2, 3))
    for a, b in zip(short.layers_run, long.layers_run):
        if a.name == b.name:
            assert a.name is b.name
    assert short.graph.names[0] is long.graph.names[0]


def test_the_contract_check_allows_a_property_and_an_unchanged_value():
    class Kept(LAYERS["ReLU"]):
        def layer_setup(self, bottoms, tops):
            self.in_place = type(self).in_place  # the same value: nothing changed

    layer = Kept(LayerParameter(name="k", type="ReLU"))
    x, y = Blob((2,), np, np.float32, "x"), Blob((), np, np.float32, "y")
    layer.set_up([x], [y])
    assert y.shape == (2,)


SCATTER = '''
  force_backward: true
  layer { name: "in" type: "Input" top: "x" top: "at" top: "like" top: "target"
          input_param { shape { dim: 3 dim: 2 } shape { dim: 3 } shape { dim: 2 dim: 2 }
                        shape { dim: 2 dim: 2 dim: 2 } } }
  layer { name: "put" type: "Scatter" bottom: "x" bottom: "at" bottom: "like" top: "y" }
  layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "target" top: "loss" }'''


def test_scatter_takes_its_grid_from_the_workspace():
    rng = np.random.default_rng(0)
    feed = dict(x=rng.normal(size=(3, 2)), at=np.array([3.0, -1, 0]), like=np.zeros((2, 2)),
                target=rng.normal(size=(2, 2, 2)))
    results = []
    for plan in (True, False):
        net = Net(SCATTER, dtype="float64", plan_memory=plan)
        net.forward(**feed)
        net.backward()
        results.append((net.loss, net.blobs["x"].diff.copy()))
        if plan:
            put = net.layers[1]
            assert set(put.scratch_specs) == {"grid", "grid_diff", "index"}
            assert np.shares_memory(put.scratch_memory["index"], net.workspace.arena)
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_a_class_contract_changed_after_a_set_up_is_read_again():
    class Flipped(LAYERS["ReLU"]):
        pass

    x, y = Blob((2,), np, np.float32, "x"), Blob((), np, np.float32, "y")
    Flipped(LayerParameter(name="f", type="ReLU")).set_up([x], [y])
    Flipped.in_place = not Flipped.in_place  # the class's own value, not an instance's
    Flipped(LayerParameter(name="g", type="ReLU")).set_up([x], [y])
    assert y.shape == (2,)


LONG_NET = """
import gc
import json
import numpy as np
from unroll import Net, expand
T = 100
net_param = expand("lstm", steps=T, batch=1, input_dim=1, hidden=1)
target = net_param.layer.add(name="target", type="Input", top=["target"])
target.input_param.shape.add(dim=[T, 1, 1])
net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"], top=["loss"])
net = Net(net_param)
cont = np.ones((T, 1))
cont[0] = 0
net.forward(x=np.ones((T, 1, 1)), cont=cont, target=np.zeros((T, 1, 1)))
net.backward()
# CPython keeps an instance's attributes beside its class's shared keys until one no longer
# fits there; then the instance gets a dict of its own, which gc sees
owns = {l.type for l in net.layers_run
        if any(isinstance(r, dict) and "xp" in r for r in gc.get_referents(l))}
print(json.dumps([sorted({l.type for l in net.layers_run}), sorted(owns)]))
"""


@pytest.mark.skipif(sys.implementation.name != "cpython" or sys.version_info < (3, 11),
                    reason="CPython's shared instance keys")
def test_every_layer_of_a_long_unrolled_net_keeps_its_attributes_in_its_class_keys():
    # a net makes all its layers before it sets any up, so in a fresh process each class
    # has a hundred instances before the first is set up: what layer_setup, the layout and
    # compact add must still fit its keys, or every attribute read is a dict lookup
    out = subprocess.run([sys.executable, "-c", LONG_NET], capture_output=True, text=True,
                         check=True, timeout=limit(60)).stdout
    types, owning = json.loads(out)
    assert {"InnerProduct", "Scale", "Eltwise", "LSTMUnit"} <= set(types)
    assert owning == []
