"""One weight-gradient GEMM per shared param, and diffs passed through without a copy.

A net that plans its memory places the rows of every layer sharing a weight
back to back and computes that weight's gradient once, after the last sharer's
backward; Eltwise SUM hands its top's diff to its bottoms as the same memory.
Both must leave Caffe's numbers as they are: the owner's diff is the sum over
every sharer. Each test compares against the same net with ``plan_memory=False``
(per-layer accumulation, every diff written), in float64.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.net_helpers import host
from unroll import expand, to_prototxt
from unroll.engine.net import Net
from unroll.testing import builtin_templates

CELLS = builtin_templates("step")
RECURRENT_WEIGHT = {"rnn": "W_hh", "lstm": "W_hc", "lstm_primitive": "W_hc", "gru": "W_h",
                    "gru_primitive": "W_h", "lstm_attention": "W_hc",
                    "lstm_attention_feed": "W_hc"}


def run(text: str, plan: bool, feed: dict, seed: int = 2) -> dict:
    """Outputs, the loss, input diffs and param diffs after one forward and backward."""
    net = Net(text, dtype="float64", plan_memory=plan)
    rng = np.random.default_rng(seed)
    for p in net.learnable_params:
        p.blob.data[...] = rng.uniform(-0.8, 0.8, p.blob.shape)
    net.clear_param_diffs()
    out = net.forward(**feed)
    net.backward()
    got = {f"out {k}": host(v) for k, v in out.items()}
    got["loss"] = np.array(net.loss)
    got.update((f"diff {name}", host(net.blobs[name].diff)) for name in feed
               if name not in ("cont", "target"))
    got.update((f"param {p.name}", host(p.blob.diff)) for p in net.learnable_params)
    return got, net


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-10, atol=1e-12, err_msg=k)


def recurrent_net(cell, T, N, direction, layers, cont, hidden=4, D=3):
    """An unrolled ``cell`` regressed onto a target, with its feed."""
    width = hidden * (2 if direction == "bidirectional" else 1)
    text = to_prototxt(expand(cell, steps=T, batch=N, input_dim=D, hidden=hidden,
                              direction=direction, layers=layers)) + f"""
