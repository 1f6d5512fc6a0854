"""A loss over a whole (T, N, .) output, run by chunks of time under a memory budget
(docs/design.md, 6. Memory, the whole-output loss): the budgeted net fits in a tenth of the
full plan and gives the full plan's loss, diffs and weight gradients bit for bit."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.net_helpers import host
from unroll import expand, to_prototxt
from unroll.core.errors import MemoryBudgetError
from unroll.core.proto import LayerParameter
from unroll.engine.memory import GRADIENT_CHUNK
from unroll.engine.net import Net
from unroll.testing.gradients import numeric_gradient
from unroll.train.bucketing import cont_from_lengths

IGNORE = -1


def whole_output_net(T, N, D, H, loss, V=5, ignore=False, normalization="VALID", chain=(),
                     force_backward=True, truth_first=True):
    """An LSTM layer, then ``chain`` (prototxt templates from "{b}" to "{t}") and one loss over
    its whole output: ``"softmax"`` (an InnerProduct at axis 2 to V scores, SoftmaxWithLoss
    of ``labels``, ``ignore``-ing IGNORE) or ``"euclidean"`` (of ``target``). The truth's
    Input comes first, or with ``truth_first=False`` after the last step."""
    net_param = expand("lstm", steps=T, batch=N, input_dim=D, hidden=H)
    net_param.force_backward = force_backward  # the diff of x too, to compare
    truth = LayerParameter(name="truth", type="Input",
                           top=["labels" if loss == "softmax" else "target"])
    truth.input_param.shape.add(dim=[T, N] if loss == "softmax" else [T, N, H])
    layers = list(net_param.layer)
    del net_param.layer[:]
    # the truth first: each chunk's loss runs early
    net_param.layer.extend([truth, *layers] if truth_first else [*layers, truth])
    text, blob = to_prototxt(net_param), "h"
    for k, template in enumerate(chain):
        text += template.format(b=blob, t=f"c{k}", k=k)
        blob = f"c{k}"
    if loss == "euclidean":
        return text + (f'layer {{ name: "loss" type: "EuclideanLoss" bottom: "{blob}" '
                       'bottom: "target" top: "loss" }\n')
    options = f"ignore_label: {IGNORE} " if ignore else ""
    return text + f"""
