"""The built-in templates against plain NumPy recurrences, forward and backward.

Each reference below is the template's equation written out step by step in
NumPy, independent of unroll; its gradients come from central differences of
that NumPy code. The unrolled net must match both, for any T, N, D, H and any
mix of sequence lengths (padding has cont = 0, so the reference, following the
same cont rule, is compared at every position).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.net_helpers import assert_nets_agree
from unroll.engine.net import Net
from unroll.frontend.unroller import expand
from unroll.testing import builtin_templates, numeric_gradient, static_inputs
from unroll.train.bucketing import cont_from_lengths

KINDS = builtin_templates("step")  # each needs its entry in PARAMS, STATES and STEPS
PARAMS = {  # learnable param names of a single unscoped layer, in creation order
    "rnn": ["W_xh", "b_h", "W_hh"],
    "lstm": ["W_xc", "b_c", "W_hc"],
    "lstm_primitive": ["W_xc", "b_c", "W_hc"],
    "gru": ["W_x", "b_x", "W_h", "b_h"],
    "gru_primitive": ["W_x", "b_x", "W_h", "b_h"],
    "lstm_attention": ["W_xc", "b_c", "W_hc", "W_c"],
    "lstm_attention_feed": ["W_xc", "b_c", "W_hc", "W_fc", "W_c"],
}
STATES = {"rnn": ["h"], "lstm": ["h", "c"], "lstm_primitive": ["h", "c"], "gru": ["h"],
          "gru_primitive": ["h"], "lstm_attention": ["h", "c"],
          "lstm_attention_feed": ["h", "c", "a"]}


# -- the NumPy references --------------------------------------------------------


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def linear(x, W, b=None):
    """InnerProduct: W is (num_output, K), y = x W^T + b."""
    y = x @ W.T
    return y if b is None else y + b


def rnn_step(p, x, s):
    """h_t = tanh(W_xh x_t + b_h + W_hh h')."""
    return {"h": np.tanh(linear(x, p["W_xh"], p["b_h"]) + linear(s["h"], p["W_hh"]))}


def lstm_step(p, x, s):
    """[i f o g] = W_xc x_t + b_c + W_hc h';  c_t = f c' + i g;  h_t = o tanh(c_t)."""
    a = linear(x, p["W_xc"], p["b_c"]) + linear(s["h"], p["W_hc"])
    i, f, o, g = np.split(a, 4, axis=-1)
    i, f, o, g = sigmoid(i), sigmoid(f), sigmoid(o), np.tanh(g)
    c = f * s["c"] + i * g
    return {"h": o * np.tanh(c), "c": c}


def gru_step(p, x, s):
    """r, z = sigmoid(W_x x + b_x + W_h h' + b_h); n = tanh(xn + r hn); h_t = (1 - z) n + z h'."""
    xr, xz, xn = np.split(linear(x, p["W_x"], p["b_x"]), 3, axis=-1)
    hr, hz, hn = np.split(linear(s["h"], p["W_h"], p["b_h"]), 3, axis=-1)
    r, z = sigmoid(xr + hr), sigmoid(xz + hz)
    n = np.tanh(xn + r * hn)
    return {"h": (1 - z) * n + z * s["h"]}


def attend(p, h, static):
    """Luong dot attention: a = tanh(W_c [sum_s softmax_s(m_s . h + mask_s) m_s ; h])."""
    m = static["memory"]
    scores = (m * h[None]).sum(axis=2) + static["memory_mask"]
    w = np.exp(scores - scores.max(axis=0))
    w /= w.sum(axis=0)
    context = (w[:, :, None] * m).sum(axis=0)
    return np.tanh(linear(np.concatenate([context, h], axis=1), p["W_c"]))


def lstm_attention_step(p, x, s, static):
    """The lstm step, then the attentional vector of its h (the output, called h here)."""
    new = lstm_step(p, x, {"h": s["h_lstm"], "c": s["c"]})
    return {"c": new["c"], "h_lstm": new["h"], "h": attend(p, new["h"], static)}


def lstm_attention_feed_step(p, x, s, static):
    """Input feeding: W_fc a_{t-1} joins the gates; a_t is a state and the output."""
    a = linear(x, p["W_xc"], p["b_c"]) + linear(s["h_lstm"], p["W_hc"]) + linear(s["h"],
                                                                                 p["W_fc"])
    i, f, o, g = np.split(a, 4, axis=-1)
    c = sigmoid(f) * s["c"] + sigmoid(i) * np.tanh(g)
    h = sigmoid(o) * np.tanh(c)
    return {"c": c, "h_lstm": h, "h": attend(p, h, static)}


STEPS = {"rnn": rnn_step, "lstm": lstm_step, "lstm_primitive": lstm_step, "gru": gru_step,
         "gru_primitive": gru_step, "lstm_attention": lstm_attention_step,
         "lstm_attention_feed": lstm_attention_feed_step}
#: the states a step reads, under this file's names: the attention steps output their
#: attentional vector as h and keep the LSTM's own as h_lstm
READS = {"lstm_attention": ["h_lstm", "c"], "lstm_attention_feed": ["h_lstm", "c", "h"]}


def reference(kind, p, x, cont, reverse=False, static=None):
    """h (T, N, H) of the recurrence; every state entering a step is multiplied by its cont.

    Forward: step t reads cont[t]. Reverse (t = T-1..0): step t reads cont[t+1], so it
    restarts at each sequence's last token; step T-1 starts from the zero state.
    """
    T, N, _ = x.shape
    H = p[{"rnn": "W_hh", "gru": "W_h", "gru_primitive": "W_h"}.get(kind, "W_hc")].shape[1]
    state = {name: np.zeros((N, H)) for name in READS.get(kind, STATES[kind])}
    h = np.zeros((T, N, H))
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        if reverse:
            keep = cont[t + 1] if t + 1 < T else np.zeros(N)
        else:
            keep = cont[t]
        gated = {k: v * keep[:, None] for k, v in state.items()}
        state = (STEPS[kind](p, x[t], gated) if static is None
                 else STEPS[kind](p, x[t], gated, static))
        h[t] = state["h"]
        state = {k: state[k] for k in gated}
    return h



# -- helpers ------------------------------------------------------------------------



def build(kind, T, N, D, H, **kw):
    net_param = expand(kind, steps=T, batch=N, input_dim=D, hidden=H, **kw)
    net_param.force_backward = True  # no loss layer: we set the diff of h ourselves
    return Net(net_param, dtype="float64")


def set_params(net, rng, scale=0.8):
    """Random values for every learnable param (biases too); returns {name: copy}."""
    values = {}
    for p in net.learnable_params:
        p.blob.data[...] = rng.uniform(-scale, scale, p.blob.shape)
        values[p.name] = p.blob.data.copy()
    return values


def forward_backward(net, x, cont, R, static=None):
    """h and the gradients of sum(h * R) w.r.t. x, the static inputs and every learnable
    param."""
    static = static or {}
    h = net.forward(x=x, cont=cont, **static)["h"].copy()
    net.clear_param_diffs()
    net.blobs["h"].diff[...] = R
    net.backward()
    grads = {p.name: p.blob.diff.copy() for p in net.learnable_params}
    for name in ("x", *static):
        grads[name] = net.blobs[name].diff.copy()
    return h, grads


@st.composite
def cases(draw, max_T=5):
    T = draw(st.integers(1, max_T))
    N = draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(1, T), min_size=N, max_size=N))
    return dict(T=T, N=N, D=draw(st.integers(1, 4)), H=draw(st.integers(1, 4)),
                lengths=lengths, seed=draw(st.integers(0, 2**32 - 1)))


