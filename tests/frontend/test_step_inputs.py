"""Step inputs: several per-step inputs, static inputs every step reads, recurrent() over a
list or dict of bottoms, and an attention decoder built from them (docs/design.md, 3.
Unrolling: "Step inputs")."""

import numpy as np
import pytest

from tests.frontend.test_caffe_export import SHARED_FIELDS, caffe_fields, fields_set
from unroll import expand, to_prototxt
from unroll.core.errors import TemplateError
from unroll.core.proto import NetParameter, parse_text
from unroll.engine.net import Net
from unroll.frontend.caffe_export import caffe_layer_types, export_for_caffe
from unroll.testing import numeric_gradient, static_inputs

#: h_t = tanh(W_x x_t + W_y y_t + W_hh (cont_t h_{t-1}) + b), b a static (N, H) blob
TWO_INPUTS = """{% set interface = {"kind": "step", "inputs": ["x", "y"], "states": {"h": "hidden"},
    "outputs": ["h"], "static": {"b": ["N", "hidden"]}, "defaults": {"hidden": none}} %}
{% macro step(s) %}
layer { name: "{{ s.layer('h_cont') }}" type: "Scale" bottom: "{{ s.prev.h }}"
        bottom: "{{ s.cont }}" top: "{{ s.blob('h_cont') }}" scale_param { axis: 0 } }
{% for name, bottom in [("x", s.input.x), ("y", s.input.y), ("hh", s.blob('h_cont'))] %}
layer { name: "{{ s.layer(name ~ '_proj') }}" type: "InnerProduct" bottom: "{{ bottom }}"
        top: "{{ s.blob(name ~ '_proj') }}" param { name: "{{ s.param('W_' ~ name) }}" }
        inner_product_param { num_output: {{ hidden }} bias_term: false axis: 2
                              weight_filler { type: "uniform" min: -1 max: 1 } } }
{% endfor %}
layer { name: "{{ s.layer('b') }}" type: "Reshape" bottom: "{{ s.static.b }}"
        top: "{{ s.blob('b') }}" reshape_param { shape { dim: 1 dim: -1 dim: {{ hidden }} } } }
layer { name: "{{ s.layer('sum') }}" type: "Eltwise" bottom: "{{ s.blob('x_proj') }}"
        bottom: "{{ s.blob('y_proj') }}" bottom: "{{ s.blob('hh_proj') }}"
        bottom: "{{ s.blob('b') }}" top: "{{ s.blob('sum') }}" }
layer { name: "{{ s.layer('tanh') }}" type: "TanH" bottom: "{{ s.blob('sum') }}"
        top: "{{ s.state.h }}" }
{% endmacro %}
"""

T, N, DX, DY, H = 4, 3, 2, 3, 2


@pytest.fixture
def two_inputs(tmp_path):
    path = tmp_path / "two_inputs.prototxt.j2"
    path.write_text(TWO_INPUTS)
    return str(path)


def reference(p, x, y, b, cont):
    h, out = np.zeros((N, H)), []
    for t in range(T):
        h = np.tanh(x[t] @ p["W_x"].T + y[t] @ p["W_y"].T + (cont[t][:, None] * h) @ p["W_hh"].T
                    + b)
        out.append(h)
    return np.stack(out)


def test_a_two_input_step_reads_y_and_its_static_gradient_sums_the_steps(two_inputs):
    net_param = expand(two_inputs, steps=T, batch=N, input_dim={"x": DX, "y": DY}, hidden=H)
    net_param.force_backward = True
    net = Net(net_param, dtype="float64")
    assert {"x", "y", "b", "cont"} <= set(net.inputs)
    rng = np.random.default_rng(0)
    p = {q.name: q.blob.data.copy() for q in net.learnable_params}
    feeds = dict(x=rng.uniform(-1, 1, (T, N, DX)), y=rng.uniform(-1, 1, (T, N, DY)),
                 b=rng.uniform(-1, 1, (N, H)), cont=np.array([[0, 1, 1, 0]] * N, float).T)
    h = net.forward(**feeds)["h"].copy()
    np.testing.assert_allclose(h, reference(p, **feeds), rtol=1e-12, atol=1e-13)
    R = rng.uniform(-1, 1, h.shape)
    net.blobs["h"].diff[...] = R
    net.backward()

    def loss():
        return float((reference(p, **feeds) * R).sum())

    for name in ("b", "y"):  # b: one blob that every step reads, its diff their sum
        np.testing.assert_allclose(net.blobs[f"{name}@0"].diff,
                                   numeric_gradient(loss, feeds[name]), rtol=1e-6, atol=1e-8,
                                   err_msg=name)