layer {{ name: "scores" type: "InnerProduct" bottom: "{blob}" top: "scores"
        param {{ name: "W_out" }} param {{ name: "b_out" }}
        inner_product_param {{ num_output: {V} axis: 2
                              weight_filler {{ type: "gaussian" std: 0.5 }}
                              bias_filler {{ type: "gaussian" std: 0.5 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "scores" bottom: "labels" top: "loss"
        loss_param {{ {options}normalization: {normalization} }} softmax_param {{ axis: 2 }} }}
"""


def feed(T, N, D, H, V=5, seed=0, ignore=False, **_):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, V, (T, N)).astype(float)
    if ignore:
        labels[rng.random((T, N)) < 0.3] = IGNORE
    return dict(x=rng.normal(size=(T, N, D)), cont=cont_from_lengths([T] * (N - 1) + [T // 2], T),
                labels=labels, target=rng.normal(size=(T, N, H)))


def train_step(net, inputs):
    """One forward and backward: the loss, the input's diff (with force_backward) and every
    param's diff."""
    net.forward(**{k: v for k, v in inputs.items() if k in net.inputs})
    net.clear_param_diffs()
    net.backward()
    return (net.loss, host(net.blobs["x"].diff).copy() if net.net_param.force_backward else None,
            {p.name: host(p.blob.diff).copy() for p in net.learnable_params})


def assert_identical(got, want):
    assert got[0] == want[0]
    np.testing.assert_array_equal(got[1], want[1])
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        np.testing.assert_array_equal(got[2][name], want[2][name], err_msg=name)


LOSSES = [dict(loss="softmax"), dict(loss="softmax", ignore=True),
          dict(loss="softmax", ignore=True, normalization="BATCH_SIZE"),
          dict(loss="softmax", normalization="FULL"), dict(loss="euclidean")]


@pytest.mark.parametrize("kind", LOSSES, ids=lambda k: "-".join(map(str, k.values())))
def test_a_whole_output_loss_fits_a_tenth_of_the_full_plan_bit_identical(kind):
    # long enough that one chunk's share is small; no diff of x, which is T steps long
    T, N, D, H = 20 * GRADIENT_CHUNK, 4, 16, 16
    text = whole_output_net(T, N, D, H, V=64, force_backward=False, **kind)
    inputs = feed(T, N, D, H, V=64, **kind)
    full = Net(text, dtype="float64", seed=3)
    want = train_step(full, inputs)
    budget = full.inspect().recompute["planned_bytes"] // 10
    net = Net(text, dtype="float64", seed=3, memory_budget=budget)
    assert [p.name for p in net.learnable_params] == [p.name for p in full.learnable_params]
    for p, q in zip(net.learnable_params, full.learnable_params):  # the same initial weights
        np.testing.assert_array_equal(host(p.blob.data), host(q.blob.data))
    assert_identical(train_step(net, inputs), want)
    assert_identical(train_step(net, inputs), want)  # a second step, as the first
    assert net.workspace.nbytes <= budget  # the high-water mark after a real step
    assert set(net.outputs) == set(full.outputs)


@settings(max_examples=8, deadline=None)
@given(T=st.integers(GRADIENT_CHUNK + 1, 3 * GRADIENT_CHUNK + 5), N=st.integers(1, 3),
       kind=st.sampled_from(LOSSES), dtype=st.sampled_from(["float32", "float64"]),
       chain=st.sampled_from([(), ('layer {{ name: "relu{k}" type: "ReLU" bottom: "{b}" '
                                   'top: "{b}" }}\n'
                                   'layer {{ name: "tanh{k}" type: "TanH" bottom: "{b}" '
                                   'top: "{t}" }}\n',)]),
       where=st.floats(0, 1))
def test_any_budget_gives_the_full_plans_bits(T, N, kind, dtype, chain, where):
    D, H = 3, 4
    text = whole_output_net(T, N, D, H, chain=chain, **kind)
    inputs = feed(T, N, D, H, seed=T, **kind)
    full = Net(text, dtype=dtype, seed=3)
    want = train_step(full, inputs)
    need = full.inspect().recompute["planned_bytes"]
    with pytest.raises(MemoryBudgetError) as error:
        Net(text, dtype=dtype, memory_budget=1)
    # a short net's pieces by chunks may need a little more than the net as written
    budget = int(error.value.smallest + where * max(need - error.value.smallest, 0))
    for options in ({"memory_budget": budget}, {"recompute": "hsm"}):
        net = Net(text, dtype=dtype, seed=3, **options)
        assert any(name.endswith("/1") for name in net.layer_names)  # run by chunks
        assert_identical(train_step(net, inputs), want)
    assert net.workspace.nbytes <= max(budget, net.inspect().recompute["planned_bytes"])


@pytest.mark.parametrize("N", [1, 32])
def test_a_chunk_few_enough_rows_for_the_transposed_product_gives_the_same_bits(N):
    # a last chunk of one step (N rows), or 32 steps of one row: the products a chunk's
    # own InnerProduct takes, which the whole one takes chunk by chunk too
    T, D, H = 2 * GRADIENT_CHUNK + 1, 8, 64
    kind = dict(loss="softmax", ignore=True)
    text, inputs = whole_output_net(T, N, D, H, V=64, **kind), feed(T, N, D, H, V=64, **kind)
    want = train_step(Net(text, seed=3), inputs)
    net = Net(text, seed=3, recompute="hsm")
    assert any(layer.few_rows for layer in net.layers if layer.name.startswith("scores/"))
    assert_identical(train_step(net, inputs), want)


@pytest.mark.parametrize("kind", [LOSSES[1], LOSSES[4]], ids=["softmax", "euclidean"])
def test_gradients_through_the_rewritten_net_match_finite_differences(kind):
    T, N, D, H = GRADIENT_CHUNK + 3, 2, 2, 3
    text, inputs = whole_output_net(T, N, D, H, V=3, **kind), feed(T, N, D, H, V=3, seed=1, **kind)
    net = Net(text, dtype="float64", seed=4, recompute="hsm")
    assert "loss/1" in net.layer_names
    inputs = {k: v for k, v in inputs.items() if k in net.inputs}

    def loss_of():
        return float(net.forward(**inputs)["loss"])

    net.forward(**inputs)
    net.clear_param_diffs()
    net.backward()
    dx = host(net.blobs["x"].diff).copy()
    w = next(p for p in net.learnable_params if p.name in ("W_out", "W_hc"))
    grad = host(w.blob.diff).copy()
    np.testing.assert_allclose(dx, numeric_gradient(loss_of, inputs["x"]), rtol=1e-6,
                               atol=1e-8)
    np.testing.assert_allclose(grad, numeric_gradient(loss_of, w.blob.data), rtol=1e-6,
                               atol=1e-8)


def test_a_kept_output_a_test_net_and_a_net_without_recomputation_are_left_whole():
    T, N, D, H = GRADIENT_CHUNK + 3, 2, 2, 3
    text = whole_output_net(T, N, D, H, loss="softmax")
    assert "loss/1" not in Net(text, recompute="hsm", keep=["scores"]).layer_names
    assert "loss/1" not in Net(text, recompute="hsm", keep=["h"]).layer_names
    assert "loss/1" in Net(text, recompute="hsm").layer_names
    assert "loss/1" not in Net(text).layer_names  # without recomputation: as written
    assert "loss/1" not in Net(text, recompute="none", memory_budget=10**9).layer_names
    assert "loss/1" not in Net(text, phase="test", recompute="hsm").layer_names


def test_labels_after_the_last_step_leave_the_net_as_written():
    # every chunk's piece would run after the last step, as the whole loss does: the pieces
    # would only add their blobs, and a plan without recomputation would need more
    T, N, D, H = GRADIENT_CHUNK + 3, 2, 2, 3
    text = whole_output_net(T, N, D, H, loss="softmax", truth_first=False)
    fewest = Net(text, recompute="hsm")
    assert "loss/1" not in fewest.layer_names
    assert (fewest.inspect().recompute["planned_bytes"]
            <= Net(text).inspect().recompute["planned_bytes"])


def test_the_off_switch_leaves_every_net_as_written(monkeypatch):
    from unroll.engine.memory import separable

    text = whole_output_net(GRADIENT_CHUNK + 3, 2, 2, 3, loss="softmax")
    monkeypatch.setattr(separable, "SEPARATE", False)
    assert "loss/1" not in Net(text, recompute="hsm").layer_names


def test_the_char_lm_fits_in_its_smallest_budget_by_chunks():
    from examples.charlm.model import IGNORE as CHARLM_IGNORE
    from examples.charlm.model import TEMPLATE

    T = 8 * GRADIENT_CHUNK
    net_param = expand(TEMPLATE, steps=T, batch=8, symbols=40, part="train", embed=16,
                       hidden=64, ignore_label=CHARLM_IGNORE)
    full = Net(net_param).inspect().recompute["planned_bytes"]
    with pytest.raises(MemoryBudgetError) as error:
        Net(net_param, memory_budget=1)
    assert error.value.smallest <= 0.3 * full
