"""Solver: Caffe's update math against hand computations, lr policies, snapshots, errors."""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll.core.errors import FileFormatError
from unroll.core.proto import NetParameter, SolverParameter, SolverState
from unroll.engine.net import Net
from unroll.engine.param_store import ParamStore
from unroll.train.solver import (
    LR_POLICIES,
    SOLVERS,
    NonFiniteError,
    Solver,
    SolverError,
    register_solver,
    usual_fields,
)

NET = """
layer { name: "in" type: "Input" top: "x" top: "y"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p"
        param { name: "w" %s } param { name: "b" %s }
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
"""

SHARED_NET = """
layer { name: "in" type: "Input" top: "x" top: "y"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "p1" param { name: "w" }
        param { name: "b" }
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "x" top: "p2" param { name: "w" }
        param { name: "b" } inner_product_param { num_output: 2 } }
layer { name: "sum" type: "Eltwise" bottom: "p1" bottom: "p2" top: "p" }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
"""


def make_net(w_spec: str = "", b_spec: str = "", dtype="float64", seed: int = 0) -> Net:
    return Net(NET % (w_spec, b_spec), dtype=dtype, seed=seed)


def batch(k: int) -> dict:
    rng = np.random.default_rng(1000 + k)
    return {"x": rng.normal(size=(4, 3)), "y": rng.normal(size=(4, 2))}


def gradients(net, inputs) -> dict:
    """The loss gradient of every learnable param, from a separate forward/backward."""
    net.clear_param_diffs()
    net.forward(**inputs)
    net.backward()
    return {p.name: p.blob.diff.copy() for p in net.learnable_params}


def weights(net) -> dict:
    return {p.name: p.blob.data.copy() for p in net.learnable_params}


class FakeNet:
    """The smallest object a Solver accepts: no params, a loss that counts forwards."""

    def __init__(self):
        self.learnable_params = []
        self.store = ParamStore()
        self.loss = 0.0
        self.seen = []

    def forward(self, **inputs):
        self.seen.append(inputs)
        self.loss = float(len(self.seen))
        return {}

    def backward(self):
        pass

    def to_proto(self):
        return NetParameter(name="fake")

    def copy_from(self, source):
        pass


# -- update math, by hand ----------------------------------------------------------------


def hand_step(kind, p, w, g, hist, t, lr_mult, decay_mult):
    """One update of weight ``w`` with gradient ``g`` as the textbook formula (Caffe's form)."""
    lr = p.base_lr * lr_mult
    if kind == "AdamW":  # the decay decoupled from the gradient, torch's bias correction
        b1, b2 = p.momentum, p.momentum2
        hist[0] = b1 * hist[0] + (1 - b1) * g
        hist[1] = b2 * hist[1] + (1 - b2) * g**2
        m_hat, v_hat = hist[0] / (1 - b1**t), hist[1] / (1 - b2**t)
        return w - (lr * m_hat / (np.sqrt(v_hat) + p.delta) + lr * p.weight_decay * decay_mult * w)
    g = g + p.weight_decay * decay_mult * w
    if kind == "SGD":
        hist[0] = p.momentum * hist[0] + lr * g
        step = hist[0]
    elif kind == "Nesterov":
        previous = hist[0]
        hist[0] = p.momentum * hist[0] + lr * g
        step = (1 + p.momentum) * hist[0] - p.momentum * previous
    elif kind == "AdaGrad":
        hist[0] = hist[0] + g**2
        step = lr * g / (np.sqrt(hist[0]) + p.delta)
    elif kind == "RMSProp":
        hist[0] = p.rms_decay * hist[0] + (1 - p.rms_decay) * g**2
        step = lr * g / (np.sqrt(hist[0]) + p.delta)
    elif kind == "AdaDelta":
        hist[0] = p.momentum * hist[0] + (1 - p.momentum) * g**2
        update = g * np.sqrt((hist[1] + p.delta) / (hist[0] + p.delta))
        hist[1] = p.momentum * hist[1] + (1 - p.momentum) * update**2
        step = lr * update
    else:  # Adam, t = iter + 1
        b1, b2 = p.momentum, p.momentum2
        hist[0] = b1 * hist[0] + (1 - b1) * g
        hist[1] = b2 * hist[1] + (1 - b2) * g**2
        step = lr * math.sqrt(1 - b2**t) / (1 - b1**t) * hist[0] / (np.sqrt(hist[1]) + p.delta)
    return w - step


SETTINGS = {
    "SGD": dict(base_lr=0.1, momentum=0.9),
    "Nesterov": dict(base_lr=0.1, momentum=0.9),
    "AdaGrad": dict(base_lr=0.1, delta=1e-6),
    "RMSProp": dict(base_lr=0.05, rms_decay=0.9, delta=1e-6),
    "AdaDelta": dict(base_lr=1.0, momentum=0.95, delta=1e-6),
    "Adam": dict(base_lr=0.01, momentum=0.9, momentum2=0.999),
    "AdamW": dict(base_lr=0.01, momentum=0.9, momentum2=0.999, delta=1e-3),
}


