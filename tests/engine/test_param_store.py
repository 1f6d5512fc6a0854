"""ParamStore.pack: one flat data and one flat diff buffer, with every Caffe semantic unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from unroll.core.proto import NetParameter
from unroll.engine.blob import Blob
from unroll.engine.net import Net
from unroll.engine.param_store import LearnableParam, ParamStore
from unroll.train.bucketed_model import BucketedModel
from unroll.train.solver import Solver

# ip2 shares ip1's weight by count (2 x 3 as 3 x 2) and freezes its own bias
NET = """
layer { name: "in" type: "Input" top: "x" top: "x2" top: "y"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } shape { dim: 4 dim: 5 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "p1" param { name: "w" }
        param { name: "b" lr_mult: 2 }
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "x2" top: "p2"
        param { name: "w" share_mode: PERMISSIVE } param { name: "b2" lr_mult: 0 }
        inner_product_param { num_output: 3 bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "cat" type: "Concat" bottom: "p1" bottom: "p2" top: "p" }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
"""


def inputs(k: int = 0) -> dict:
    rng = np.random.default_rng(k)
    return {"x": rng.normal(size=(4, 3)), "x2": rng.normal(size=(4, 2)),
            "y": rng.normal(size=(4, 5))}


def run(net: Net) -> tuple:
    out = net.forward(blobs=["p"], **inputs())["p"].copy()
    net.backward()
    return out, {p.name: p.blob.diff.copy() for p in net.learnable_params}


def test_pack_moves_every_param_into_one_buffer_and_changes_nothing():
    plain, packed = Net(NET, dtype="float64"), Net(NET, dtype="float64")
    assert packed.store.pack() and not packed.store.pack()  # a second pack has nothing to do
    store = packed.store
    assert store.data.size == store.diff.size == sum(p.blob.count for p in store) == 6 + 2 + 3
    for p in store:
        assert np.shares_memory(p.blob.data, store.data)
        assert np.shares_memory(p.blob.diff, store.diff)
        np.testing.assert_array_equal(store.data[p.offset : p.offset + p.blob.count],
                                      p.blob.data.ravel())
    assert [p.offset for p in store] == [0, 6, 8]
    # the sharer's reshaped view follows the owner into the buffer
    view = packed.params["ip2"][0]
    assert view.shape == (3, 2) and np.shares_memory(view.data, store.data)
    assert np.shares_memory(view.diff, store.diff)
    out_plain, grads_plain = run(plain)
    out_packed, grads_packed = run(packed)
    np.testing.assert_array_equal(out_plain, out_packed)
    for name, g in grads_plain.items():
        np.testing.assert_array_equal(grads_packed[name], g)
    assert plain.to_proto().SerializeToString() == packed.to_proto().SerializeToString()


def test_training_keeps_lr_mult_and_sharing_semantics():
    net = Net(NET, dtype="float64")
    frozen = net.params["ip2"][1].data.copy()
    solver = Solver(net, type="SGD", base_lr=0.1, momentum=0.9)
    before = {p.name: p.blob.data.copy() for p in net.learnable_params}
    solver.step(2, feed=lambda k: inputs(k))
    np.testing.assert_array_equal(net.params["ip2"][1].data, frozen)  # lr_mult 0
    assert not np.any(solver.history[2])
    w1, w2 = net.params["ip1"][0].data, net.params["ip2"][0].data
    np.testing.assert_array_equal(w2.ravel(), w1.ravel())
    moved = [p.name for p in net.learnable_params if np.any(p.blob.data != before[p.name])]
    assert moved == ["w", "b"]


def growing_model() -> BucketedModel:
    """A model whose nets of T >= 3 hold a param that the T = 1 net lacks."""
    def make(T):
        extra = """layer { name: "gain" type: "Scale" bottom: "h" top: "h" param { name: "gain" }
                   scale_param { axis: 2 filler { type: "constant" value: 1.5 } } }"""
        text = f"""
          layer {{ name: "in" type: "Input" top: "x" top: "y"
                   input_param {{ shape {{ dim: {T} dim: 2 dim: 3 }}
                                 shape {{ dim: {T} dim: 2 dim: 4 }} }} }}
          layer {{ name: "ip" type: "InnerProduct" bottom: "x" top: "h" param {{ name: "W" }}
                   param {{ name: "b" }} inner_product_param {{ num_output: 4 axis: 2
                   weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
          {extra if T >= 3 else ""}
          layer {{ name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "y" top: "loss" }}"""
        return text_format.Merge(text, NetParameter())
    return BucketedModel(make, dtype="float64")


def batch(k: int) -> dict:
    rng = np.random.default_rng(50 + k)
    T = (2, 3, 4, 2)[k % 4]
    return {"x": rng.normal(size=(T, 2, 3)), "y": rng.normal(size=(T, 2, 4))}


def test_params_added_after_packing_grow_the_buffers_and_train_identically(tmp_path):
    late = growing_model()  # 'gain' appears in the second step, after the solver packed
    early = growing_model()
    early.net(3)  # 'gain' exists before the solver packs
    files = []
    for model, name in ((late, "late"), (early, "early")):
        solver = Solver(model, type="Adam", base_lr=0.05, momentum=0.9, momentum2=0.999)
        solver.step(4, feed=batch)
        assert [p.name for p in model.store] == ["W", "b", "gain"]
        assert model.store.packed and model.store.data.size == 12 + 4 + 4
        assert np.shares_memory(model.nets[3].params["gain"][0].data, model.store.data)
        (tmp_path / name).mkdir()
        files.append([p.read_bytes() for p in solver.snapshot(tmp_path / name / "s")])
    assert files[0] == files[1]


def test_a_store_of_mixed_dtypes_cannot_be_packed():
    store = ParamStore()
    store.add(LearnableParam("a", Blob((2,), dtype=np.float32)))
    store.add(LearnableParam("b", Blob((2,), dtype=np.float64)))
    with pytest.raises(TypeError, match="param 'b' is float64 .* param 'a' is float32"):
        store.pack()
