"""BucketedModel: one unrolled net per length, all over ONE parameter store."""

import numpy as np
import pytest

import unroll
from unroll.bucketed_model import BucketedModel
from unroll.solver import Solver


def make(T, batch=3):
    net = unroll.expand("lstm", steps=T, batch=batch, input_dim=4, hidden=5)
    loss = net.layer.add()
    loss.CopyFrom(unroll.proto.LayerParameter(name="target", type="Input", top=["y"]))
    loss.input_param.shape.add().dim.extend([T, batch, 5])
    euclid = net.layer.add()
    euclid.CopyFrom(unroll.proto.LayerParameter(name="loss", type="EuclideanLoss",
                                                bottom=["h", "y"], top=["loss"]))
    return net


def batch_of(T, N=3, seed=0):
    rng = np.random.default_rng(seed)
    cont = np.ones((T, N))
    cont[0] = 0
    return {"x": rng.normal(size=(T, N, 4)), "cont": cont, "y": rng.normal(size=(T, N, 5))}


def test_a_step_on_one_bucket_changes_what_every_bucket_sees():
    model = BucketedModel(make, dtype="float64")
    long_batch = batch_of(30, seed=1)
    before = model.forward(**long_batch)["loss"].copy()
    solver = Solver(model, type="SGD", base_lr=0.5)
    short = batch_of(7)
    solver.step(1, feed=lambda _: short)
    assert model.active is model.net(7)
    after = model.forward(**long_batch)["loss"]
    assert after != before
    assert sorted(model.nets) == [1, 7, 30]


def test_learnable_memory_is_one_copy_for_all_buckets():
    model = BucketedModel(make, dtype="float64")
    for T in (2, 7, 30):
        model.forward(**batch_of(T))
    names = [p.name for p in model.learnable_params]
    assert names == ["W_xc", "b_c", "W_hc"]
    single = unroll.Net(make(30), dtype="float64")
    assert model.param_nbytes == sum(p.blob.data.nbytes + p.blob.diff.nbytes
                                     for p in single.learnable_params)
    for T, net in model.nets.items():
        assert [p.name for p in net.learnable_params] == names, T
        for mine, shared in zip(net.learnable_params, model.learnable_params):
            assert mine.blob.data is shared.blob.data
            assert mine.blob.diff is shared.blob.diff
        # every step's layer of every bucket reads the one W_hc buffer
        for name, blobs in net.params.items():
            if name.startswith("hc_t"):
                assert np.shares_memory(blobs[0].data, model.store["W_hc"].blob.data)


def test_gradients_of_all_buckets_accumulate_in_the_store():
    model = BucketedModel(make, dtype="float64")
    model.clear_param_diffs()
    model.forward(**batch_of(4))
    model.backward()
    first = model.store["W_hc"].blob.diff.copy()
    model.forward(**batch_of(9, seed=3))
    model.backward()
    only_second = BucketedModel(make, dtype="float64")
    only_second.clear_param_diffs()
    only_second.forward(**batch_of(9, seed=3))
    only_second.backward()
    np.testing.assert_allclose(model.store["W_hc"].blob.diff,
                               first + only_second.store["W_hc"].blob.diff, rtol=1e-12)


def test_inputs_not_given_follow_the_batch_size():
    model = BucketedModel(make, dtype="float64")
    out = model.forward(**batch_of(5, N=2))
    assert model.active.blobs["h_0"].shape == (1, 2, 5)
    assert out["loss"].shape == ()
    full = model.forward(**batch_of(5, N=3))
    assert model.active.blobs["h_0"].shape == (1, 3, 5)
    assert np.isfinite(full["loss"])


def test_steps_from_picks_T_when_inputs_differ_on_axis_0():
    def net_param(T):
        return unroll.expand("tagger", steps=T, batch=2, vocab=9, tags=3, embed=4, hidden=3,
                             chars={"vocab": 6, "embed": 3, "hidden": 2, "length": 4})

    model = BucketedModel(net_param, dtype="float64", steps_from="words")
    rng = np.random.default_rng(0)
    for T, N in ((3, 2), (5, 1)):
        cont = np.ones((T, N))
        cont[0] = 0
        chars = rng.integers(0, 6, (4, T * N))
        out = model.forward(words=rng.integers(0, 9, (T, N)), cont=cont,
                            labels=rng.integers(0, 3, (T, N)), chars_fw=chars, chars_bw=chars,
                            chars_cont=np.ones((4, T * N)),
                            chars_at=np.concatenate([-np.ones((3, T * N)), [np.arange(T * N)]]))
        assert np.isfinite(out["loss"])
        assert model.active is model.net(T)
        # the char LSTM's initial state follows T * N, the word LSTM's follows N
        assert model.active.blobs["char_fw_h_0"].shape == (1, T * N, 2)
        assert model.active.blobs["fw_h_0"].shape == (1, N, 3)
    with pytest.raises(ValueError, match="words"):
        model.forward(cont=np.ones((3, 2)))


def test_saved_params_load_into_a_fresh_model(tmp_path):
    model = BucketedModel(make, dtype="float64", seed=1)
    model.forward(**batch_of(6))
    model.save(tmp_path / "m.caffemodel")
    fresh = BucketedModel(make, dtype="float64", seed=2)
    assert not np.array_equal(fresh.store["W_hc"].blob.data, model.store["W_hc"].blob.data)
    fresh.copy_from(tmp_path / "m.caffemodel", strict=True)
    for a, b in zip(model.learnable_params, fresh.learnable_params):
        np.testing.assert_array_equal(a.blob.data, b.blob.data)
    np.testing.assert_array_equal(fresh.forward(**batch_of(11))["loss"],
                                  model.forward(**batch_of(11))["loss"])
