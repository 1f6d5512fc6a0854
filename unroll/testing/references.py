"""The battery entry of every built-in layer type and step template: NumPy references.

Each reference is the layer's (or step's) equation written out in NumPy,
independently of the layer's code: ``check_layer(case.spec, case.inputs,
case.reference, **case.options)`` must pass for every case. A layer with
learned blobs gets them after its bottoms (``reference(*bottoms, *blobs)``).
A new built-in layer type or step template needs an entry here; the test
suite enumerates the registry and fails for any without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["LAYER_CASES", "LayerCase", "STEP_REFERENCES", "gru_step", "lstm_attention_feed_step",
           "lstm_attention_step", "lstm_step", "luong_attention", "rnn_step", "sigmoid"]

_rng = np.random.default_rng(20)
FILL = 'weight_filler { type: "uniform" min: -0.8 max: 0.8 } ' \
       'bias_filler { type: "uniform" min: -0.5 max: 0.5 }'


@dataclass(frozen=True)
class LayerCase:
    """One battery run of a layer type: its prototxt, bottoms, reference and options."""

    spec: str
    inputs: list
    reference: object
    options: dict = field(default_factory=dict)


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _u(*shape, low=-1.0, high=1.0):
    return _rng.uniform(low, high, shape)


def _away(a, margin=0.05):
    """``a`` with no entry within ``margin`` of 0 (a kink)."""
    return np.where(np.abs(a) < margin, np.copysign(2 * margin, a), a)


def _distinct(*shape):
    return _rng.permutation(np.linspace(-2, 2, int(np.prod(shape)))).reshape(shape)


def _softmax(x, axis=1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# -- recurrent equations ---------------------------------------------------------------


def lstm_gates(a, c_prev, cont=1.0):
    """Caffe's LSTMUnit: [i f o g] = [sig sig sig tanh](a); c = cont f c' + i g; h = o tanh c."""
    i, f, o, g = np.split(a, 4, axis=-1)
    c = cont * sigmoid(f) * c_prev + sigmoid(i) * np.tanh(g)
    return c, sigmoid(o) * np.tanh(c)


def gru_gates(h_prev, x, hh, cont=1.0):
    """GRUUnit: h' = cont h_prev; r, z = sig(x + hh); n = tanh(x_n + r hh_n); h = n + z(h' - n)."""
    xr, xz, xn = np.split(x, 3, axis=-1)
    hr, hz, hn = np.split(hh, 3, axis=-1)
    r, z = sigmoid(xr + hr), sigmoid(xz + hz)
    n = np.tanh(xn + r * hn)
    return n + z * (cont * h_prev - n)


def rnn_step(x, states, params):
    """The rnn template: h_t = tanh(W_xh x_t + b_h + W_hh h')."""
    p = params
    h = np.tanh(x @ p["W_xh"].T + p["b_h"] + states["h"] @ p["W_hh"].T)
    return {"h": h}, {"h": h}


def lstm_step(x, states, params):
    """The lstm templates: [i f o g] = W_xc x_t + b_c + W_hc h'; c_t = f c' + i g;
    h_t = o tanh(c_t)."""
    p = params
    a = x @ p["W_xc"].T + p["b_c"] + states["h"] @ p["W_hc"].T
    c, h = lstm_gates(a, states["c"])
    return {"h": h}, {"h": h, "c": c}


def gru_step(x, states, params):
    """The gru templates: [xr xz xn] = W_x x_t + b_x, [hr hz hn] = W_h h' + b_h, then GRUUnit."""
    p = params
    h = gru_gates(states["h"], x @ p["W_x"].T + p["b_x"], states["h"] @ p["W_h"].T + p["b_h"])
    return {"h": h}, {"h": h}


def luong_attention(h, memory, mask, params):
    """attention.j2: alpha = softmax_s(score(h, m_s) + mask_s), c = sum_s alpha_s m_s,
    a = tanh(W_c [c ; h]); h (N, H), memory (S, N, M), mask (S, N). The score is the one
    whose params the net holds: "general" W_a, "concat" W_q, W_m and v_a, "dot" none."""
    p = params
    score = "general" if "W_a" in p else "concat" if "v_a" in p else "dot"
    if score == "dot":
        scores = np.einsum("snm,nm->sn", memory, h)
    elif score == "general":
        scores = np.einsum("snm,nm->sn", memory, h @ p["W_a"].T)
    else:  # concat: v_a . tanh(W_q h + W_m m_s)
        joined = np.tanh((h @ p["W_q"].T)[None] + memory @ p["W_m"].T)
        scores = (joined @ p["v_a"].T)[..., 0]
    alpha = _softmax(scores + mask, axis=0)
    context = np.einsum("sn,snm->nm", alpha, memory)
    return np.tanh(np.concatenate([context, h], axis=1) @ p["W_c"].T)


def lstm_attention_step(x, states, params, static):
    """The lstm_attention template: the lstm step, then a_t = luong_attention(h_t)."""
    (out, new) = lstm_step(x, states, params)
    a = luong_attention(new["h"], static["memory"], static["memory_mask"], params)
    return {"a": a}, new


def lstm_attention_feed_step(x, states, params, static):
    """The lstm_attention_feed template: input feeding, [i f o g] gains W_fc a_{t-1}."""
    p = params
    a = x @ p["W_xc"].T + p["b_c"] + states["h"] @ p["W_hc"].T + states["a"] @ p["W_fc"].T
    c, h = lstm_gates(a, states["c"])
    a = luong_attention(h, static["memory"], static["memory_mask"], params)
    return {"a": a}, {"h": h, "c": c, "a": a}


#: the reference step of every built-in step template, by template name
STEP_REFERENCES = {"rnn": rnn_step, "lstm": lstm_step, "lstm_primitive": lstm_step,
                   "gru": gru_step, "gru_primitive": gru_step,
                   "lstm_attention": lstm_attention_step,
                   "lstm_attention_feed": lstm_attention_feed_step}


def _caffe_lstm(x, cont, W_xc, b_c, W_hc):
    T, N = cont.shape
    H = W_hc.shape[1]
    h, c, out = np.zeros((N, H)), np.zeros((N, H)), []
    for t in range(T):
        k = cont[t][:, None]
        c, h = lstm_gates(x[t].reshape(N, -1) @ W_xc.T + b_c + (k * h) @ W_hc.T, c, k)
        out.append(h)
    return np.stack(out)


def _caffe_rnn(x, cont, W_xh, b_h, W_hh, W_ho, b_o):
    T, N = cont.shape
    h, out = np.zeros((N, W_hh.shape[1])), []
    for t in range(T):
        h = np.tanh(x[t].reshape(N, -1) @ W_xh.T + b_h + (cont[t][:, None] * h) @ W_hh.T)
        out.append(np.tanh(h @ W_ho.T + b_o))
    return np.stack(out)


def _leading_end(*bottoms):
    """Each column's state at the last step of the sequence that leads the run: k states
    (1, N, H), then the conts (1, N) of steps 1..k-1."""
    k = (len(bottoms) + 1) // 2
    states, conts = bottoms[:k], bottoms[k:]
    out = np.array(states[0])
    for n in range(out.shape[1]):
        length = 1
        while length < k and conts[length - 1][0, n] == 1:
            length += 1
        out[:, n] = states[length - 1][:, n]
    return out


def _scatter(x, at, like):
    D = x.shape[-1]
    y = np.zeros((like.size, D))
    for k, i in enumerate(at.reshape(-1).astype(int)):
        if i >= 0:
            y[i] = x.reshape(-1, D)[k]
    return y.reshape(*like.shape, D)


def _segment_sum(x, seg, like):
    out = np.zeros((like.shape[0],) + x.shape[1:])
    for row, s in zip(x, seg.astype(int)):
        if s >= 0:
            out[s] += row
    return out


def _accuracy(scores, labels):
    return np.mean(scores.argmax(axis=1) == labels.astype(int))


def _softmax_loss(scores, labels):
    p = _softmax(scores)
    return -np.mean(np.log(p[np.arange(len(labels)), labels.astype(int)]))


def _softmax_loss_chunk(scores, labels, whole):
    """Each position's loss of a chunk, divided by the whole's count of labels."""
    p = _softmax(scores)
    return -np.log(p[np.arange(len(labels)), labels.astype(int)]) / len(whole)


def _batch_norm(x, *stats, eps=1e-5):
    mean = x.mean(axis=(0, 2), keepdims=True)
    var = ((x - mean) ** 2).mean(axis=(0, 2), keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def _dropout(ratio, seed=0):
    def reference(x):
        keep = np.random.default_rng(seed).random(x.shape) >= ratio
        return x * keep / (1 - ratio)
    return reference


def _reduction(op, axis, coeff=1.0):
    """Caffe's Reduction written out: op over every axis from ``axis`` on, times coeff."""
    def reference(x):
        axes = tuple(range(axis % x.ndim, x.ndim))
        value = {"SUM": x, "ASUM": np.abs(x), "SUMSQ": x ** 2, "MEAN": x}[op].sum(axis=axes)
        if op == "MEAN":
            value = value / np.prod([x.shape[a] for a in axes])
        return coeff * value
    return reference


def _scores(memory, query):
    """Each memory step's dot product with its column's query, (S, N)."""
    S, N, _ = memory.shape
    return np.array([[memory[s, n] @ query[n] for n in range(N)] for s in range(S)])


def _contexts(weights, memory):
    """Each column's memory steps weighted and summed, (N, H)."""
    return np.stack([weights[:, n] @ memory[:, n] for n in range(memory.shape[1])])


_LABELS = np.array([0.0, 2.0, 1.0, 2.0])
_CONT = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
_LEADING = [np.array([[1.0, 0.0, 1.0]]), np.array([[1.0, 0.0, 0.0]])]
_TRAILING = [np.array([[1.0, 0.0, 0.0]]), np.array([[1.0, 0.0, 1.0]])]
_STATES = [_u(1, 3, 2) for _ in range(3)]

LAYER_CASES: dict[str, list[LayerCase]] = {
    "AbsVal": [LayerCase('type: "AbsVal"', [_away(_u(3, 4))], np.abs)],
    "Accuracy": [LayerCase('type: "Accuracy"', [_distinct(4, 3), _LABELS], _accuracy)],
    "BatchReindex": [LayerCase('type: "BatchReindex"', [_u(3, 2), np.array([2.0, 0.0, 2.0, 1.0])],
                               lambda x, idx: x[idx.astype(int)])],
    "BatchMatMul": [LayerCase('type: "BatchMatMul"', [_u(4, 3, 2), _u(3, 2)], _scores),
                    LayerCase('type: "BatchMatMul"', [_u(4, 3), _u(4, 3, 2)], _contexts)],
    "BatchNorm": [LayerCase('type: "BatchNorm"', [_u(4, 3, 2)], _batch_norm)],
    "Bias": [
        LayerCase('type: "Bias" bias_param { axis: 1 }', [_u(2, 3, 2), _u(3)],
                  lambda x, b: x + b[None, :, None]),
        LayerCase('type: "Bias" bias_param { axis: 1 filler { type: "uniform" min: -1 max: 1 } }',
                  [_u(2, 3, 2)], lambda x, b: x + b[None, :, None]),
    ],
    "Concat": [LayerCase('type: "Concat" concat_param { axis: 1 }', [_u(2, 3), _u(2, 2)],
                         lambda a, b: np.concatenate([a, b], axis=1))],
    "Dropout": [
        LayerCase('type: "Dropout" dropout_param { dropout_ratio: 0.4 }', [_u(3, 4)],
                  _dropout(0.4)),
        LayerCase('type: "Dropout" dropout_param { dropout_ratio: 0.4 }', [_u(3, 4)],
                  lambda x: x, {"phase": "test"}),
    ],
    "Eltwise": [
        LayerCase('type: "Eltwise" eltwise_param { operation: SUM coeff: 0.5 coeff: -2 }',
                  [_u(2, 3), _u(2, 3)], lambda a, b: 0.5 * a - 2 * b),
        LayerCase('type: "Eltwise" eltwise_param { operation: PROD }',
                  [_u(2, 3), _u(2, 3), _u(2, 3)], lambda a, b, c: a * b * c),
        LayerCase('type: "Eltwise" eltwise_param { operation: MAX }',
                  list(_distinct(2, 2, 3)), np.maximum),
    ],
    "Embed": [LayerCase(f'type: "Embed" embed_param {{ num_output: 3 input_dim: 5 {FILL} }}',
                        [np.array([[0.0, 4.0, 2.0], [2.0, 1.0, 3.0]])],
                        lambda i, W, b: W[i.astype(int)] + b)],
    "EuclideanLoss": [LayerCase('type: "EuclideanLoss"', [_u(3, 2), _u(3, 2)],
                                lambda a, b: ((a - b) ** 2).sum() / (2 * len(a)))],
    "EuclideanLossChunk": [LayerCase('type: "EuclideanLossChunk" input_param { shape { dim: 6 } }',
                                     [_u(2, 2), _u(2, 2)],
                                     lambda a, b: np.array([((a - b) ** 2).sum() / 12]))],
    "Flatten": [LayerCase('type: "Flatten"', [_u(2, 3, 2)], lambda x: x.reshape(2, -1))],
    "GRUUnit": [LayerCase('type: "GRUUnit"', [_u(1, 2, 3), _u(1, 2, 9), _u(1, 2, 9),
                                              np.array([[1.0, 0.0]])],
                          lambda h, x, hh, cont: gru_gates(h, x, hh, cont[..., None]))],
    "InnerProduct": [
        LayerCase(f'type: "InnerProduct" inner_product_param {{ num_output: 2 {FILL} }}',
                  [_u(3, 4)], lambda x, W, b: x @ W.T + b),
        LayerCase(f'type: "InnerProduct" inner_product_param {{ num_output: 5 axis: 2 '
                  f'bias_term: false {FILL} }}', [_u(2, 3, 4)], lambda x, W: x @ W.T),
    ],
    "Input": [LayerCase('type: "Input" top: "a" input_param { shape { dim: 2 dim: 3 } }', [],
                        lambda: np.zeros((2, 3)))],
    "LSTM": [LayerCase(f'type: "LSTM" recurrent_param {{ num_output: 2 {FILL} }}',
                       [_u(3, 2, 2), _CONT], _caffe_lstm)],
    "LSTMUnit": [LayerCase('type: "LSTMUnit"', [_u(1, 2, 3), _u(1, 2, 12), np.array([[1.0, 0.0]])],
                           lambda c, a, cont: lstm_gates(a, c, cont[..., None]))],
    "LeadingSequenceEnd": [LayerCase('type: "LeadingSequenceEnd"', _STATES + _LEADING,
                                     _leading_end, {"check": [0, 1, 2]})],
    "Power": [LayerCase('type: "Power" power_param { power: 2 scale: 0.5 shift: 1 }',
                        [_u(3, 2)], lambda x: (1 + 0.5 * x) ** 2)],
    "RNN": [LayerCase(f'type: "RNN" recurrent_param {{ num_output: 2 {FILL} }}',
                      [_u(3, 2, 2), _CONT], _caffe_rnn)],
    "Reduction": [
        LayerCase('type: "Reduction" reduction_param { axis: 1 coeff: -1.5 }', [_u(2, 3, 2)],
                  _reduction("SUM", 1, -1.5)),
        LayerCase('type: "Reduction" reduction_param { operation: ASUM axis: -1 }',
                  [_away(_u(3, 4))], _reduction("ASUM", -1)),
        LayerCase('type: "Reduction" reduction_param { operation: SUMSQ axis: 2 coeff: 0.5 }',
                  [_u(2, 2, 3)], _reduction("SUMSQ", 2, 0.5)),
        LayerCase('type: "Reduction" reduction_param { operation: MEAN }', [_u(3, 2)],
                  _reduction("MEAN", 0)),
    ],
    "ReLU": [LayerCase('type: "ReLU" relu_param { negative_slope: 0.1 }', [_away(_u(3, 4))],
                       lambda x: np.where(x > 0, x, 0.1 * x))],
    "Reshape": [LayerCase('type: "Reshape" reshape_param { shape { dim: 0 dim: -1 } }',
                          [_u(2, 3, 2)], lambda x: x.reshape(2, 6))],
    "Scale": [
        LayerCase('type: "Scale" scale_param { axis: 1 }', [_u(2, 3, 2), _u(3)],
                  lambda x, s: x * s[None, :, None]),
        LayerCase('type: "Scale" scale_param { axis: 1 bias_term: true filler { type: '
                  '"uniform" min: -1 max: 1 } bias_filler { type: "uniform" min: -1 max: 1 } }',
                  [_u(2, 3, 2)], lambda x, s, b: x * s[None, :, None] + b[None, :, None]),
    ],
    "Scatter": [LayerCase('type: "Scatter"', [_u(3, 2), np.array([2.0, -1.0, 0.0]),
                                              np.zeros((2, 2))], _scatter)],
    "SegmentSum": [LayerCase('type: "SegmentSum"', [_u(4, 2), np.array([1.0, -1.0, 1.0, 0.0]),
                                                    np.zeros((3, 1))], _segment_sum)],
    "Sigmoid": [LayerCase('type: "Sigmoid"', [_u(3, 4, low=-4, high=4)], sigmoid)],
    "Silence": [LayerCase('type: "Silence"', [_u(2, 3), _u(4)], lambda a, b: ())],
    "Slice": [LayerCase('type: "Slice" top: "a" top: "b" slice_param { axis: 1 slice_point: 1 }',
                        [_u(2, 4)], lambda x: (x[:, :1], x[:, 1:]))],
    "Softmax": [LayerCase('type: "Softmax"', [_u(3, 4, low=-3, high=3)], _softmax)],
    "SoftmaxWithLoss": [LayerCase('type: "SoftmaxWithLoss"', [_u(4, 3, low=-2, high=2), _LABELS],
                                  _softmax_loss)],
    "SoftmaxWithLossChunk": [LayerCase('type: "SoftmaxWithLossChunk"',
                                       [_u(2, 3, low=-2, high=2), _LABELS[:2], _LABELS],
                                       _softmax_loss_chunk)],
    "Split": [LayerCase('type: "Split" top: "a" top: "b"', [_u(2, 3)], lambda x: (x, x))],
    "TanH": [LayerCase('type: "TanH"', [_u(3, 4, low=-3, high=3)], np.tanh)],
    "Tile": [LayerCase('type: "Tile" tile_param { tiles: 3 }', [_u(2, 2, 2)],
                       lambda x: np.concatenate([x] * 3, axis=1)),
             LayerCase('type: "Tile" tile_param { axis: 0 tiles: 2 }', [_u(3, 2)],
                       lambda x: np.concatenate([x, x]))],
    "Threshold": [LayerCase('type: "Threshold"', [_away(_u(3, 4))],
                            lambda x: np.where(x > 0, 1.0, 0.0))],
    "TrailingSequenceEnd": [LayerCase('type: "TrailingSequenceEnd"', _STATES[2:] + _TRAILING,
                                      lambda state, *conts: state, {"check": [0]})],
}