# -- the unrolled nets against the references ------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@given(case=cases(), direction=st.sampled_from(["forward", "reverse"]))
def test_unrolled_net_equals_numpy_recurrence(kind, case, direction):
    T, N, D, H = case["T"], case["N"], case["D"], case["H"]
    rng = np.random.default_rng(case["seed"])
    net = build(kind, T, N, D, H, direction=direction)
    assert [p.name for p in net.learnable_params] == PARAMS[kind]
    for state in STATES[kind]:
        assert net.blobs[f"{state}_0"].shape == (1, N, H)
        assert not net.blobs[f"{state}_0"].data.any(), "initial states start at zero"
    p = set_params(net, rng)
    x = rng.uniform(-1, 1, (T, N, D))
    cont = cont_from_lengths(case["lengths"], T)
    R = rng.uniform(-1, 1, (T, N, H))
    reverse = direction == "reverse"
    static = static_inputs(kind, N, case["seed"] % 1000, hidden=H) or None

    h, grads = forward_backward(net, x, cont, R, static)

    np.testing.assert_allclose(h, reference(kind, p, x, cont, reverse, static), rtol=1e-10,
                               atol=1e-12)

    def loss():
        return float((reference(kind, p, x, cont, reverse, static) * R).sum())

    # a static input's gradient is the sum of every step's
    for name, value in [("x", x), *(static or {}).items(), *p.items()]:
        np.testing.assert_allclose(grads[name], numeric_gradient(loss, value), rtol=1e-5, atol=1e-7,
                                   err_msg=f"{kind} {direction}: gradient w.r.t. {name}")