def net_template(tmp_path, bottom: str) -> str:
    path = tmp_path / "net.prototxt.j2"
    path.write_text(f"""{{% set interface = {{"kind": "net", "defaults": {{}}}} %}}
layer {{ name: "in" type: "Input" top: "xa" top: "yb" top: "bias" top: "cont"
        input_param {{ shape {{ dim: {T} dim: {N} dim: {DX} }}
                      shape {{ dim: {T} dim: {N} dim: {DY} }}
                      shape {{ dim: {N} dim: {H} }} shape {{ dim: {T} dim: {N} }} }} }}
{{{{ recurrent("{(tmp_path / 'two_inputs.prototxt.j2').as_posix()}", {bottom}, "h", hidden={H}) }}}}
""")
    return str(path)


def test_recurrent_takes_a_list_or_a_dict_of_bottoms(tmp_path, two_inputs):
    nets = [expand(net_template(tmp_path, bottom), steps=T, batch=N)
            for bottom in ('["xa", "yb", "bias"]', '{"y": "yb", "b": "bias", "x": "xa"}')]
    assert nets[0] == nets[1]
    reads = {b for lp in nets[0].layer for b in lp.bottom}
    assert {"xa", "yb", "bias"} <= reads and "x" not in reads


@pytest.mark.parametrize("bottom, problem", [
    ('"xa"', "gives no blob for 'y'"),
    ('{"x": "xa", "b": "bias"}', "gives no blob for 'y'"),
    ('{"x": "xa", "y": "yb", "b": "bias", "z": "yb"}', "names 'z', which it does not read"),
    ('["xa", "yb"]', r"give one blob for each, in that order, found 2"),
    ('3', "the bottom must be a blob name, a list or a dict of them"),
])
def test_a_missing_or_unknown_bottom_is_refused_naming_it(tmp_path, two_inputs, bottom, problem):
    with pytest.raises(TemplateError, match=problem) as e:
        expand(net_template(tmp_path, bottom), steps=T, batch=N)
    assert str(e.value).startswith("recurrent('two_inputs.prototxt.j2'): ")
    assert "two_inputs.prototxt.j2 reads inputs ['x', 'y'] and static inputs ['b']" in str(e.value)


def test_expanding_alone_needs_the_size_of_every_input(two_inputs):
    with pytest.raises(TemplateError, match="input_dim= must give the size of each input "
                                            r"\['x', 'y'\], found no size for 'y'"):
        expand(two_inputs, steps=T, batch=N, input_dim={"x": DX}, hidden=H)


def test_a_static_input_is_declared_with_its_dims(tmp_path):
    path = tmp_path / "bad.prototxt.j2"
    path.write_text(TWO_INPUTS.replace('["N", "hidden"]', '["N", "size"]'))
    with pytest.raises(TemplateError, match="interface 'static' must map each static input to "
                                            "its dims"):
        expand(str(path), steps=T, input_dim=1, hidden=H)


# -- an attention decoder --------------------------------------------------------------------

SEQ2SEQ = """{% set interface = {"kind": "net", "defaults": {"source": 5, "vocab": 6,
                                                              "hidden": 3, "score": "dot"}} %}
layer { name: "in" type: "Input" top: "src" top: "src_cont" top: "src_mask" top: "tgt_in"
        top: "tgt_cont" top: "tgt_out"
        input_param { shape { dim: {{ source }} dim: {{ batch }} }
                      shape { dim: {{ source }} dim: {{ batch }} }
                      shape { dim: {{ source }} dim: {{ batch }} }
                      shape { dim: {{ T }} dim: {{ batch }} }
                      shape { dim: {{ T }} dim: {{ batch }} }
                      shape { dim: {{ T }} dim: {{ batch }} } } }
{% for side in ["src", "tgt_in"] %}
layer { name: "{{ side }}_embed" type: "Embed" bottom: "{{ side }}" top: "{{ side }}_vec"
        param { name: "E" } embed_param { input_dim: {{ vocab }} num_output: 4 bias_term: false
        weight_filler { type: "uniform" min: -1 max: 1 } } }
{% endfor %}
{{ recurrent("lstm", "src_vec", "enc", cont="src_cont", steps=source, scope="enc_",
             expose_hidden=True, hidden=hidden) }}
{{ recurrent("lstm_attention", {"x": "tgt_in_vec", "memory": "enc", "memory_mask": "src_mask"},
             "dec", cont="tgt_cont", scope="dec_", initial_state={"h": "enc_h_T", "c": "enc_c_T"},
             hidden=hidden, score=score) }}
layer { name: "scores" type: "InnerProduct" bottom: "dec" top: "scores"
        inner_product_param { num_output: {{ vocab }} axis: 2
        weight_filler { type: "uniform" min: -1 max: 1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "scores" bottom: "tgt_out" top: "loss"
        softmax_param { axis: 2 } }
"""


