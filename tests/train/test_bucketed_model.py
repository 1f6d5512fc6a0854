"""BucketedModel: one unrolled net per length, all over ONE parameter store."""

import numpy as np
import pytest

import unroll
from unroll.train.bucketed_model import BucketedModel
from unroll.train.solver import Solver


def make(T, batch=3):
    net = unroll.expand("lstm", steps=T, batch=batch, input_dim=4, hidden=5)
    loss = net.layer.add()
    loss.CopyFrom(unroll.core.proto.LayerParameter(name="target", type="Input", top=["y"]))
    loss.input_param.shape.add().dim.extend([T, batch, 5])
    euclid = net.layer.add()
    euclid.CopyFrom(unroll.core.proto.LayerParameter(name="loss", type="EuclideanLoss",
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


# -- inputs with and without a time axis --------------------------------------------------


def classifier(T, batch=3, D=4, H=5, K=3):
    """A many-to-one LSTM with exposed states: x (T, N, D), cont (T, N), states (1, N, H),
    one label per sequence (N,)."""
    net = unroll.expand("lstm", steps=T, batch=batch, input_dim=D, hidden=H,
                        expose_hidden=True, sequence_output=False, align="right")
    net.layer.add(name="label_in", type="Input", top=["label"]).input_param.shape.add().dim.append(
        batch)
    score = net.layer.add(name="score", type="InnerProduct", bottom=["h"], top=["score"])
    score.param.add(name="W_score")
    score.param.add(name="b_score")
    score.inner_product_param.num_output = K
    score.inner_product_param.axis = 2
    score.inner_product_param.weight_filler.type = "gaussian"
    flat = net.layer.add(name="flat", type="Reshape", bottom=["score"], top=["score_flat"])
    flat.reshape_param.shape.dim.extend([-1, K])
    net.layer.add(name="loss", type="SoftmaxWithLoss", bottom=["score_flat", "label"],
                  top=["loss"])
    return net


def classifier_batch(T, N, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(T, N, 4)), "cont": (np.arange(T) > 0)[:, None].repeat(N, 1),
            "h_0": rng.normal(size=(1, N, 5)), "c_0": rng.normal(size=(1, N, 5)),
            "label": rng.integers(0, 3, N)}


def test_state_and_label_inputs_need_no_steps_from():
    model = BucketedModel(classifier, dtype="float64")
    assert model.time_axes == {"x": 0, "cont": 0, "h_0": None, "c_0": None, "label": None}
    for T, N in ((1, 3), (6, 3), (6, 2), (3, 1)):  # T = 1 and N = 1 look like anything
        inputs = classifier_batch(T, N, seed=T + N)
        loss = model.forward(**inputs)["loss"]
        assert model.active is model.net(T)
        alone = unroll.Net(classifier(T, batch=N), dtype="float64", param_store=model.store)
        assert loss == pytest.approx(alone.forward(**inputs)["loss"], rel=1e-12)


def test_the_ambiguous_T_error_names_the_inputs_and_the_fix():
    model = BucketedModel(classifier, dtype="float64")
    inputs = classifier_batch(6, 3)
    with pytest.raises(ValueError, match=r"time-major inputs disagree on T: \{'x': 6, 'cont': 5\}"
                                         r".*time_axes=\{'x': None\}.*steps_from='x'"):
        model.forward(**dict(inputs, cont=inputs["cont"][:5]))
    with pytest.raises(ValueError, match=r"needs a time-major input to read T from \(time-major: "
                                         r"\['x', 'cont'\].*time_axes="):
        model.forward(h_0=inputs["h_0"], c_0=inputs["c_0"], label=inputs["label"])
    with pytest.raises(ValueError, match=r"time_axes names \['y'\], which are not inputs"):
        BucketedModel(classifier, time_axes={"y": 0}).net(3)  # checked on the first net built


def test_declared_time_axes_win_over_the_nets():
    """Declared without a time axis, cont no longer sets T: x alone does."""
    model = BucketedModel(classifier, dtype="float64", time_axes={"cont": None})
    assert model.time_axes["cont"] is None and model.time_axes["x"] == 0
    inputs = classifier_batch(4, 2)
    assert np.isfinite(model.forward(**inputs)["loss"])  # T from x alone


def test_each_recurrence_state_follows_its_own_cont_whatever_the_sizes():
    """The tagger's character LSTM runs over as many columns as the word LSTM has sentences
    when built (no N + 1): each initial state still follows its own recurrence's batch."""
    def net_param(T):
        return unroll.expand("tagger", steps=T, batch=2, vocab=9, tags=3, embed=4, hidden=3,
                             char_columns=2,
                             chars={"vocab": 6, "embed": 3, "hidden": 2, "length": 4})

    model = BucketedModel(net_param, dtype="float64")
    assert {name: axis for name, axis in model.time_axes.items() if axis is not None} == {
        "words": 0, "cont": 0, "labels": 0}
    rng = np.random.default_rng(0)
    for T, N, columns in ((3, 2, 5), (5, 1, 2), (2, 3, 1)):
        cont = np.ones((T, N))
        cont[0] = 0
        chars = rng.integers(0, 6, (4, columns))
        at = -np.ones((4, columns))
        at[3, : min(columns, T * N)] = np.arange(min(columns, T * N))
        out = model.forward(words=rng.integers(0, 9, (T, N)), cont=cont,
                            labels=rng.integers(0, 3, (T, N)), chars_fw=chars, chars_bw=chars,
                            chars_cont=np.ones((4, columns)), chars_at=at)
        assert np.isfinite(out["loss"])
        assert model.active.blobs["char_fw_h_0"].shape == (1, columns, 2)
        assert model.active.blobs["fw_h_0"].shape == (1, N, 3)


def two_steps_at_least(T):
    """The lstm net with step 0's output cut from the rest: at T = 1 the rest is empty, so
    the net does not build."""
    net = make(T)
    cut = net.layer.add()
    cut.CopyFrom(unroll.core.proto.LayerParameter(name="first", type="Slice", bottom=["h"],
                                                  top=["h_first", "h_rest"]))
    cut.slice_param.axis = 0
    cut.slice_param.slice_point.append(1)
    net.layer.add().CopyFrom(unroll.core.proto.LayerParameter(
        name="quiet", type="Silence", bottom=["h_first", "h_rest"]))
    return net


@pytest.mark.parametrize("told", [{"steps_from": "x"}, {"time_axes": {"x": 0, "y": 0}}])
def test_a_template_valid_only_from_two_steps_runs_given_its_time_axes(told):
    with pytest.raises(unroll.core.errors.NetError, match="slice_point"):
        BucketedModel(two_steps_at_least)  # T = 1 is built to find the time axes
    model = BucketedModel(two_steps_at_least, dtype="float64", **told)
    assert model.nets == {}
    with pytest.raises(RuntimeError, match=r"no net is built yet.*model.net\(T\)"):
        model.to_proto()
    solver = Solver(model, type="SGD", base_lr=0.1)
    solver.step(2, feed=lambda it: batch_of(3 + it))
    assert sorted(model.nets) == [3, 4]
    assert [p.name for p in model.learnable_params] == ["W_xc", "b_c", "W_hc"]
    assert model.time_axes["cont"] is None  # undeclared: no time axis, none read off T = 1
    inputs = batch_of(5)
    alone = unroll.Net(two_steps_at_least(5), dtype="float64", param_store=model.store)
    assert model.forward(**inputs)["loss"] == pytest.approx(alone.forward(**inputs)["loss"])
    twin = BucketedModel(two_steps_at_least, dtype="float64", **told)
    twin.net(2)
    twin.copy_from(model.to_proto())
    assert twin.forward(**inputs)["loss"] == pytest.approx(alone.forward(**inputs)["loss"])
