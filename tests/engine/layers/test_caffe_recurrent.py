"""Caffe's LSTM and RNN layers against NumPy references of Caffe's equations."""

import logging
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll import Net, NetError, PrototxtError, to_prototxt
from unroll.core.proto import NetParameter
from unroll.engine.backend import GPU_AVAILABLE, to_numpy
from unroll.testing import check_layer_gradient, run_layer
from unroll.tools.caffe_prototxt import unrolled_net
from unroll.tools.cli import main

FILLER = 'weight_filler { type: "uniform" min: -0.6 max: 0.6 } ' \
         'bias_filler { type: "uniform" min: -0.3 max: 0.3 }'


def spec(kind, H, expose=False, extra=""):
    tops = ' top: "h"' + (' top: "h_T"' + (' top: "c_T"' if kind == "LSTM" else "")
                          if expose else "")
    return (f'name: "{kind.lower()}1" type: "{kind}"{tops} recurrent_param {{ num_output: {H} '
            f'{FILLER} expose_hidden: {str(expose).lower()} {extra} }}')


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


# -- NumPy references of Caffe's equations (lstm_layer.cpp, rnn_layer.cpp, LSTMUnit) ----


def input_grads(grads, da, x_t, xs, W_s):
    """Add the gradients of W_x x_t + b + W_s x_static into grads[0:3]; return d x_static."""
    grads[0] += da.T @ x_t
    grads[1] += da.sum(0)
    if xs is None:
        return 0.0
    grads[2] += da.T @ xs.reshape(len(xs), -1)
    return da @ W_s


def lstm_reference(x, cont, W, h0, c0, xs=None):
    """Forward and backward of Caffe's LSTM; W = [W_xc, b_c, (W_xc_static), W_hc]."""
    W_xc, b_c, *rest = W
    W_s, W_hc = rest if xs is not None else (None, rest[0])
    T, N = cont.shape
    H = W_hc.shape[1]
    x2 = x.reshape(T, N, -1)
    static = xs.reshape(N, -1) @ W_s.T if xs is not None else 0.0
    h, c, cache, hs = h0[0], c0[0], [], []
    for t in range(T):
        k = cont[t][:, None]
        hc = k * h
        a = x2[t] @ W_xc.T + b_c + hc @ W_hc.T + static
        i, f, o, g = (sigmoid(a[:, :H]), sigmoid(a[:, H:2 * H]), sigmoid(a[:, 2 * H:3 * H]),
                      np.tanh(a[:, 3 * H:]))
        c_prev, c = c, k * f * c + i * g
        cache.append((k, hc, c_prev, i, f, o, g, np.tanh(c)))
        h = o * np.tanh(c)
        hs.append(h)

    def backward(dtop, dhT, dcT):
        grads = [np.zeros_like(w) for w in W]
        dx, dxs = np.zeros_like(x2), 0.0
        dh_next, dc_next = dhT[0].copy(), dcT[0].copy()
        for t in reversed(range(T)):
            k, hc, c_prev, i, f, o, g, tc = cache[t]
            dh = dtop[t] + dh_next
            dc = dc_next + dh * o * (1 - tc ** 2)
            da = np.concatenate([dc * g * i * (1 - i), dc * k * c_prev * f * (1 - f),
                                 dh * tc * o * (1 - o), dc * i * (1 - g ** 2)], axis=1)
            dxs = dxs + input_grads(grads, da, x2[t], xs, W_s)
            grads[-1] += da.T @ hc
            dx[t] = da @ W_xc
            dh_next, dc_next = (da @ W_hc) * k, dc * k * f
        dxs = dxs.reshape(xs.shape) if xs is not None else None
        return grads, dx.reshape(x.shape), dxs, [dh_next[None], dc_next[None]]

    return np.stack(hs), [h[None], c[None]], backward