@pytest.mark.parametrize("kind", list(SOLVERS))
def test_update_matches_hand_computation(kind):
    """Three steps with weight decay, lr_mult and decay_mult equal the formulas; lr_mult 0 stays."""
    net = make_net("lr_mult: 2 decay_mult: 0.5", "lr_mult: 0")
    solver = Solver(net, type=kind, weight_decay=0.01, **SETTINGS[kind])
    p = solver.param
    w = net.params["ip"][0].data.copy()
    b = net.params["ip"][1].data.copy()
    hist = [np.zeros_like(w), np.zeros_like(w)]
    for k in range(3):
        g = gradients(net, batch(k))["w"]
        w = hand_step(kind, p, w, g, hist, k + 1, lr_mult=2.0, decay_mult=0.5)
        solver.step(1, feed=batch)
        np.testing.assert_allclose(net.params["ip"][0].data, w, rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(net.params["ip"][1].data, b)
    assert solver.iter == 3
    assert len(solver.history) == SOLVERS[kind].slots * 2
    assert not np.any(solver.history[1]), "the lr_mult 0 param must keep a zero history"


def test_l1_regularization_adds_sign_of_weights():
    net = make_net()
    solver = Solver(net, base_lr=0.1, weight_decay=0.25, regularization_type="L1")
    w0 = weights(net)
    g = gradients(net, batch(0))
    solver.step(1, feed=batch)
    for name, w in weights(net).items():
        lr, decay = solver.param.base_lr, solver.param.weight_decay
        np.testing.assert_allclose(w, w0[name] - lr * (g[name] + decay * np.sign(w0[name])),
                                   rtol=1e-12)


def test_shared_param_is_updated_once_with_the_summed_gradient():
    net = Net(SHARED_NET, dtype="float64")
    assert [p.name for p in net.learnable_params] == ["w", "b"]
    solver = Solver(net, base_lr=0.1, momentum=0.9)
    h = [0.0, 0.0]
    for k in range(2):
        inputs = batch(k)
        x, y = inputs["x"], inputs["y"]
        w, b = net.params["ip1"][0].data.copy(), net.params["ip1"][1].data.copy()
        # p = 2 (x W^T + b); EuclideanLoss = |p - y|^2 / (2 N); both layers add their gradient
        dp = (2 * (x @ w.T + b) - y) / len(x)
        gw, gb = 2 * dp.T @ x, 2 * dp.sum(axis=0)
        lr, momentum = solver.param.base_lr, solver.param.momentum
        h = [momentum * h[0] + lr * gw, momentum * h[1] + lr * gb]
        solver.step(1, feed=batch)
        np.testing.assert_allclose(net.params["ip1"][0].data, w - h[0], rtol=1e-12)
        np.testing.assert_allclose(net.params["ip1"][1].data, b - h[1], rtol=1e-12)
        assert net.params["ip2"][0].data is net.params["ip1"][0].data


# -- learning-rate policies --------------------------------------------------------------

small = st.floats(0.0, 1.0, allow_nan=False)


@given(
    policy=st.sampled_from(["fixed", "step", "exp", "inv", "poly", "sigmoid"]),
    it=st.integers(0, 100_000),
    base_lr=st.floats(1e-6, 10.0),
    gamma=small,
    power=st.floats(0.0, 3.0),
    stepsize=st.integers(1, 5000),
    max_iter=st.integers(1, 200_000),
)
def test_lr_policy_follows_caffe_formula(policy, it, base_lr, gamma, power, stepsize, max_iter):
    if policy == "sigmoid":
        gamma /= 100
    if policy == "poly":
        it = min(it, max_iter)
    solver = Solver(FakeNet(), base_lr=base_lr, lr_policy=policy, gamma=gamma, power=power,
                    stepsize=stepsize, max_iter=max_iter)
    p = solver.param  # float32 values, as Caffe reads them
    expected = {
        "fixed": lambda: p.base_lr,
        "step": lambda: p.base_lr * p.gamma ** (it // p.stepsize),
        "exp": lambda: p.base_lr * p.gamma**it,
        "inv": lambda: p.base_lr * (1 + p.gamma * it) ** (-p.power),
        "poly": lambda: p.base_lr * (1 - it / p.max_iter) ** p.power,
        "sigmoid": lambda: p.base_lr / (1 + math.exp(-p.gamma * (it - p.stepsize))),
    }[policy]()
    solver.iter = it
    assert solver.get_learning_rate() == pytest.approx(expected, rel=1e-12, abs=1e-300)
    solver.update()
    assert solver.rate == pytest.approx(expected, rel=1e-12, abs=1e-300)
    assert solver.iter == it + 1


@given(
    stepvalues=st.lists(st.integers(0, 40), min_size=1, max_size=5, unique=True).map(sorted),
    gamma=st.floats(0.1, 0.9),
)
def test_multistep_policy_steps_at_each_stepvalue(stepvalues, gamma):
    solver = Solver(FakeNet(), base_lr=1.0, lr_policy="multistep", gamma=gamma,
                    stepvalue=stepvalues)
    rates = []
    for _ in range(45):
        solver.step(1)
        rates.append(solver.rate)
    g = solver.param.gamma
    expected = [g ** sum(s <= it for s in stepvalues) for it in range(45)]
    assert rates == pytest.approx(expected, rel=1e-12)
    assert solver.current_step == len(stepvalues)


def test_poly_is_zero_past_max_iter_and_overflow_is_an_error():
    solver = Solver(FakeNet(), base_lr=0.1, lr_policy="poly", power=0.5, max_iter=10)
    solver.iter = 12
    assert solver.get_learning_rate() == 0.0
    solver = Solver(FakeNet(), base_lr=0.1, lr_policy="exp", gamma=2.0)
    solver.iter = 5000
    with pytest.raises(SolverError, match="exp"):
        solver.update()


# -- clipping and iter_size ------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.1, 0.5, 2.0])
def test_clip_gradients_scales_the_global_norm_to_the_threshold(fraction):
    net = make_net()
    g = gradients(net, batch(0))
    norm = math.sqrt(sum(float((d**2).sum()) for d in g.values()))
    solver = Solver(net, base_lr=1.0, clip_gradients=fraction * norm)
    clip = solver.param.clip_gradients
    w0 = weights(net)
    solver.step(1, feed=batch)
    scale = clip / norm if norm > clip else 1.0
    steps = {name: w0[name] - w for name, w in weights(net).items()}
    for name in g:
        np.testing.assert_allclose(steps[name], scale * g[name], rtol=1e-12)
    step_norm = math.sqrt(sum(float((d**2).sum()) for d in steps.values()))
    assert step_norm == pytest.approx(min(clip, norm), rel=1e-12)


@pytest.mark.parametrize("fraction", [0.1, 2.0])
@pytest.mark.parametrize("nonfinite", ["stop", "skip"])
def test_clipping_after_the_nonfinite_check_gives_the_bits_of_clipping_alone(fraction,
                                                                              nonfinite):
    """The clipping reads the sum of squares the non-finite check took (Solver, docs/
    design.md): the same norm, so the same weights bit for bit as without the check."""
    norm = math.sqrt(sum(float((d**2).sum()) for d in gradients(make_net(), batch(0)).values()))
    policy = dict(nonfinite=nonfinite, max_skipped=1 if nonfinite == "skip" else None)
    alone, checked = make_net(), make_net()
    solvers = [Solver(alone, base_lr=0.5, clip_gradients=fraction * norm),
               Solver(checked, base_lr=0.5, clip_gradients=fraction * norm, **policy)]
    for solver in solvers:
        solver.step(3, feed=batch)
    for name, w in weights(alone).items():
        np.testing.assert_array_equal(weights(checked)[name], w)


@given(k=st.integers(1, 4), momentum=st.sampled_from([0.0, 0.9]))
def test_iter_size_with_identical_batches_equals_one_batch(k, momentum):
    one, many = make_net(), make_net()
    s1 = Solver(one, base_lr=0.1, momentum=momentum, weight_decay=0.01)
    sk = Solver(many, base_lr=0.1, momentum=momentum, weight_decay=0.01, iter_size=k)
    for it in range(2):
        loss1 = s1.step(1, feed=lambda i, it=it: batch(it))
        lossk = sk.step(1, feed=lambda i, it=it: batch(it))
        assert lossk == pytest.approx(loss1, rel=1e-12)
        for name, w in weights(one).items():
            if k in (1, 2):  # g + g is exact: bit-identical
                np.testing.assert_array_equal(weights(many)[name], w)
            else:
                np.testing.assert_allclose(weights(many)[name], w, rtol=1e-12)


def test_iter_size_with_different_batches_uses_the_average_gradient():
    net = make_net()
    solver = Solver(net, base_lr=0.1, iter_size=3)
    w0 = weights(net)
    g = [gradients(net, batch(k)) for k in range(3)]
    losses = []
    for k in range(3):
        net.forward(**batch(k))
        losses.append(net.loss)
    loss = solver.step(1, feed=batch)  # asks for passes k = 0, 1, 2
    assert loss == pytest.approx(np.mean(losses), rel=1e-12)
    for name, w in weights(net).items():
        mean = sum(gk[name] for gk in g) / 3
        np.testing.assert_allclose(w, w0[name] - solver.param.base_lr * mean, rtol=1e-12)


def test_feed_is_asked_for_pass_iter_times_iter_size_plus_pass():
    fake = FakeNet()
    solver = Solver(fake, base_lr=0.1, iter_size=2)
    solver.step(2, feed=lambda k: {"k": k})
    assert [s["k"] for s in fake.seen] == [0, 1, 2, 3]
    solver.step(1, feed=iter([{"k": "a"}, {"k": "b"}]))
    solver.step(1, feed={"k": "same"})
    assert [s["k"] for s in fake.seen[4:]] == ["a", "b", "same", "same"]
    with pytest.raises(SolverError, match="ran out of batches"):
        solver.step(1, feed=iter([{}]))
    with pytest.raises(TypeError, match="dict"):
        solver.step(1, feed=lambda k: [1, 2])
    with pytest.raises(TypeError, match="feed"):
        solver.step(1, feed=3)


def test_loss_is_smoothed_over_average_loss():
    fake = FakeNet()  # iteration losses 1, 2, 3, ...
    solver = Solver(fake, base_lr=0.1, average_loss=3)
    assert solver.step(0) is None
    assert solver.step(2) == 2.0
    assert solver.loss == 1.5
    assert solver.step(3) == 5.0
    assert solver.loss == 4.0


# -- snapshots ----------------------------------------------------------------------------


def run(kind, dtype, k, m, tmp_path=None, **extra):
    settings = dict(SETTINGS[kind], weight_decay=0.001, **extra)
    net = make_net(dtype=dtype)
    solver = Solver(net, type=kind, **settings)
    solver.step(k, feed=batch)
    if tmp_path is None:
        solver.step(m, feed=batch)
        return net, solver
    model, state = solver.snapshot(tmp_path / "snap")
    fresh = make_net(dtype=dtype, seed=99)  # different initial weights: restore must load them
    resumed = Solver(fresh, type=kind, **settings)
    resumed.restore(state)
    assert resumed.iter == k
    resumed.step(m, feed=batch)
    return fresh, resumed


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", list(SOLVERS))
def test_restore_and_continue_is_bit_identical(kind, dtype, tmp_path):
    # stepvalues 1, 2 both passed by iteration 3: a lost current_step would not catch up at once
    extra = dict(lr_policy="multistep", gamma=0.5, stepvalue=[1, 2, 5], iter_size=2)
    net, solver = run(kind, dtype, 3, 3, **extra)
    fresh, resumed = run(kind, dtype, 3, 3, tmp_path, **extra)
    assert resumed.iter == solver.iter == 6
    assert resumed.current_step == solver.current_step == 3
    for a, b in zip(net.learnable_params, fresh.learnable_params):
        assert a.blob.data.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(a.blob.data, b.blob.data)
    for a, b in zip(solver.history, resumed.history):
        np.testing.assert_array_equal(a, b)


def test_restore_of_shared_params_is_bit_identical(tmp_path):
    """The caffemodel holds a shared param once (its owner's layer); restore fills every sharer."""
    def solver_for(seed):
        return Solver(Net(SHARED_NET, dtype="float64", seed=seed), type="Adam", base_lr=0.01,
                      momentum=0.9, momentum2=0.999)

    straight, interrupted = solver_for(0), solver_for(0)
    straight.step(5, feed=batch)
    interrupted.step(2, feed=batch)
    model, state = interrupted.snapshot(tmp_path / "shared")
    assert [lp.name for lp in NetParameter.FromString(model.read_bytes()).layer] == ["ip1"]
    resumed = solver_for(seed=7)
    resumed.restore(state)
    resumed.step(3, feed=batch)
    for name in ("ip1", "ip2"):
        for a, b in zip(straight.net.params[name], resumed.net.params[name]):
            np.testing.assert_array_equal(a.data, b.data)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_snapshot_files_are_caffe_protos(dtype, tmp_path):
    net = make_net(dtype=dtype)
    solver = Solver(net, type="Adam", base_lr=0.01, momentum=0.9, momentum2=0.999)
    solver.step(2, feed=batch)
    model, state_path = solver.snapshot(tmp_path / "run" / "tagger")
    assert model == tmp_path / "run" / "tagger_iter_2.caffemodel"
    assert state_path == tmp_path / "run" / "tagger_iter_2.solverstate"
    assert sorted(os.listdir(tmp_path / "run")) == [model.name, state_path.name]
    weights_proto = NetParameter.FromString(model.read_bytes())
    assert [lp.name for lp in weights_proto.layer] == ["ip"]
    state = SolverState.FromString(state_path.read_bytes())
    assert state.iter == 2 and state.learned_net == model.name
    assert len(state.history) == 4  # Adam: m for w, b, then v for w, b
    assert [tuple(h.shape.dim) for h in state.history] == [(2, 3), (2,), (2, 3), (2,)]
    for h, value in zip(state.history, solver.history):
        stored = h.double_data if dtype == "float64" else h.data
        np.testing.assert_array_equal(np.asarray(stored, dtype), value.ravel())


def test_snapshot_every_n_iterations_and_solve(tmp_path):
    net = make_net()
    solver = Solver(net, base_lr=0.1, max_iter=5, snapshot=2,
                    snapshot_prefix=str(tmp_path / "s"))
    assert solver.solve(feed=batch) == solver.loss
    assert solver.iter == 5
    assert sorted(os.listdir(tmp_path)) == [
        f"s_iter_{i}.{ext}" for i in (2, 4, 5) for ext in ("caffemodel", "solverstate")
    ]
    again = Solver(make_net(seed=3), base_lr=0.1, max_iter=5)
    again.solve(feed=batch, resume=tmp_path / "s_iter_4.solverstate")
    for a, b in zip(net.learnable_params, again.net.learnable_params):
        np.testing.assert_array_equal(a.blob.data, b.blob.data)


def _snapshot_files(folder):
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


@pytest.mark.parametrize("fail", ["replace", "fsync"])
def test_crash_during_snapshot_leaves_the_old_snapshot_intact(fail, tmp_path, monkeypatch):
    net = make_net()
    solver = Solver(net, base_lr=0.1)
    solver.step(1, feed=batch)
    solver.snapshot(tmp_path / "snap")
    before = _snapshot_files(tmp_path)
    net.params["ip"][0].data[...] += 1.0  # a different snapshot at the same iteration
    calls = []
    real = getattr(os, fail)

    def crash(*args):
        calls.append(args)
        if fail == "replace" or len(calls) == 2:  # fsync: while writing the second file
            raise OSError("simulated crash")
        return real(*args)

    monkeypatch.setattr(os, fail, crash)
    with pytest.raises(OSError, match="simulated crash"):
        solver.snapshot(tmp_path / "snap")
    monkeypatch.undo()
    assert _snapshot_files(tmp_path) == before  # no temp file, old bytes


def test_crash_during_first_snapshot_leaves_no_file(tmp_path, monkeypatch):
    solver = Solver(make_net(), base_lr=0.1)

    def crash(*args):
        raise OSError("simulated crash")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        solver.snapshot(tmp_path / "snap")
    assert os.listdir(tmp_path) == []


def test_restore_finds_a_caffe_style_learned_net_relative_to_the_working_dir(
    tmp_path, monkeypatch
):
    solver = Solver(make_net(), base_lr=0.1, momentum=0.9)
    solver.step(2, feed=batch)
    model, state_path = solver.snapshot(tmp_path / "snaps" / "s")
    state = SolverState.FromString(state_path.read_bytes())
    state.learned_net = "snaps/" + model.name  # as Caffe writes it: the path it was given
    state_path.write_bytes(state.SerializeToString())
    monkeypatch.chdir(tmp_path)
    fresh = make_net(seed=5)
    Solver(fresh, base_lr=0.1, momentum=0.9).restore(state_path)
    np.testing.assert_array_equal(fresh.params["ip"][0].data, solver.net.params["ip"][0].data)


def test_restore_errors(tmp_path):
    solver = Solver(make_net(), base_lr=0.1)
    solver.step(1, feed=batch)
    model, state_path = solver.snapshot(tmp_path / "s")
    with pytest.raises(SolverError, match="holds 2 history blobs; a Adam solver .* needs 4"):
        Solver(make_net(), type="Adam", base_lr=0.1, **usual_fields("Adam")).restore(state_path)
    with pytest.raises(FileNotFoundError, match="no solver state file"):
        solver.restore(tmp_path / "missing.solverstate")
    garbage = tmp_path / "garbage.solverstate"
    garbage.write_bytes(b"\xff\xff\xff")
    with pytest.raises(FileFormatError, match="garbage.solverstate: not a solver state"):
        solver.restore(garbage)
    garbage.write_bytes(b"")
    with pytest.raises(SolverError, match="not a solver state"):
        solver.restore(garbage)
    model.unlink()
    with pytest.raises(FileNotFoundError, match="learned_net"):
        solver.restore(state_path)
    other = Net((NET % ("", "")).replace("dim: 4 dim: 3", "dim: 4 dim: 5"), dtype="float64")
    with pytest.raises(SolverError, match="history blob 0 has shape"):
        Solver(other, base_lr=0.1).restore(state_path)


# -- settings and errors -------------------------------------------------------------------


def test_solver_prototxt_text_path_and_overrides(tmp_path):
    text = 'type: "Nesterov" base_lr: 0.5 momentum: 0.9 lr_policy: "step" stepsize: 10 gamma: 0.1'
    path = tmp_path / "solver.prototxt"
    path.write_text(text)
    for source in (text, str(path), path, SolverParameter(type="Nesterov", base_lr=0.5,
                                                          momentum=0.9, lr_policy="step",
                                                          stepsize=10, gamma=0.1)):
        solver = Solver(FakeNet(), source, base_lr=0.25, type="adam", momentum2=0.999)
        assert solver.type == "Adam" and solver.param.type == "Adam"
        assert solver.param.base_lr == 0.25 and solver.param.stepsize == 10
    legacy = Solver(FakeNet(), "base_lr: 0.1 momentum: 0.9 momentum2: 0.999 solver_type: ADAM")
    assert legacy.type == "Adam" and not legacy.param.HasField("solver_type")
    assert Solver(FakeNet(), "base_lr: 0.1 solver_type: ADAM", type="SGD").type == "SGD"
    assert Solver(FakeNet(), 'base_lr: 0.1 momentum: 0.9 type: "Adam"',
                  solver_type="NESTEROV").type == "Nesterov"
    assert Solver(FakeNet(), base_lr=0.1, stepvalue=5, max_iter=1e4).param.max_iter == 10000
    with pytest.raises(SolverError, match="'type' and 'solver_type' are both set"):
        Solver(FakeNet(), 'base_lr: 0.1 type: "SGD" solver_type: ADAM')


def test_caffe_fields_without_meaning_here_warn():
    with pytest.warns(UserWarning, match=r"test_iter.*test_interval.*solver_mode"):
        Solver(FakeNet(), 'base_lr: 0.1 test_iter: 10 test_interval: 100 solver_mode: GPU')
    with pytest.warns(UserWarning, match="random_seed"):
        Solver(FakeNet(), base_lr=0.1, random_seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Solver(FakeNet(), base_lr=0.1)


DROPOUT_NET = """
layer { name: "in" type: "Input" top: "x" top: "t" input_param { shape { dim: 4 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "h" param { name: "W" }
        param { name: "b" } inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "drop" type: "Dropout" bottom: "h" top: "h" dropout_param { dropout_ratio: 0.5 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "t" top: "loss" }
"""


def test_random_seed_makes_two_runs_identical():
    x = np.random.default_rng(0).normal(size=(4, 3))

    def train(seed):
        net = Net(DROPOUT_NET, dtype="float64", seed=11)  # same weights; masks from the solver
        solver = Solver(net, base_lr=0.1, random_seed=seed)
        losses = [solver.step(1, feed=lambda _: {"x": x, "t": x}) for _ in range(4)]
        return losses, net.params["ip"][0].data.copy()

    (losses_a, w_a), (losses_b, w_b) = train(3), train(3)
    assert losses_a == losses_b
    np.testing.assert_array_equal(w_a, w_b)
    assert train(4)[0] != losses_a


@pytest.mark.parametrize(
    "fields, error, message",
    [
        (dict(base_lrr=0.1), TypeError, "'base_lrr'; did you mean 'base_lr'"),
        (dict(base_lr="fast"), TypeError, "field 'base_lr'"),
        (dict(base_lr=0.1, stepvalue=["a"]), TypeError, "field 'stepvalue'"),
        (dict(), SolverError, "'base_lr' is not set"),
        (dict(base_lr=-1.0), SolverError, "'base_lr': expected a number >= 0, found -1"),
        (dict(base_lr=0.1, type="AdaMax"), SolverError, "'type': expected one of"),
        (dict(base_lr=0.1, type="SGD", solver_type=1), SolverError, "'type' or 'solver_type'"),
        (dict(base_lr=0.1, lr_policy="triangular"), SolverError, "'lr_policy'.*found 'triangular'"),
        (dict(base_lr=0.1, lr_policy="step"), SolverError, "'stepsize': expected an integer > 0"),
        (dict(base_lr=0.1, lr_policy="poly"), SolverError, "'max_iter'"),
        (dict(base_lr=0.1, lr_policy="multistep", stepvalue=[5, 3]), SolverError, "stepvalue"),
        (dict(base_lr=0.1, regularization_type="L3"), SolverError, "'regularization_type'"),
        (dict(base_lr=0.1, iter_size=0), SolverError, "'iter_size'.*found 0"),
        (dict(base_lr=0.1, average_loss=0), SolverError, "'average_loss'"),
        (dict(base_lr=0.1, type="Adam", momentum=1.0), SolverError, "'momentum'.*Adam"),
        (dict(base_lr=0.1, momentum=1.5), SolverError, r"'momentum'.*\[0, 1\) for SGD.*1\.5"),
        (dict(base_lr=0.1, type="Nesterov", momentum=1.0), SolverError, "'momentum'.*Nesterov"),
        (dict(base_lr=0.1, type="AdaDelta", momentum=2.0), SolverError, "'momentum'.*AdaDelta"),
        (dict(base_lr=0.1, type="Adam", momentum2=1.0), SolverError, "'momentum2'.*Adam"),
        (dict(base_lr=0.1, clip_gradients=-1), SolverError, "'clip_gradients'.*> 0.*-1"),
        (dict(base_lr=0.1, clip_gradients=0), SolverError, "'clip_gradients'.*> 0.*0"),
        (dict(base_lr=0.1, type="Rprop"), SolverError, "'type'.*registered.*Rprop"),
        (dict(base_lr=0.1, type="AdaGrad", momentum=0.9), SolverError, "cannot be used with"),
        (dict(base_lr=0.1, type="RMSProp", rms_decay=1.5), SolverError, "'rms_decay'"),
        (dict(base_lr=0.1, snapshot=10), SolverError, "'snapshot_prefix' is not set"),
        (dict(base_lr=0.1, snapshot_format="HDF5"), SolverError, "'snapshot_format'.*HDF5"),
    ],
)
def test_bad_fields_name_the_field(fields, error, message):
    with pytest.raises(error, match=message):
        Solver(FakeNet(), **fields)


def test_bad_nets_and_calls():
    with pytest.raises(TypeError, match="lacks loss, store, backward, to_proto, copy_from"):
        Solver(type("Half", (), {"forward": None, "learnable_params": []})(), base_lr=0.1)
    solver = Solver(FakeNet(), base_lr=0.1)
    with pytest.raises(ValueError, match="step"):
        solver.step(-1)
    with pytest.raises(SolverError, match="needs a prefix"):
        solver.snapshot()


def test_a_solver_registered_from_outside_trains_and_snapshots(tmp_path):
    """A new type: one decorator, its slots and checks; then it runs, snapshots and restores."""

    def check(param):
        if param.momentum > 0.5:
            raise SolverError("solver field 'momentum': expected <= 0.5 for HeavyBall")

    @register_solver("HeavyBall", slots=1, check=check)
    def heavy_ball(diff, history, rate, param, step):
        (h,) = history
        h *= diff.dtype.type(param.momentum)
        h += diff
        diff[...] = rate * h

    try:
        with pytest.raises(SolverError, match="<= 0.5 for HeavyBall"):
            Solver(make_net(), type="heavyball", base_lr=0.1, momentum=0.9)
        with pytest.raises(ValueError, match="already registered"):
            register_solver("heavyBALL", slots=1)(heavy_ball)
        net = make_net()
        w, g = net.params["ip"][0].data.copy(), gradients(net, batch(0))["w"]
        solver = Solver(net, type="HeavyBall", base_lr=0.125, momentum=0.5)
        solver.step(1, feed=batch)
        np.testing.assert_allclose(net.params["ip"][0].data, w - 0.125 * g, rtol=1e-12)
        _, state = solver.snapshot(tmp_path / "hb")
        solver.step(2, feed=batch)
        again = Solver(make_net(seed=5), type="HeavyBall", base_lr=0.125, momentum=0.5)
        again.restore(state)
        again.step(2, feed=batch)
        np.testing.assert_array_equal(again.net.store.data, net.store.data)
    finally:
        del SOLVERS["HeavyBall"]


MULTS_NET = """
layer { name: "in" type: "Input" top: "x" top: "y"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 6 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "p1"
        param { name: "w1" } param { name: "b1" lr_mult: 2 } %s }
layer { name: "ip2" type: "InnerProduct" bottom: "x" top: "p2"
        param { name: "w2" decay_mult: 0.5 } param { name: "b2" lr_mult: 0 } %s }
layer { name: "ip3" type: "InnerProduct" bottom: "x" top: "p3"
        param { name: "w3" decay_mult: 0 } param { name: "b3" } %s }
layer { name: "cat" type: "Concat" bottom: "p1" bottom: "p2" bottom: "p3" top: "p" }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
""" % (('''inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 }
                             bias_filler { type: "gaussian" std: 0.5 } }''',) * 3)


@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"])
@pytest.mark.parametrize("regularization", ["L2", "L1"])
def test_updating_runs_of_params_at_once_equals_caffes_update_per_param(kind, regularization):
    """Spans of adjacent params with mixed lr_mult/decay_mult (and a frozen one) update
    exactly as one param at a time: the same rule registered per param gives the same bits."""
    builtin = SOLVERS[kind]
    register_solver(f"{kind}PerParam", builtin.slots, builtin.check, elementwise=False)(
        builtin.update)
    try:
        nets = []
        for name in (kind, f"{kind}PerParam"):
            net = Net(MULTS_NET, dtype="float64")
            solver = Solver(net, type=name, weight_decay=0.01,
                            regularization_type=regularization, **SETTINGS[kind])
            solver.step(3, feed=lambda k: {"x": batch(k)["x"], "y": np.tile(batch(k)["y"], 3)})
            nets.append((net, solver))
        (spans, by_span), (params, by_param) = nets
        np.testing.assert_array_equal(spans.store.data, params.store.data)
        for a, b in zip(by_span.history, by_param.history):
            np.testing.assert_array_equal(a, b)
        assert not np.any(by_span.history[3]), "the lr_mult 0 param keeps a zero history"
    finally:
        del SOLVERS[f"{kind}PerParam"]


def test_params_changing_under_the_solver_is_an_error():
    net = make_net()
    solver = Solver(net, base_lr=0.1)
    net.learnable_params.reverse()
    with pytest.raises(SolverError, match="changed under the solver"):
        solver.step(1, feed=batch)


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float64", 1e-12)])
def test_fused_adam_equals_its_array_reference(monkeypatch, dtype, tol):
    """The one-pass Adam kernel (the default engine) against Adam's array code
    (UNROLL_ENGINE=reference), over spans with mixed lr_mult, a frozen param and decay."""
    results = []
    for engine in ("fused", "reference"):
        monkeypatch.setenv("UNROLL_ENGINE", engine)
        net = Net(MULTS_NET, dtype=dtype)
        solver = Solver(net, type="Adam", weight_decay=0.01, **SETTINGS["Adam"])
        solver.step(4, feed=lambda k: {"x": batch(k)["x"], "y": np.tile(batch(k)["y"], 3)})
        results.append((net.store.data.copy(), [h.copy() for h in solver.history]))
    (data, history), (want_data, want_history) = results
    np.testing.assert_allclose(data, want_data, rtol=tol, atol=tol)
    for got, want in zip(history, want_history):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# -- no silent Caffe defaults ------------------------------------------------------------


@pytest.mark.parametrize("kind", [k for k in SOLVERS if SOLVERS[k].required])
def test_every_field_a_type_needs_is_refused_unset_naming_its_usual_value(kind):
    usual = usual_fields(kind)
    assert usual == SOLVERS[kind].required
    for missing, value in usual.items():
        given = {k: v for k, v in usual.items() if k != missing}
        with pytest.raises(SolverError, match=rf"'{missing}' is not set, and {kind} needs it.*"
                                              rf"usually {missing}={value}"):
            Solver(FakeNet(), type=kind, base_lr=0.1, **given)
    Solver(FakeNet(), type=kind, base_lr=0.1, **usual)


def test_adam_without_momentum_is_refused_and_an_explicit_zero_runs_as_given():
    with pytest.raises(SolverError, match=r"'momentum' is not set.*Adam.*momentum=0\.9"):
        Solver(make_net(), type="Adam", base_lr=0.01, momentum2=0.999)
    with pytest.raises(SolverError, match=r"'momentum2' is not set.*Adam.*momentum2=0\.999"):
        Solver(make_net(), type="Adam", base_lr=0.01, momentum=0.9)
    # an explicit 0 (beta1 = 0: RMSProp-like Adam) is what it says, by keyword or from a file
    for source, fields in ((None, dict(type="Adam", momentum=0, momentum2=0.999)),
                           ('type: "Adam" momentum: 0 momentum2: 0.999', {})):
        net = make_net()
        solver = Solver(net, source, base_lr=0.01, **fields)
        assert solver.param.momentum == 0 and solver.param.HasField("momentum")
        w = net.params["ip"][0].data.copy()
        hist = [np.zeros_like(w), np.zeros_like(w)]
        for k in range(3):
            g = gradients(net, batch(k))["w"]
            w = hand_step("Adam", solver.param, w, g, hist, k + 1, lr_mult=1.0, decay_mult=1.0)
            solver.step(1, feed=batch)
            np.testing.assert_allclose(net.params["ip"][0].data, w, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("policy, fields", [
    ("step", dict(stepsize=10, gamma=0.1)),
    ("exp", dict(gamma=0.99)),
    ("inv", dict(gamma=1e-4, power=0.75)),
    ("multistep", dict(gamma=0.1, stepvalue=[5, 10])),
    ("poly", dict(power=1.0, max_iter=100)),
    ("sigmoid", dict(gamma=0.01, stepsize=10)),
])
def test_every_field_an_lr_policy_needs_is_refused_unset(policy, fields):
    for missing in LR_POLICIES[policy].required:
        given = {k: v for k, v in fields.items() if k != missing}
        with pytest.raises(SolverError, match=rf"'{missing}' is not set, and lr_policy "
                                              rf"\"{policy}\" needs it"):
            Solver(FakeNet(), base_lr=0.1, lr_policy=policy, **given)
    # an explicit 0 is taken as given: "step" with gamma 0 stops learning after one step
    zeros = {k: ([0] if k == "stepvalue" else 0) for k in LR_POLICIES[policy].required}
    solver = Solver(FakeNet(), base_lr=0.1, lr_policy=policy, **{**fields, **zeros})
    assert all(solver.param.HasField(k) for k in zeros if k != "stepvalue")


def test_a_caffe_solver_file_that_sets_its_fields_runs_as_in_caffe(tmp_path):
    path = tmp_path / "lenet_solver_adam.prototxt"  # BVLC examples/mnist, the test net dropped
    path.write_text('base_lr: 0.001 momentum: 0.9 momentum2: 0.999 lr_policy: "fixed"\n'
                    'delta: 1e-8 max_iter: 10000 type: "Adam"\n')
    assert Solver(FakeNet(), path).param.momentum == pytest.approx(0.9)
    path.write_text('base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005 lr_policy: "inv"\n'
                    'gamma: 0.0001 power: 0.75 max_iter: 10000\n')
    assert Solver(FakeNet(), path).lr_policy == "inv"


# -- non-finite iterations ----------------------------------------------------------------


def poisoned(bad: set):
    """batch(k), with a NaN input at the iterations in ``bad``."""
    def feed(k):
        inputs = batch(k)
        if k in bad:
            inputs["x"][0, 0] = np.nan
        return inputs
    return feed


def test_stop_raises_before_a_non_finite_update_and_leaves_the_weights():
    net = make_net()
    solver = Solver(net, type="SGD", base_lr=0.1, momentum=0.9, nonfinite="stop")
    solver.step(2, feed=poisoned(set()))
    before, history = weights(net), [h.copy() for h in solver.history]
    with pytest.raises(NonFiniteError, match=r"iteration 2: loss nan, gradient norm nan; not "
                                             r"updated.*nonfinite=\"stop\"") as caught:
        solver.step(3, feed=poisoned({2}))
    assert caught.value.step.iter == 2 and math.isnan(caught.value.step.loss)
    assert solver.iter == 2
    for name, w in weights(net).items():
        np.testing.assert_array_equal(w, before[name])
    for h, h0 in zip(solver.history, history):
        np.testing.assert_array_equal(h, h0)


def test_skip_leaves_bad_iterations_out_up_to_max_skipped():
    net, clean = make_net(), make_net()
    solver = Solver(net, type="Adam", base_lr=0.01, momentum=0.9, momentum2=0.999,
                    nonfinite="skip", max_skipped=2)
    reference = Solver(clean, type="Adam", base_lr=0.01, momentum=0.9, momentum2=0.999)
    losses = [solver.step(1, feed=poisoned({1, 3})) for _ in range(5)]
    assert [s.iter for s in solver.skipped] == [1, 3] and solver.iter == 5
    assert all(math.isnan(s.loss) and math.isnan(s.gradient_norm) for s in solver.skipped)
    assert math.isnan(losses[1]) and np.isfinite([losses[k] for k in (0, 2, 4)]).all()
    assert math.isfinite(solver.loss)  # the average leaves the skipped ones out
    # the applied iterations are those of a run that never saw the bad batches (iterations
    # still count: Adam's bias correction sees t = iter + 1)
    for k in (0, 2, 4):
        reference.iter = k
        reference.step(1, feed=batch)
    for name, w in weights(net).items():
        np.testing.assert_allclose(w, weights(clean)[name], rtol=1e-12)
    with pytest.raises(NonFiniteError, match=r"iteration 5.*one skip more than max_skipped=2 "
                                             r"\(skipped before: iterations \[1, 3\]\)"):
        solver.step(1, feed=poisoned({5}))


def test_a_finite_loss_with_a_non_finite_gradient_is_skipped_too():
    net = make_net()
    solver = Solver(net, base_lr=0.1, nonfinite="skip", max_skipped=1)
    net.forward(**batch(0))
    net.clear_param_diffs()
    net.backward()
    net.store.diff[0] = np.inf
    before = weights(net)
    assert solver.update() is False and solver.skipped[0].gradient_norm == math.inf
    assert math.isfinite(solver.skipped[0].loss)
    assert all(np.array_equal(w, before[n]) for n, w in weights(net).items())


def test_without_a_policy_a_non_finite_step_is_applied_as_caffe_does():
    net = make_net()
    with np.errstate(invalid="ignore"):
        Solver(net, base_lr=0.1).step(1, feed=poisoned({0}))
    assert np.isnan(net.store.data).any()


@pytest.mark.parametrize("options, message", [
    (dict(nonfinite="ignore"), r"nonfinite: expected one of \[None, 'stop', 'skip'\]"),
    (dict(nonfinite="skip"), "max_skipped goes with nonfinite=\"skip\""),
    (dict(nonfinite="stop", max_skipped=3), "max_skipped goes with"),
    (dict(nonfinite="skip", max_skipped=-1), "max_skipped: expected an integer >= 0"),
])
def test_bad_nonfinite_policies_are_refused(options, message):
    with pytest.raises(SolverError, match=message):
        Solver(FakeNet(), base_lr=0.1, **options)
