"""Packing: a sequence put back to back with others in a row gets exactly what it gets alone.

For every built-in step template, both directions and their concatenation,
one or two stacked layers, and a zero or learned initial state: the packed
net's outputs over each sequence's span equal that sequence's outputs in a
net of its own length, and its gradients do too (w.r.t. its inputs; w.r.t. a
param, the packed gradient is the sum of the sequences' own gradients), in
float64. Then the tagger net template with its character model.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import unroll
from unroll.testing import builtin_templates
from unroll.train.bucketing import time_major, time_major_packed, unpack_time_major

#: the primitive cells (the slowest to build) are in the slow tier; the fused ones stay quick
KINDS = [pytest.param(k, marks=pytest.mark.slow) if k.endswith("_primitive") else k
         for k in builtin_templates("step")]
DIRECTIONS = ["forward", "reverse", "bidirectional"]
TOL = dict(rtol=1e-9, atol=1e-12)


@st.composite
def packings(draw, max_sequences=4, max_length=4):
    """Sequence lengths, their rows (each a list of sequence indices) and a row length."""
    lengths = draw(st.lists(st.integers(1, max_length), min_size=2, max_size=max_sequences))
    n_rows = draw(st.integers(1, 2))
    row_of = draw(st.lists(st.integers(0, n_rows - 1), min_size=len(lengths),
                           max_size=len(lengths)))
    order = draw(st.permutations(range(len(lengths))))
    rows = [[i for i in order if row_of[i] == r] for r in range(n_rows)]
    rows = [row for row in rows if row]
    T = max(sum(lengths[i] for i in row) for row in rows) + draw(st.integers(0, 2))
    return dict(lengths=lengths, rows=rows, T=T, seed=draw(st.integers(0, 2**32 - 1)))


class Nets:
    """One float64 net per (T, N) over one parameter store, for one step-template setting."""

    def __init__(self, kind, D, H, **kw):
        self.store = unroll.ParamStore()
        self.make = lambda T, N: unroll.expand(kind, steps=T, batch=N, input_dim=D, hidden=H, **kw)
        self.nets = {}

    def __call__(self, T, N):
        if (T, N) not in self.nets:
            net_param = self.make(T, N)
            net_param.force_backward = True  # no loss layer: the test sets the diff of h
            self.nets[T, N] = unroll.Net(net_param, dtype="float64", param_store=self.store)
        return self.nets[T, N]


def forward_backward(net, x, cont, R):
    """h, and the gradients of sum(h * R) w.r.t. x and every learnable param."""
    h = net.forward(x=x, cont=cont)["h"].copy()
    net.clear_param_diffs()
    net.blobs["h"].diff[...] = R
    net.backward()
    return h, net.blobs["x"].diff.copy(), {p.name: p.blob.diff.copy() for p in net.learnable_params}


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("kind", KINDS)
@given(case=packings(), layers=st.integers(1, 2), initial_state=st.sampled_from(["zeros",
                                                                                    "learned"]),
       D=st.integers(1, 3), H=st.integers(1, 3))
def test_packed_sequence_gets_its_result_alone(kind, direction, case, layers, initial_state, D, H):
    rng = np.random.default_rng(case["seed"])
    nets = Nets(kind, D, H, direction=direction, layers=layers, initial_state=initial_state)
    rows, T, lengths = case["rows"], case["T"], case["lengths"]
    packed = nets(T, len(rows))
    for p in packed.learnable_params:  # biases and learned initial states too, all nonzero
        p.blob.data[...] = rng.uniform(-0.8, 0.8, p.blob.shape)
    H_out = packed.blobs["h"].shape[2]
    xs = [rng.uniform(-1, 1, (n, D)) for n in lengths]
    Rs = [rng.uniform(-1, 1, (n, H_out)) for n in lengths]
    x, cont, spans = time_major_packed(rows, xs, T)
    R, _, _ = time_major_packed(rows, Rs, T)  # padding: 0, it adds nothing to the loss

    h, dx, dparams = forward_backward(packed, x, cont, R)

    flat = [i for row in rows for i in row]
    alone_dparams = {name: np.zeros_like(d) for name, d in dparams.items()}
    for i, h_i, dx_i in zip(flat, unpack_time_major(h, spans), unpack_time_major(dx, spans)):
        x_i, cont_i = time_major([xs[i]], lengths[i])
        R_i, _ = time_major([Rs[i]], lengths[i])
        h_alone, dx_alone, dp_alone = forward_backward(nets(lengths[i], 1), x_i, cont_i, R_i)
        np.testing.assert_allclose(h_i, h_alone[:, 0], **TOL, err_msg=f"h of sequence {i}")
        np.testing.assert_allclose(dx_i, dx_alone[:, 0], **TOL, err_msg=f"dx of sequence {i}")
        for name, d in dp_alone.items():
            alone_dparams[name] += d
    for name, d in dparams.items():
        np.testing.assert_allclose(d, alone_dparams[name], **TOL, err_msg=f"gradient of {name}")
    padding = cont.copy()
    for row, offset, n in spans:
        padding[offset : offset + n, row] = 1
    assert not dx[padding == 0].any(), "padding steps send gradient to no input"


# -- the tagger net template with its character model ------------------------------------

VOCAB, TAGS, CHAR_VOCAB, C = 30, 5, 12, 4


def sentence(rng, n):
    """Per-token arrays of one random sentence: words, suffix, spelled characters, tags."""
    spelled = [rng.integers(1, CHAR_VOCAB, rng.integers(1, C + 1)) for _ in range(n)]
    fw, bw, ccont = np.zeros((n, C), np.int64), np.zeros((n, C), np.int64), np.zeros((n, C))
    for t, ids in enumerate(spelled):  # right-aligned in C, as the template expects
        fw[t, C - len(ids):], bw[t, C - len(ids):] = ids, ids[::-1]
        ccont[t, C - len(ids) + 1:] = 1
    return dict(words=rng.integers(0, VOCAB, n), suffix=rng.integers(0, 9, n),
                labels=rng.integers(0, TAGS, n), chars_fw=fw, chars_bw=bw, chars_cont=ccont)


def tagger_inputs(rows, sentences, T):
    """The tagger's inputs for rows of sentences back to back (a sentence alone: one row)."""
    out = {}
    for name in ("words", "suffix", "labels", "chars_fw", "chars_bw", "chars_cont"):
        pad = -1 if name == "labels" else 0
        out[name], out["cont"], spans = time_major_packed(
            rows, [s[name] for s in sentences], T, pad_value=pad)
    for name in ("chars_fw", "chars_bw", "chars_cont"):  # (T, N, C) -> (C, T * N)
        out[name] = out[name].reshape(-1, C).T
    out["chars_at"] = np.full((C, T * len(rows)), -1)  # a cell's word ends at step C - 1
    out["chars_at"][-1] = np.arange(T * len(rows))
    return out, spans