def rnn_reference(x, cont, W, h0, xs=None):
    """Forward and backward of Caffe's RNN; W = [W_xh, b_h, (W_xh_static), W_hh, W_ho, b_o]."""
    W_xh, b_h, *rest = W
    W_s, W_hh, W_ho, b_o = rest if xs is not None else (None, *rest)
    T, N = cont.shape
    x2 = x.reshape(T, N, -1)
    static = xs.reshape(N, -1) @ W_s.T if xs is not None else 0.0
    h, cache, os_ = h0[0], [], []
    for t in range(T):
        k = cont[t][:, None]
        hc = k * h
        h = np.tanh(x2[t] @ W_xh.T + b_h + hc @ W_hh.T + static)
        o = np.tanh(h @ W_ho.T + b_o)
        cache.append((k, hc, h, o))
        os_.append(o)

    def backward(dtop, dhT):
        grads = [np.zeros_like(w) for w in W]
        dx, dxs = np.zeros_like(x2), 0.0
        dh_next = dhT[0].copy()
        for t in reversed(range(T)):
            k, hc, h, o = cache[t]
            dao = dtop[t] * (1 - o ** 2)
            grads[-2] += dao.T @ h
            grads[-1] += dao.sum(0)
            da = (dao @ W_ho + dh_next) * (1 - h ** 2)
            dxs = dxs + input_grads(grads, da, x2[t], xs, W_s)
            grads[-3] += da.T @ hc
            dx[t] = da @ W_xh
            dh_next = (da @ W_hh) * k
        dxs = dxs.reshape(xs.shape) if xs is not None else None
        return grads, dx.reshape(x.shape), dxs, [dh_next[None]]

    return np.stack(os_), [h[None]], backward


def reference(kind, x, cont, W, states, xs=None):
    if kind == "LSTM":
        return lstm_reference(x, cont, W, *states, xs=xs)
    out, finals, backward = rnn_reference(x, cont, W, *states, xs=xs)
    return out, finals, lambda dtop, dhT, *_: backward(dtop, dhT)