@pytest.mark.parametrize("score", ["dot", "general", "concat"])
def test_the_exported_attention_decoder_holds_only_caffe_and_computes_the_same(tmp_path, score):
    path = tmp_path / "seq2seq.prototxt.j2"
    path.write_text(SEQ2SEQ)
    original = expand(str(path), steps=3, batch=2, score=score)
    exported = parse_text(to_prototxt(original, caffe=True), NetParameter())
    assert {lp.type for lp in exported.layer} <= caffe_layer_types()
    lowered, _ = export_for_caffe(original)
    rng = np.random.default_rng(1)
    S, lengths = 5, [5, 3]
    mask = np.where(np.arange(S)[:, None] < np.array(lengths)[None], 0.0, -1e9)
    cont = (np.arange(S)[:, None] != 0).astype(float).repeat(2, axis=1)
    feeds = dict(src=rng.integers(0, 6, (S, 2)), src_cont=cont, src_mask=mask,
                 tgt_in=rng.integers(0, 6, (3, 2)), tgt_cont=np.ones((3, 2)),
                 tgt_out=rng.integers(0, 6, (3, 2)))
    results = []
    for net_param in (original, lowered):
        net = Net(net_param, dtype="float64")
        for q in net.learnable_params:
            q.blob.data[...] = np.random.default_rng(hash(q.name) % 2**32).uniform(
                -0.8, 0.8, q.blob.shape)
        loss = float(net.forward(**feeds)["loss"])
        net.clear_param_diffs()
        net.backward()
        results.append((loss, {q.name: q.blob.diff.copy() for q in net.learnable_params}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_b == pytest.approx(loss_a, rel=1e-12)
    for name, diff in grads_a.items():
        np.testing.assert_allclose(grads_b[name], diff, rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("score", ["dot", "general", "concat"])
def test_the_exported_attention_decoder_sets_only_caffe_fields(tmp_path, score):
    if not SHARED_FIELDS.is_file():
        pytest.skip(f"{SHARED_FIELDS} is absent (it lives in shared/ beside the repository)")
    path = tmp_path / "seq2seq.prototxt.j2"
    path.write_text(SEQ2SEQ)
    text = to_prototxt(expand(str(path), steps=2, batch=2, score=score), caffe=True)
    assert fields_set(parse_text(text, NetParameter())) - caffe_fields() == set()


@pytest.mark.parametrize("score", ["dot", "general", "concat"])
def test_a_masked_memory_step_gets_no_attention(score):
    """What the memory holds where the mask is -1e9 changes nothing: not h, not a diff."""
    net_param = expand("lstm_attention", steps=3, batch=2, input_dim=2, hidden=3, score=score,
                       source_steps=5)
    net_param.force_backward = True
    net = Net(net_param, dtype="float64")
    rng = np.random.default_rng(2)
    feeds = dict(x=rng.uniform(-1, 1, (3, 2, 2)), cont=np.ones((3, 2)),
                 memory_mask=np.where(np.arange(5)[:, None] < np.array([[3, 5]]), 0.0, -1e9))
    memory = rng.uniform(-1, 1, (5, 2, 3))
    results = []
    for padding in (memory[3:, 0], rng.uniform(-1, 1, (2, 3))):
        moved = memory.copy()
        moved[3:, 0] = padding
        h = net.forward(memory=moved, **feeds)["h"].copy()
        net.clear_param_diffs()
        net.blobs["h"].diff[...] = 1.0
        net.backward()
        results.append((h, net.blobs["memory@0"].diff.copy()))
    (h0, d0), (h1, d1) = results
    np.testing.assert_array_equal(h0, h1)
    assert (d0[3:, 0] == 0).all() and np.abs(d0[:3, 0]).sum() > 0
    np.testing.assert_array_equal(d0, d1)


def test_static_inputs_follow_the_interface(two_inputs):
    assert {k: v.shape for k, v in static_inputs(two_inputs, 3, hidden=2).items()} == {
        "b": (3, 2)}
