"""Update rules as registered functions: AdamW against its formula, Adam against torch's
form, the rules called alone (docs/design.md, Solver)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll.core.proto import SolverParameter
from unroll.engine.net import Net
from unroll.train.solver import SOLVERS, Solver, SolverError

NET = """
layer { name: "in" type: "Input" top: "x" top: "y"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 4 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "p1"
        param { name: "w1" lr_mult: 2 decay_mult: 0.5 } param { name: "b1" decay_mult: 0 }
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "x" top: "p2"
        param { name: "w2" lr_mult: 0.5 decay_mult: 3 } param { name: "b2" lr_mult: 0 }
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "cat" type: "Concat" bottom: "p1" bottom: "p2" top: "p" }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
"""
MULTS = {"w1": (2.0, 0.5), "b1": (1.0, 0.0), "w2": (0.5, 3.0), "b2": (0.0, 1.0)}
ADAMW = dict(type="AdamW", momentum=0.9, momentum2=0.999, delta=1e-4)


def batch(k: int) -> dict:
    rng = np.random.default_rng(3000 + k)
    return {"x": rng.normal(size=(4, 3)), "y": rng.normal(size=(4, 4))}


def gradients(net, inputs) -> dict:
    net.clear_param_diffs()
    net.forward(**inputs)
    net.backward()
    return {p.name: p.blob.diff.copy() for p in net.learnable_params}


@given(base_lr=st.floats(1e-3, 0.1), weight_decay=st.just(0.0) | st.floats(0, 0.5),
       schedule=st.sampled_from([{}, dict(lr_policy="cosine", max_iter=6, warmup_iter=2)]))
def test_adamw_follows_its_formula_with_lr_mult_and_decay_mult(base_lr, weight_decay, schedule):
    """p -= rate * m_hat / (sqrt(v_hat) + eps) + rate * wd * p, rate = lr(it) * lr_mult and
    wd = weight_decay * decay_mult, over six steps: the gradient carries no decay."""
    net, probe = Net(NET, dtype="float64", seed=1), Net(NET, dtype="float64", seed=1)
    solver = Solver(net, base_lr=base_lr, weight_decay=weight_decay, **ADAMW, **schedule)
    p = solver.param
    w = {q.name: q.blob.data.copy() for q in net.learnable_params}
    m = {name: np.zeros_like(v) for name, v in w.items()}
    v = {name: np.zeros_like(value) for name, value in w.items()}
    b1, b2, eps = p.momentum, p.momentum2, p.delta
    for it in range(6):
        for q in probe.learnable_params:
            q.blob.data[...] = w[q.name]
        g = gradients(probe, batch(it))
        lr, t = solver.get_learning_rate(), it + 1
        for name, (lr_mult, decay_mult) in MULTS.items():
            if lr_mult == 0:
                continue
            m[name] = b1 * m[name] + (1 - b1) * g[name]
            v[name] = b2 * v[name] + (1 - b2) * g[name] ** 2
            m_hat, v_hat = m[name] / (1 - b1**t), v[name] / (1 - b2**t)
            rate = lr * lr_mult
            w[name] = w[name] - (rate * m_hat / (np.sqrt(v_hat) + eps)
                                 + rate * p.weight_decay * decay_mult * w[name])
        solver.step(1, feed=batch)
        for q in net.learnable_params:
            np.testing.assert_allclose(q.blob.data, w[q.name], rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(solver.history[3], 0)  # b2, lr_mult 0: history untouched


def run_rule(kind: str, param: SolverParameter, steps: int, rate: float = 0.01):
    """The registered rule called alone, on one array, ``steps`` times."""
    rule = SOLVERS[kind]
    rng = np.random.default_rng(7)
    history = [np.zeros(5) for _ in range(rule.slots)]
    out = []
    for step in range(steps):
        diff = rng.normal(size=5) * 1e-3
        rule.update(diff, history, np.float64(rate), param, step)
        out.append(diff.copy())
    return out


def test_caffes_adam_is_torchs_with_eps_over_the_root_of_one_minus_beta2_to_the_t():
    """Adam with delta d at step t equals AdamW's torch form (no decay) with eps d /
    sqrt(1 - b2^t): Caffe's bias correction sits in the rate."""
    b2 = SolverParameter(momentum2=0.999).momentum2  # float32, as the rules see it
    caffe = run_rule("Adam", SolverParameter(momentum=0.9, momentum2=b2, delta=1e-3), 4)
    for t in range(1, 5):
        eps = 1e-3 / math.sqrt(1 - b2**t)
        torch_form = run_rule("AdamW", SolverParameter(momentum=0.9, momentum2=b2, delta=eps), t)
        np.testing.assert_allclose(caffe[t - 1], torch_form[t - 1], rtol=1e-6)
    plain = run_rule("AdamW", SolverParameter(momentum=0.9, momentum2=b2, delta=1e-3), 4)
    assert not np.allclose(caffe[0], plain[0], rtol=1e-3), "the two forms differ early"


@pytest.mark.parametrize("kind", ["Adam", "AdamW"])
@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float64", 1e-12)])
def test_fused_adam_forms_equal_their_array_reference(monkeypatch, kind, dtype, tol):
    results = []
    for engine in ("fused", "reference"):
        monkeypatch.setenv("UNROLL_ENGINE", engine)
        net = Net(NET, dtype=dtype)
        solver = Solver(net, base_lr=0.01, weight_decay=0.05,
                        **{**ADAMW, "type": kind})
        solver.step(4, feed=batch)
        results.append((net.store.data.copy(), [h.copy() for h in solver.history]))
    (data, history), (want_data, want_history) = results
    np.testing.assert_allclose(data, want_data, rtol=tol, atol=tol)
    for got, want in zip(history, want_history):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("fields, message", [
    (dict(momentum=0.9, momentum2=0.999),
     r"'weight_decay' is not set, and AdamW needs it.*usually weight_decay=0\.01"),
    (dict(momentum=0.9, weight_decay=0.01), r"'momentum2' is not set, and AdamW needs it"),
    (dict(momentum=0.9, momentum2=0.999, weight_decay=0.01, regularization_type="L1"),
     r"'regularization_type': expected \"L2\" for AdamW.*found 'L1'"),
    (dict(momentum=1.0, momentum2=0.999, weight_decay=0.01),
     r"'momentum': expected a number in \[0, 1\)"),
    (dict(momentum=0.9, momentum2=0.999, weight_decay=0.01, delta=0),
     r"'delta': expected a number > 0"),
])
def test_bad_adamw_settings_are_one_line_errors(fields, message):
    with pytest.raises(SolverError, match=message) as caught:
        Solver(Net(NET), type="AdamW", base_lr=0.01, **fields)
    assert "\n" not in str(caught.value)