@given(case=packings(max_sequences=5, max_length=5))
def test_tagger_with_characters_scores_packed_as_alone(case):
    rng = np.random.default_rng(case["seed"])
    store = unroll.ParamStore()

    def net(T, N):
        net_param = unroll.expand(
            "tagger", steps=T, batch=N, vocab=VOCAB, tags=TAGS, embed=3, hidden=2, layers=2,
            features={"suffix": [9, 2]},
            chars={"vocab": CHAR_VOCAB, "embed": 2, "hidden": 2, "length": C})
        return unroll.Net(net_param, dtype="float64", param_store=store, keep=["scores"])

    rows, T = case["rows"], case["T"]
    packed = net(T, len(rows))
    for p in packed.learnable_params:
        p.blob.data[...] = rng.uniform(-0.8, 0.8, p.blob.shape)
    sentences = [sentence(rng, n) for n in case["lengths"]]
    inputs, spans = tagger_inputs(rows, sentences, T)
    packed.forward(**inputs)
    scores = unpack_time_major(packed.blobs["scores"].data.copy(), spans)
    for i, got in zip([i for row in rows for i in row], scores):
        alone = net(case["lengths"][i], 1)
        alone.forward(**tagger_inputs([[0]], [sentences[i]], case["lengths"][i])[0])
        np.testing.assert_allclose(got, alone.blobs["scores"].data[:, 0], **TOL,
                                   err_msg=f"scores of sentence {i}")
