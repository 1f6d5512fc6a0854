"""Every public object says what it is in its repr: names, shapes, dtypes, counts."""

import numpy as np

import unroll
from unroll.engine.blob import Blob
from unroll.frontend.template import load_template
from unroll.train.bucketing import BucketSampler


def lstm_net():
    return unroll.Net(unroll.expand("lstm", steps=3, batch=2, input_dim=3, hidden=4))


def test_net_repr_names_its_size_inputs_and_outputs():
    net = lstm_net()
    text = repr(net)
    assert text.startswith("Net('lstm_T3', phase='train', ")
    assert f"{len(net.layers)} layers, {len(net.blobs)} blobs" in text
    assert "3 learnable params (128 values), float32 on cpu" in text
    assert "inputs=['x', 'cont', 'h_0', 'c_0'], outputs=['h']" in text
    assert repr(net.blobs).startswith(f"BlobTable({len(net.blobs)} blobs: 'x', 'cont', ")


def test_learnable_params_give_data_and_diff_and_say_what_they_are():
    net = lstm_net()
    p = net.learnable_params[0]
    assert p.data is p.blob.data and p.diff is p.blob.diff and p.shape == (16, 3)
    p.data[...] = 0.5  # the param's own memory
    assert float(net.params[p.owner][0].data.sum()) == 0.5 * 48
    assert repr(p) == ("LearnableParam('W_xc', shape=(16, 3), float32, lr_mult=1, decay_mult=1, "
                       "owner='x_proj_seq')")


def test_param_store_repr_counts_params_and_values():
    net = lstm_net()
    assert repr(net.store).startswith("ParamStore(3 params, 128 values, float32, ")
    assert repr(net.store).endswith(": W_xc, b_c, W_hc)")
    assert repr(unroll.ParamStore()) == "ParamStore(0 params, 0 values, not packed: )"


def test_blob_and_layer_reprs():
    assert repr(Blob((2, 3), np, np.float64, "x")) == "Blob('x', shape=(2, 3), dtype=float64)"
    net = lstm_net()
    ip = next(layer for layer in net.layers if layer.type == "InnerProduct")
    assert repr(ip) == f"<InnerProductLayer '{ip.name}': blobs (16, 3) (16,)>"
    unit = next(layer for layer in net.layers if layer.type == "LSTMUnit")
    assert repr(unit) == f"<LSTMUnitLayer '{unit.name}'>"  # no blobs


def test_solver_and_bucketed_model_reprs():
    model = unroll.BucketedModel(
        lambda T: unroll.expand("rnn", steps=T, batch=2, input_dim=3, hidden=4))
    model.forward(x=np.zeros((5, 2, 3)), cont=np.zeros((5, 2)))
    assert repr(model) == ("BucketedModel(phase='train', nets for T=[1, 5], 3 learnable params "
                           "(32 values), float32 on cpu)")
    solver = unroll.Solver(lstm_net(), type="SGD", base_lr=0.1)
    assert repr(solver).startswith("Solver(type='SGD', iter=0, ")


def test_template_workspace_and_sampler_reprs():
    template = load_template("gru")
    assert repr(template) == (f"Template('gru.prototxt.j2', kind='step', "
                              f"variables=['hidden', 'weight_filler'], path='{template.path}')")
    net = lstm_net()
    net.forward()
    assert repr(net.workspace).startswith("Workspace(") and "bytes on numpy" in repr(
        net.workspace)
    sampler = BucketSampler([3, 4, 5, 9], batch_size=2)
    assert repr(sampler).startswith("BucketSampler(4 sequences, batch_size=2")