layer {{ name: "target" type: "Input" top: "target"
        input_param {{ shape {{ dim: {T} dim: {N} dim: {width} }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "target" top: "loss" }}
"""
    rng = np.random.default_rng(T * 7 + N)
    feed = dict(x=rng.normal(size=(T, N, D)), cont=cont,
                target=rng.normal(size=(T, N, width)))
    return "force_backward: true\n" + text, feed


@given(cell=st.sampled_from(CELLS),
       direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
       layers=st.integers(1, 2), T=st.integers(1, 6), N=st.integers(1, 3),
       data=st.data())
def test_batched_weight_gradients_equal_per_step_accumulation(cell, direction, layers, T, N,
                                                               data):
    cont = np.array(data.draw(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=N,
                                                max_size=N), min_size=T, max_size=T)))
    text, feed = recurrent_net(cell, T, N, direction, layers, cont)
    batched, net = run(text, True, feed)
    per_step, _ = run(text, False, feed)
    assert_same(batched, per_step)
    # every recurrent weight shared over T >= 2 steps is ONE GEMM over its T layers
    directions = 2 if direction == "bidirectional" else 1
    groups = net.batched_param_gradients
    recurrent = [name for name in groups if name.endswith(RECURRENT_WEIGHT[cell])]
    assert len(recurrent) == (layers * directions if T > 1 else 0)
    assert all(groups[name] == T for name in recurrent)


def over_three_parts(parts: str, d_in: int, d_out: int, out: str) -> str:
    """A net over x (6, d_in) cut into x0, x1, x2 along axis 0, then ``parts`` (reading
    x<k>, writing <out><k>), then a loss on the three outputs concatenated."""
    return f"""force_backward: true
layer {{ name: "in" type: "Input" top: "x" top: "target"
        input_param {{ shape {{ dim: 6 dim: {d_in} }} shape {{ dim: 6 dim: {d_out} }} }} }}
layer {{ name: "cut" type: "Slice" bottom: "x" top: "x0" top: "x1" top: "x2"
        slice_param {{ axis: 0 }} }}
{parts}
layer {{ name: "cat" type: "Concat" bottom: "{out}0" bottom: "{out}1" bottom: "{out}2"
        top: "{out}" concat_param {{ axis: 0 }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "{out}" bottom: "target" top: "loss" }}
"""


def shared_layers(extra: str = "", propagate: str = "") -> str:
    """Three InnerProducts sharing W and b over three Slice parts of x, then a loss."""
    ips = "".join(f"""
layer {{ name: "ip{k}" type: "InnerProduct" bottom: "x{k}" top: "y{k}"
        param {{ name: "W" {extra} }} param {{ name: "b" {extra} }} {propagate if k == 1 else ""}
        inner_product_param {{ num_output: 2 weight_filler {{ type: "gaussian" }} }} }}
layer {{ name: "sq{k}" type: "TanH" bottom: "y{k}" top: "z{k}" }}""" for k in range(3))
    return over_three_parts(ips, 3, 2, "z")


@pytest.mark.parametrize("extra, propagate, batched", [
    ("", "", {"W": 3}),
    ("lr_mult: 0", "", {"W": 3}),
    ("", "propagate_down: false", {"W": 3}),
])
def test_shared_inner_products_with_lr_mult_and_propagate_down(extra, propagate, batched):
    rng = np.random.default_rng(0)
    feed = dict(x=rng.normal(size=(6, 3)), target=rng.normal(size=(6, 2)))
    text = shared_layers(extra, propagate)
    got, net = run(text, True, feed)
    want, _ = run(text, False, feed)
    assert_same(got, want)
    assert net.batched_param_gradients == batched


def test_a_kept_row_is_not_moved_and_its_sharers_accumulate_one_by_one():
    rng = np.random.default_rng(1)
    feed = dict(x=rng.normal(size=(6, 3)), target=rng.normal(size=(6, 2)))
    text = shared_layers()
    net = Net(text, dtype="float64", keep=["x1"])
    assert net.batched_param_gradients == {}  # x1 keeps memory of its own
    got, _ = run(text, True, feed)
    want, _ = run(text, False, feed)
    assert_same(got, want)


@pytest.mark.parametrize("coeff", ["", "coeff: 1 coeff: 1", "coeff: 2 coeff: -1",
                                   "coeff: 1 coeff: 0.5"])
def test_eltwise_sum_passes_its_diff_through_or_scales_it(coeff):
    text = f"""force_backward: true
layer {{ name: "in" type: "Input" top: "x" top: "t" top: "u"
        input_param {{ shape {{ dim: 4 dim: 3 }} shape {{ dim: 4 dim: 3 }}
                      shape {{ dim: 4 dim: 3 }} }} }}
layer {{ name: "a" type: "TanH" bottom: "x" top: "a" }}
layer {{ name: "b" type: "Sigmoid" bottom: "x" top: "b" }}
layer {{ name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "s"
        eltwise_param {{ operation: SUM {coeff} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "s" top: "s" }}
layer {{ name: "prod" type: "Eltwise" bottom: "s" bottom: "u" top: "p"
        eltwise_param {{ operation: PROD }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "t" top: "loss" }}
"""
    rng = np.random.default_rng(4)
    feed = dict(x=rng.normal(size=(4, 3)), t=rng.normal(size=(4, 3)), u=rng.normal(size=(4, 3)))
    got, _ = run(text, True, feed)
    want, _ = run(text, False, feed)
    assert_same(got, want)


def test_sharers_using_the_weight_transposed_are_not_batched_with_the_others():
    """W (4, 4) shared by two layers as W and by one as W^T: only the first two are one GEMM."""
    ips = "".join(f"""
layer {{ name: "ip{k}" type: "InnerProduct" bottom: "x{k}" top: "y{k}" param {{ name: "W" }}
        inner_product_param {{ num_output: 4 bias_term: false transpose: {t}
                              weight_filler {{ type: "gaussian" }} }} }}"""
                  for k, t in enumerate(["false", "false", "true"]))
    text = over_three_parts(ips, 4, 4, "y")
    rng = np.random.default_rng(5)
    feed = dict(x=rng.normal(size=(6, 4)), target=rng.normal(size=(6, 4)))
    got, net = run(text, True, feed)
    want, _ = run(text, False, feed)
    assert_same(got, want)
    assert net.batched_param_gradients == {"W": 2}