@given(case=cases(max_T=4), direction=st.sampled_from(["forward", "bidirectional"]),
       layers=st.integers(1, 2))
def test_lstm_and_lstm_primitive_agree(case, direction, layers):
    T, N, D, H = case["T"], case["N"], case["D"], case["H"]
    fused = build("lstm", T, N, D, H, direction=direction, layers=layers)
    primitive = build("lstm_primitive", T, N, D, H, direction=direction, layers=layers)
    assert_nets_agree(primitive, fused, np.random.default_rng(case["seed"]),
                      cont_from_lengths(case["lengths"], T))


# -- the tagger net template --------------------------------------------------------------


def tagger_net(T=5, N=3, **kw):
    hyper = dict(vocab=20, tags=4, embed=5, hidden=3, features={"suffix": [50, 8]})
    return Net(expand("tagger", steps=T, batch=N, **{**hyper, **kw}), dtype="float64")


def tagger_batch(rng, lengths, T=5, vocab=20, tags=4):
    N = len(lengths)
    real = np.arange(T)[:, None] < np.asarray(lengths)[None, :]
    return dict(
        words=rng.integers(0, vocab, (T, N)),
        suffix=rng.integers(0, 50, (T, N)),
        cont=cont_from_lengths(lengths, T),
        labels=np.where(real, rng.integers(0, tags, (T, N)), -1),
    )


def test_tagger_expands_and_trains_forward_backward():
    net = tagger_net()
    assert set(net.inputs) >= {"words", "cont", "labels", "suffix"}
    assert set(net.outputs) == {"loss", "accuracy"}
    shapes = {p.name: p.blob.shape for p in net.learnable_params}
    assert shapes["E_word"] == (20, 5)
    assert shapes["E_suffix"] == (50, 8)
    assert shapes["fw_W_xc"] == shapes["bw_W_xc"] == (12, 13)  # 4 * hidden, embed + 8
    assert shapes["W_out"] == (4, 6)  # tags, 2 * hidden (bidirectional)
    rng = np.random.default_rng(0)
    out = net.forward(**tagger_batch(rng, [5, 3, 1]))
    assert np.isfinite(out["loss"]) and out["loss"] > 0
    assert 0 <= out["accuracy"] <= 1
    net.clear_param_diffs()
    net.backward()
    for p in net.learnable_params:
        assert np.isfinite(p.blob.diff).all(), p.name
        assert np.abs(p.blob.diff).sum() > 0, f"{p.name} gets no gradient"


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_tagger_ignores_padding(cell):
    """Whatever the padded positions hold, the loss and every gradient are the same."""
    net = tagger_net(cell=cell, layers=2)
    rng = np.random.default_rng(1)
    lengths = [5, 2, 3]
    batch = tagger_batch(rng, lengths)
    results = []
    for _ in range(2):  # two different fillings of the padding
        pad = np.arange(5)[:, None] >= np.asarray(lengths)[None, :]
        words = np.where(pad, rng.integers(0, 20, (5, 3)), batch["words"])
        suffix = np.where(pad, rng.integers(0, 50, (5, 3)), batch["suffix"])
        net.forward(**{**batch, "words": words, "suffix": suffix})
        net.clear_param_diffs()
        net.backward()
        results.append((net.loss, {p.name: p.blob.diff.copy() for p in net.learnable_params}))
    (loss0, grads0), (loss1, grads1) = results
    assert loss0 == pytest.approx(loss1, rel=1e-12)
    for name in grads0:
        np.testing.assert_allclose(grads0[name], grads1[name], rtol=1e-10, atol=1e-14,
                                   err_msg=name)