def restart_cont(T, N):
    """cont with sequence starts at step 0 and in the middle of the batch."""
    cont = np.ones((T, N))
    cont[0] = 0
    cont[T // 2, 0] = 0
    cont[T - 1, N - 1] = 0
    return cont


# -- forward and backward against the references -----------------------------------------


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("expose", [False, True])
def test_forward_backward_match_caffe_equations(kind, static, expose):
    rng = np.random.default_rng(1)
    T, N, H = 5, 3, 4
    n_states = 2 if kind == "LSTM" else 1
    x = rng.normal(size=(T, N, 2, 3))  # trailing axes flatten, as Caffe's InnerProduct
    cont = restart_cont(T, N)
    if expose:
        cont[0, 1] = 1  # continue from the given initial state
    xs = rng.normal(size=(N, 3)) if static else None
    states = [rng.normal(size=(1, N, H)) if expose else np.zeros((1, N, H))
              for _ in range(n_states)]
    bottoms = [x, cont] + ([xs] if static else []) + (states if expose else [])
    layer, bottom_blobs, tops = run_layer(spec(kind, H, expose), bottoms,
                                          n_tops=1 + n_states * expose)
    W = [b.data.copy() for b in layer.blobs]
    out, finals, backward = reference(kind, x, cont, W, states, xs)
    np.testing.assert_allclose(tops[0].data, out, rtol=1e-10, atol=1e-12)
    for top, final in zip(tops[1:], finals):
        np.testing.assert_allclose(top.data, final, rtol=1e-10, atol=1e-12)

    dtops = [rng.normal(size=t.shape) for t in tops]
    for top, d in zip(tops, dtops):
        top.diff[...] = d
    for b in layer.blobs:
        b.diff[...] = 0
    propagate = [True, False] + [True] * (len(bottoms) - 2)
    layer.backward(tops, propagate, bottom_blobs)
    zero_final = [np.zeros((1, N, H))] * n_states
    grads, dx, dxs, dstates = backward(dtops[0], *(dtops[1:] if expose else zero_final))
    for blob, g in zip(layer.blobs, grads):
        np.testing.assert_allclose(blob.diff, g, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(bottom_blobs[0].diff, dx, rtol=1e-9, atol=1e-12)
    if static:
        np.testing.assert_allclose(bottom_blobs[2].diff, dxs, rtol=1e-9, atol=1e-12)
    if expose:
        for blob, d in zip(bottom_blobs[2 + static:], dstates):
            np.testing.assert_allclose(blob.diff, d, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_state_carries_over_between_batches_until_cont_is_zero(kind):
    """Caffe: without expose_hidden, h_0 of a batch is h_T of the previous one."""
    rng = np.random.default_rng(2)
    T, N, H = 3, 2, 3
    x = rng.normal(size=(2 * T, N, 4))
    cont = np.ones((2 * T, N))
    cont[0] = 0
    layer, bottoms, tops = run_layer(spec(kind, H), [x[:T], cont[:T]])
    W = [b.data.copy() for b in layer.blobs]
    zeros = [np.zeros((1, N, H))] * (2 if kind == "LSTM" else 1)
    whole, _, _ = reference(kind, x, cont, W, zeros)
    np.testing.assert_allclose(tops[0].data, whole[:T], rtol=1e-10)
    bottoms[0].data[...] = x[T:]
    bottoms[1].data[...] = cont[T:]  # all 1: every stream continues
    layer.forward(bottoms, tops)
    np.testing.assert_allclose(tops[0].data, whole[T:], rtol=1e-10)
    layer.reset()
    layer.forward(bottoms, tops)
    alone, _, _ = reference(kind, x[T:], cont[T:], W, zeros)
    np.testing.assert_allclose(tops[0].data, alone, rtol=1e-10)


# -- finite differences for the whole layer --------------------------------------------


@given(kind=st.sampled_from(["LSTM", "RNN"]), T=st.integers(1, 3), N=st.integers(1, 2),
       D=st.integers(1, 3), H=st.integers(1, 3), static=st.booleans(), expose=st.booleans(),
       seed=st.integers(0, 2**16))
def test_whole_layer_gradient_matches_finite_differences(kind, T, N, D, H, static, expose, seed):
    rng = np.random.default_rng(seed)
    cont = (rng.uniform(size=(T, N)) < 0.7).astype(float)
    if not expose:
        cont[0] = 0  # the carried state changes with every forward; cut it off
    n_states = 2 if kind == "LSTM" else 1
    bottoms = [rng.normal(size=(T, N, D)), cont]
    if static:
        bottoms.append(rng.normal(size=(N, 2)))
    if expose:
        bottoms += [rng.normal(size=(1, N, H)) for _ in range(n_states)]
    check_layer_gradient(spec(kind, H, expose), bottoms, seed=seed)


# -- blobs, caffemodels, changing T --------------------------------------------------------

NET = """
layer { name: "in" type: "Input" top: "x" top: "cont" top: "xs"
        input_param { shape { dim: 4 dim: 2 dim: 5 } shape { dim: 4 dim: 2 }
                      shape { dim: 2 dim: 3 } } }
layer { name: "lstm1" type: "LSTM" bottom: "x" bottom: "cont" bottom: "xs" top: "h"
        recurrent_param { num_output: 6 FILLER } }
layer { name: "rnn1" type: "RNN" bottom: "h" bottom: "cont" bottom: "xs" top: "o"
        recurrent_param { num_output: 4 FILLER } }
""".replace("FILLER", FILLER)


def net_inputs(T, rng):
    return dict(x=rng.normal(size=(T, 2, 5)), cont=restart_cont(T, 2), xs=rng.normal(size=(2, 3)))


def test_blob_shapes_and_order_are_caffes():
    """recurrent_layer.cpp: the unrolled net's params in order of first use, one per name."""
    net = Net(NET, dtype="float64")
    H, G, D, S = 6, 24, 5, 3
    assert [b.shape for b in net.params["lstm1"]] == [(G, D), (G,), (G, S), (G, H)]
    assert net.layers[1].blob_names == ["W_xc", "b_c", "W_xc_static", "W_hc"]
    H2 = 4
    assert [b.shape for b in net.params["rnn1"]] == [(H2, H), (H2,), (H2, S), (H2, H2),
                                                     (H2, H2), (H2,)]
    assert net.layers[2].blob_names == ["W_xh", "b_h", "W_xh_static", "W_hh", "W_ho", "b_o"]


def test_hidden_nets_use_the_layers_own_blobs():
    net = Net(NET, dtype="float64")
    layer = net.layers[1]
    hidden = layer.nets[4]
    assert [p.blob for p in hidden.learnable_params] == layer.blobs


def test_hidden_nets_are_chunked_as_the_weight_gradients_are(monkeypatch):
    # docs/design.md, 3: the engine passes its chunk in; the frontend's default equals it
    from unroll.engine import hidden_nets
    from unroll.engine.memory import GRADIENT_CHUNK
    from unroll.frontend.unroller import SEQUENCE_CHUNK

    assert SEQUENCE_CHUNK == GRADIENT_CHUNK
    asked, unroller = [], hidden_nets._unroller
    monkeypatch.setattr(hidden_nets, "_unroller",
                        lambda template, **v: asked.append(v["chunk"]) or unroller(template, **v))
    T, rng = GRADIENT_CHUNK + 3, np.random.default_rng(0)
    plain = NET.replace(' bottom: "xs"', "")
    Net(plain, dtype="float64").forward(**{k: v for k, v in net_inputs(T, rng).items()
                                           if k != "xs"})
    assert asked and set(asked) == {GRADIENT_CHUNK}
    # a static input joins x's projection, one layer over the whole sequence
    asked.clear()
    assert Net(NET, dtype="float64").forward(**net_inputs(T, rng))["o"].shape == (T, 2, 4)
    assert asked and set(asked) == {None}
    with pytest.raises(TypeError, match="chunk"):
        hidden_nets.expand("lstm", steps=2)


def test_caffemodel_round_trip():
    rng = np.random.default_rng(3)
    net = Net(NET, dtype="float64")
    inputs = net_inputs(4, rng)
    before = net.forward(**inputs)["o"].copy()
    data = net.to_proto().SerializeToString()
    saved = NetParameter()
    saved.ParseFromString(data)
    shapes = {lp.name: [tuple(b.shape.dim) for b in lp.blobs] for lp in saved.layer}
    assert shapes == {"lstm1": [(24, 5), (24,), (24, 3), (24, 6)],
                      "rnn1": [(4, 6), (4,), (4, 3), (4, 4), (4, 4), (4,)]}
    other = Net(NET, dtype="float64", seed=9)
    assert not np.allclose(other.forward(**inputs)["o"], before)
    other.copy_from(saved)
    np.testing.assert_allclose(other.forward(**inputs)["o"], before, rtol=1e-12)


def test_T_changes_between_batches():
    rng = np.random.default_rng(4)
    net = Net(NET, dtype="float64", keep=["h"])
    layer = net.layers[1]
    W = [b.data for b in layer.blobs]
    for T in (4, 7, 1, 4):
        inputs = net_inputs(T, rng)
        out = net.forward(**inputs)
        assert out["o"].shape == (T, 2, 4)
        expected, _, _ = lstm_reference(inputs["x"], inputs["cont"], W, np.zeros((1, 2, 6)),
                                        np.zeros((1, 2, 6)), xs=inputs["xs"])
        np.testing.assert_allclose(net.blobs["h"].data, expected, rtol=1e-10, atol=1e-12)
    assert sorted(layer.nets) == [1, 4, 7]


def test_batch_size_changes_between_batches():
    rng = np.random.default_rng(8)
    net = Net(NET, dtype="float64")
    wide = net_inputs(4, rng)
    wide.update(x=rng.normal(size=(4, 3, 5)), cont=restart_cont(4, 3), xs=rng.normal(size=(3, 3)))
    narrow = {k: v[:, :2] if k != "xs" else v[:2] for k, v in wide.items()}
    first = net.forward(**narrow)["o"].copy()
    assert net.forward(**wide)["o"].shape == (4, 3, 4)
    np.testing.assert_allclose(net.blobs["o"].data[:, :2], first, rtol=1e-12)


def test_gradients_of_every_T_accumulate_into_the_layers_blobs():
    rng = np.random.default_rng(5)
    text = NET + 'layer { name: "loss" type: "EuclideanLoss" bottom: "o" bottom: "y" top: "l" }'
    text = text.replace('top: "xs"', 'top: "xs" top: "y"').replace(
        "shape { dim: 2 dim: 3 } }", "shape { dim: 2 dim: 3 } shape { dim: 4 dim: 2 dim: 4 } }")
    net = Net(text, dtype="float64")
    diffs = []
    for T in (4, 2):
        net.clear_param_diffs()
        net.forward(**net_inputs(T, rng), y=rng.normal(size=(T, 2, 4)))
        net.backward()
        diffs.append([b.diff.copy() for b in net.params["lstm1"]])
    net.clear_param_diffs()
    rng = np.random.default_rng(5)
    for T in (4, 2):
        net.forward(**net_inputs(T, rng), y=rng.normal(size=(T, 2, 4)))
        net.backward()
    for blob, a, b in zip(net.params["lstm1"], *diffs):
        np.testing.assert_allclose(blob.diff, a + b, rtol=1e-10, atol=1e-14)


# -- errors ---------------------------------------------------------------------------------


def layer_net(layer_text, x_dims=(3, 2, 4), cont_dims=(3, 2)):
    dims = lambda d: " ".join(f"dim: {k}" for k in d)  # noqa: E731
    return Net(f"""
        layer {{ name: "in" type: "Input" top: "x" top: "cont"
                input_param {{ shape {{ {dims(x_dims)} }} shape {{ {dims(cont_dims)} }} }} }}
        layer {{ name: "lstm1" type: "LSTM" bottom: "x" bottom: "cont" top: "h" {layer_text} }}
    """)


@pytest.mark.parametrize("layer_text, x_dims, cont_dims, message", [
    ("recurrent_param { num_output: 0 }", (3, 2, 4), (3, 2), "num_output must be > 0"),
    ('recurrent_param { num_output: 2 weight_filler { type: "bilinear" } }', (3, 2, 4), (3, 2),
     "recurrent_param.weight_filler: filler type 'bilinear' is not supported"),
    ("recurrent_param { num_output: 2 }", (3, 2, 4), (3, 3), "bottom 1 (cont) 'cont'"),
    ("recurrent_param { num_output: 2 }", (3, 2), (3, 2), "at least 3 axes"),
    ("recurrent_param { num_output: 2 expose_hidden: true }", (3, 2, 4), (3, 2),
     "takes 4..5 bottoms, found 2"),
])
def test_bad_layers_are_errors_naming_the_layer(layer_text, x_dims, cont_dims, message):
    with pytest.raises(NetError, match="layer 'lstm1' \\(LSTM\\)") as e:
        layer_net(layer_text, x_dims, cont_dims)
    assert message in str(e.value)


def test_unknown_recurrent_param_field_is_an_error_naming_it():
    with pytest.raises(PrototxtError, match="peephole"):
        layer_net("recurrent_param { num_output: 2 peephole: true }")


def test_debug_info_logs_the_hidden_net(caplog):
    net = layer_net("recurrent_param { num_output: 2 debug_info: true }")
    with caplog.at_level(logging.INFO, logger="unroll.engine.layers.caffe_recurrent"):
        net.forward()
        layer = net.layers[1]
        layer.backward([net.blobs["h"]], [True, False], [net.blobs["x"], net.blobs["cont"]])
    assert re.search(r"\[Forward\] Layer \S+, top blob h data: [0-9.e-]+\n", caplog.text)
    assert re.search(r"\[Backward\] Layer \S+, bottom blob x diff: ", caplog.text)
    assert "[Forward] param blob 2 (W_hc) data:" in caplog.text
    assert "[Backward] param blob 0 (W_xc) diff:" in caplog.text


def test_without_debug_info_nothing_is_logged(caplog):
    net = layer_net("recurrent_param { num_output: 2 }")
    with caplog.at_level(logging.INFO, logger="unroll.engine.layers.caffe_recurrent"):
        net.forward()
    assert caplog.text == ""


# -- the unrolled equivalent -----------------------------------------------------------------


def test_unrolled_net_computes_what_the_layers_compute():
    rng = np.random.default_rng(6)
    net = Net(NET, dtype="float64")
    inputs = net_inputs(4, rng)
    expected = net.forward(**inputs)["o"]
    flat = Net(unrolled_net(NET), dtype="float64")
    assert not {lp.type for lp in flat.net_param.layer} & {"LSTM", "RNN"}
    by_name = {p.name: p.blob for p in flat.learnable_params}
    for name in ("lstm1", "rnn1"):
        layer = net.layers[[lay.name for lay in net.layers].index(name)]
        for blob_name, blob in zip(layer.blob_names, layer.blobs):
            by_name[f"{name}_{blob_name}"].data[...] = blob.data
    np.testing.assert_allclose(flat.forward(**inputs)["o"], expected, rtol=1e-10)


def test_unrolled_net_steps_sets_T_of_time_major_inputs():
    flat = unrolled_net(NET, steps=7)
    assert sum(lp.type == "LSTMUnit" for lp in flat.layer) == 7
    shapes = [list(s.dim) for s in flat.layer[0].input_param.shape]
    assert shapes == [[7, 2, 5], [7, 2], [2, 3]]  # x_static keeps its (N, S)
    assert Net(flat).forward(**net_inputs(7, np.random.default_rng(0)))["o"].shape == (7, 2, 4)


def test_unrolled_net_keeps_exposed_states_and_named_params():
    text = """
    layer { name: "in" type: "Input" top: "x" top: "cont" top: "h0" top: "c0"
            input_param { shape { dim: 2 dim: 1 dim: 3 } shape { dim: 2 dim: 1 }
                          shape { dim: 1 dim: 1 dim: 2 } shape { dim: 1 dim: 1 dim: 2 } } }
    layer { name: "lstm1" type: "LSTM" bottom: "x" bottom: "cont" bottom: "h0" bottom: "c0"
            top: "h" top: "hT" top: "cT" param { name: "shared_W" lr_mult: 2 }
            recurrent_param { num_output: 2 expose_hidden: true } }"""
    flat = Net(unrolled_net(text))
    assert flat.inputs == ["x", "cont", "h0", "c0"]
    assert sorted(flat.outputs) == ["cT", "h", "hT"]
    names = {p.name: p.lr_mult for p in flat.learnable_params}
    assert names == {"shared_W": 2.0, "lstm1_b_c": 1.0, "lstm1_W_hc": 1.0}


def test_unrolled_net_leaves_the_other_phase_alone():
    text = NET.replace('name: "rnn1"', 'name: "rnn1" include { phase: TEST }')
    flat = unrolled_net(text, phase="train")
    assert [lp.name for lp in flat.layer if lp.type in ("LSTM", "RNN")] == ["rnn1"]
    assert any(lp.type == "LSTMUnit" for lp in flat.layer)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_AVAILABLE, reason="no GPU: CuPy tests run only where one is present")
def test_gpu_matches_cpu():
    rng = np.random.default_rng(7)
    inputs = net_inputs(4, rng)
    outputs = []
    for device in ("cpu", "gpu"):
        net = Net(NET, dtype="float64", device=device)
        outputs.append(to_numpy(net.forward(**inputs)["o"]))
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-10)


def test_cli_expands_a_prototxt(tmp_path, capsys):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    assert main(["expand", str(path), "--steps", "3"]) == 0
    text = capsys.readouterr().out
    assert text == to_prototxt(unrolled_net(NET, steps=3))
    assert 'type: "LSTMUnit"' in text and 'type: "LSTM"' not in text
