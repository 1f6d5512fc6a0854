"""The unroller: sharing across steps, directions, stacking, carried state, text, errors.

How each built-in template matches its NumPy recurrence is in test_templates.py;
here the nets are compared with each other and with the contract of docs/design.md,
3. Unrolling.
"""

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll.core.errors import NetError, TemplateError
from unroll.core.proto import LayerParameter, NetParameter, parse_text
from unroll.engine.net import Net
from unroll.frontend.unroller import builtin_template_dir, expand, load_template, to_prototxt
from unroll.testing import builtin_templates, check_net_gradient
from unroll.train.bucketed_model import BucketedModel
from unroll.train.bucketing import cont_from_lengths, time_major
from unroll.train.carry import carry_hidden

KINDS = builtin_templates("step")  # each needs its entry in PARAMS
PARAMS = {"rnn": ["W_xh", "b_h", "W_hh"], "lstm": ["W_xc", "b_c", "W_hc"],
          "lstm_primitive": ["W_xc", "b_c", "W_hc"], "gru": ["W_x", "b_x", "W_h", "b_h"],
          "gru_primitive": ["W_x", "b_x", "W_h", "b_h"],
          "lstm_attention": ["W_xc", "b_c", "W_hc", "W_c"],
          "lstm_attention_feed": ["W_xc", "b_c", "W_hc", "W_fc", "W_c"]}
BUILTINS = builtin_templates()



def build(kind, T, N, D, H, **kw):
    net_param = expand(kind, steps=T, batch=N, input_dim=D, hidden=H, **kw)
    net_param.force_backward = True
    return Net(net_param, dtype="float64")


def randomize(net, rng, scale=0.8):
    for p in net.learnable_params:
        p.blob.data[...] = rng.uniform(-scale, scale, p.blob.shape)


def copy_params(src, dst, rename=lambda name: name):
    """Copy ``src``'s learnable params into ``dst``'s param ``rename(name)`` (None: skip)."""
    by_name = {p.name: p for p in dst.learnable_params}
    for p in src.learnable_params:
        target = rename(p.name)
        if target is not None:
            by_name[target].blob.data[...] = p.blob.data


def h_and_x_grad(net, x, cont, R):
    """h, and the gradient of sum(h * R) w.r.t. x."""
    h = net.forward(x=x, cont=cont)["h"].copy()
    net.clear_param_diffs()
    net.blobs["h"].diff[...] = R
    net.backward()
    return h, net.blobs["x"].diff.copy()


def with_loss(net_param, shape):
    """``net_param`` with a target input ``y`` of ``shape``, a EuclideanLoss on h, and
    force_backward (so input gradients are computed)."""
    net_param.force_backward = True
    target = net_param.layer.add(name="target", type="Input", top=["y"])
    target.input_param.shape.add().dim.extend(shape)
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "y"], top=["loss"])
    return net_param


def strip(prefix):
    return lambda name: name[len(prefix):] if name.startswith(prefix) else None


# -- a whole unrolled net passes the gradient checker ------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_bidirectional_stacked_net_with_loss_passes_gradient_check(kind):
    T, N, D, H = 3, 2, 2, 2
    net_param = expand(kind, steps=T, batch=N, input_dim=D, hidden=H,
                       direction="bidirectional", layers=2)
    target = LayerParameter(name="target_input", type="Input", top=["target"])
    target.input_param.shape.add().dim.extend([T, N, 2 * H])
    net_param.layer.add().CopyFrom(target)
    net_param.layer.add().CopyFrom(
        LayerParameter(name="loss", type="EuclideanLoss", bottom=["h", "target"], top=["loss"]))
    net_param.force_backward = True
    net = Net(net_param, dtype="float64")
    rng = np.random.default_rng(0)
    randomize(net, rng)
    net.set_input("x", rng.uniform(-1, 1, (T, N, D)))
    net.set_input("cont", cont_from_lengths([3, 2], T))
    net.set_input("target", rng.uniform(-1, 1, (T, N, 2 * H)))
    assert [p.name for p in net.learnable_params] == [
        f"l{k}_{d}_{name}" for k in (0, 1) for d in ("fw", "bw") for name in PARAMS[kind]]
    check_net_gradient(net, wrt=["x"], rtol=1e-5, atol=1e-8)


# -- memory and params do not grow with T ---------------------------------------------------


def _param_buffers(net):
    """Addresses of every layer's param data and diff (shared ones point at the owner)."""
    data = {b.data.__array_interface__["data"][0] for bs in net.params.values() for b in bs}
    diff = {b.diff.__array_interface__["data"][0] for bs in net.params.values() for b in bs}
    return data, diff


@pytest.mark.parametrize("kind, direction, layers", [
    ("rnn", "forward", 1), ("lstm", "bidirectional", 2), ("lstm_primitive", "reverse", 1),
    ("gru", "bidirectional", 1),
])
def test_params_and_their_memory_do_not_depend_on_T(kind, direction, layers):
    nets = {T: Net(expand(kind, steps=T, batch=2, input_dim=3, hidden=4, direction=direction,
                          layers=layers), dtype="float64")
            for T in (1, 50)}
    short, long = nets[1], nets[50]
    assert ([(p.name, p.blob.shape) for p in short.learnable_params]
            == [(p.name, p.blob.shape) for p in long.learnable_params])

    def nbytes(net):
        return sum(p.blob.data.nbytes + p.blob.diff.nbytes for p in net.learnable_params)

    assert nbytes(short) == nbytes(long) == short.store.nbytes == long.store.nbytes
    n_owners = len(long.learnable_params)
    for net in (short, long):
        data, diff = _param_buffers(net)
        assert len(data) == len(diff) == n_owners
    # 50 steps of layers, yet every step's param blob is one of the owners'
    assert sum(len(bs) for bs in long.params.values()) > 10 * n_owners


# -- directions -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_reverse_restarts_at_each_sequences_own_last_token(kind):
    T, D, H = 5, 3, 4
    lengths = [5, 2, 3]
    rng = np.random.default_rng(2)
    batch = build(kind, T, len(lengths), D, H, direction="reverse")
    randomize(batch, rng)
    x = rng.uniform(-1, 1, (T, len(lengths), D))  # padding holds values too: they must not leak
    h = batch.forward(x=x, cont=cont_from_lengths(lengths, T))["h"]
    for n, length in enumerate(lengths):
        alone = build(kind, length, 1, D, H, direction="reverse")
        copy_params(batch, alone)
        h_alone = alone.forward(x=x[:length, n:n + 1], cont=cont_from_lengths([length], length))
        np.testing.assert_allclose(h[:length, n:n + 1], h_alone["h"], rtol=1e-12, atol=1e-14,
                                   err_msg=f"sequence {n} (length {length})")


@pytest.mark.parametrize("kind", KINDS)
@given(T=st.integers(1, 5), lengths=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       seed=st.integers(0, 2**32 - 1))
def test_bidirectional_is_concat_of_forward_and_reverse(kind, T, lengths, seed):
    D, H, N = 2, 3, len(lengths)
    lengths = [min(length, T) for length in lengths]
    rng = np.random.default_rng(seed)
    bi = build(kind, T, N, D, H, direction="bidirectional")
    fw = build(kind, T, N, D, H, direction="forward")
    bw = build(kind, T, N, D, H, direction="reverse")
    randomize(bi, rng)
    copy_params(bi, fw, strip("fw_"))
    copy_params(bi, bw, strip("bw_"))
    x = rng.uniform(-1, 1, (T, N, D))
    cont = cont_from_lengths(lengths, T)
    R = rng.uniform(-1, 1, (T, N, 2 * H))

    h, gx = h_and_x_grad(bi, x, cont, R)
    h_fw, gx_fw = h_and_x_grad(fw, x, cont, R[..., :H])
    h_bw, gx_bw = h_and_x_grad(bw, x, cont, R[..., H:])

    assert h.shape == (T, N, 2 * H)
    np.testing.assert_allclose(h, np.concatenate([h_fw, h_bw], axis=2), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gx, gx_fw + gx_bw, rtol=1e-10, atol=1e-13)
    grads = {p.name: p.blob.diff for p in bi.learnable_params}
    for prefix, net in (("fw_", fw), ("bw_", bw)):
        for p in net.learnable_params:
            np.testing.assert_allclose(grads[prefix + p.name], p.blob.diff, rtol=1e-10,
                                       atol=1e-13, err_msg=prefix + p.name)


def test_reverse_net_has_no_dangling_outputs():
    for kind in KINDS:
        net = Net(expand(kind, steps=4, batch=2, input_dim=3, hidden=2, direction="reverse"))
        assert net.outputs == ["h"]


# -- carried hidden state (truncated BPTT) ---------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_two_halves_with_carry_hidden_equal_the_whole(kind):
    D, H, layers = 3, 4, 2
    # columns: one long sequence; a restart inside each half; a restart exactly at the cut
    cont = np.array([[0, 1, 1, 1, 1, 1], [0, 1, 0, 1, 1, 1], [0, 1, 1, 1, 0, 1],
                     [0, 1, 1, 0, 1, 1]], float).T
    T, N = cont.shape
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (T, N, D))
    whole = build(kind, T, N, D, H, layers=layers)
    randomize(whole, rng)
    half = build(kind, T // 2, N, D, H, layers=layers, expose_hidden=True)
    copy_params(whole, half)
    states = list(load_template(kind).interface["states"])
    exposed = [(f"l{k}_{s}_T", f"l{k}_{s}_0") for k in range(layers) for s in states]
    assert set(half.outputs) == {"h"} | {final for final, _ in exposed}
    assert set(half.inputs) >= {initial for _, initial in exposed}

    h_whole = whole.forward(x=x, cont=cont)["h"].copy()
    first = half.forward(x=x[:T // 2], cont=cont[:T // 2])["h"].copy()
    assert sorted(carry_hidden(half)) == sorted(initial for _, initial in exposed)
    second = half.forward(x=x[T // 2:], cont=cont[T // 2:])["h"].copy()

    np.testing.assert_allclose(np.concatenate([first, second]), h_whole, rtol=1e-12, atol=1e-14)
    # without the carry the second half restarts from zero and differs
    for _, initial in exposed:
        half.blobs[initial].data[...] = 0
    restarted = half.forward(x=x[T // 2:], cont=cont[T // 2:])["h"]
    assert not np.allclose(restarted[:, 0], h_whole[T // 2:, 0])


def test_expose_hidden_needs_forward_direction():
    with pytest.raises(TemplateError, match="expose_hidden.*forward"):
        expand("lstm", steps=2, batch=1, input_dim=2, hidden=2, direction="reverse",
               expose_hidden=True)


# -- prototxt text -----------------------------------------------------------------------------


@pytest.mark.parametrize("template, hyper", [
    ("rnn", dict(input_dim=3, hidden=2, bias_value=0.25)),
    ("lstm", dict(input_dim=3, hidden=2, direction="bidirectional", layers=2)),
    ("lstm_primitive", dict(input_dim=3, hidden=2, direction="reverse")),
    ("gru", dict(input_dim=3, hidden=2, expose_hidden=True)),
    ("tagger", dict(vocab=7, tags=3, embed=4, hidden=2, features={"suffix": [50, 8]},
                    dropout=0.5)),
])
def test_prototxt_text_round_trips(template, hyper):
    net_param = expand(template, steps=3, batch=2, **hyper)
    text = to_prototxt(net_param)
    again = parse_text(text, NetParameter(), "round trip")
    assert again == net_param
    assert to_prototxt(again) == text

    from_message = Net(net_param, dtype="float64", phase="test", seed=5)
    from_text = Net(text, dtype="float64", phase="test", seed=5)
    assert from_message.inputs == from_text.inputs
    assert from_message.outputs == from_text.outputs
    for a, b in zip(from_message.learnable_params, from_text.learnable_params):
        assert a.name == b.name
        np.testing.assert_array_equal(a.blob.data, b.blob.data)
    rng = np.random.default_rng(0)
    inputs = {}
    for name in from_message.inputs:
        shape = from_message.blobs[name].shape
        if template == "tagger" and name in ("words", "labels", "suffix"):
            inputs[name] = rng.integers(0, 3, shape)
        elif name == "cont":
            inputs[name] = cont_from_lengths([3, 2], 3)
        elif not name.endswith("_0"):
            inputs[name] = rng.uniform(-1, 1, shape)
    out1, out2 = from_message.forward(**inputs), from_text.forward(**inputs)
    assert out1.keys() == out2.keys()
    for name in out1:
        np.testing.assert_array_equal(out1[name], out2[name])


# -- errors and template lookup ---------------------------------------------------------------

CELL = """\
{#- a user's Elman step: h_t = tanh(W x_t + U (cont_t h_{t-1})) #}
{% set interface = {
    "inputs": ["x"], "states": {"h": "hidden"}, "outputs": ["h"],
    "defaults": {"hidden": none},
} %}
{% macro step(s) %}
layer { name: "{{ s.layer('hc') }}" type: "Scale"
        bottom: "{{ s.prev.h }}" bottom: "{{ s.cont }}" top: "{{ s.blob('hc') }}"
        scale_param { axis: 0 } }
layer { name: "{{ s.layer('u') }}" type: "InnerProduct"
        bottom: "{{ s.blob('hc') }}" top: "{{ s.blob('u') }}"
        param { name: "{{ s.param('U') }}" }
        inner_product_param { num_output: {{ hidden }} bias_term: false axis: 2 } }
layer { name: "{{ s.layer('w') }}" type: "InnerProduct"
        bottom: "{{ s.input.x }}" top: "OUT_W"
        param { name: "PARAM_W" }
        inner_product_param { num_output: {{ hidden }} bias_term: false axis: 2 } }
layer { name: "{{ s.layer('sum') }}" type: "Eltwise"
        bottom: "OUT_W" bottom: "{{ s.blob('u') }}" top: "{{ s.blob('pre') }}" }
layer { name: "{{ s.layer('tanh') }}" type: "TanH"
        bottom: "{{ s.blob('pre') }}" top: "{{ s.state.h }}" }
{% endmacro %}
"""


def write_cell(folder, name="mycell", out_w="{{ s.blob('wx') }}", param_w="{{ s.param('W') }}",
               interface_extra="", states=None):
    text = CELL.replace("OUT_W", out_w).replace("PARAM_W", param_w)
    if interface_extra:
        text = text.replace('"defaults"', f"{interface_extra}, \"defaults\"")
    if states:
        text = text.replace('"states": {"h": "hidden"}', f'"states": {states}')
    path = folder / f"{name}.prototxt.j2"
    path.write_text(text)
    return path


def unroll_cell(template, T=3, **kw):
    return expand(str(template), steps=T, batch=2, input_dim=3, hidden=4, **kw)


def test_user_template_runs(tmp_path):
    net = Net(unroll_cell(write_cell(tmp_path), T=4), dtype="float64")
    assert net.forward()["h"].shape == (4, 2, 4)
    assert [p.name for p in net.learnable_params] == ["U", "W"]


def test_undefined_variable_names_template_line_and_variable(tmp_path):
    path = write_cell(tmp_path, "typo")
    lines = path.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "num_output: {{ hidden }}" in text)
    lines[line - 1] = lines[line - 1].replace("{{ hidden }}", "{{ hiden }}")
    path.write_text("\n".join(lines))
    with pytest.raises(TemplateError) as e:
        unroll_cell(path)
    assert f"typo.prototxt.j2:{line}:" in str(e.value)
    assert "'hiden'" in str(e.value)


def test_undefined_variable_in_a_net_template(tmp_path):
    path = tmp_path / "mynet.prototxt.j2"
    path.write_text(
        '{% set interface = {"kind": "net", "defaults": {}} %}\n'
        'layer { name: "in" type: "Input" top: "x"\n'
        "  input_param { shape { dim: {{ T }} dim: {{ batchsize }} } } }\n"
    )
    with pytest.raises(TemplateError, match=r"mynet\.prototxt\.j2:3:.*'batchsize'"):
        expand(str(path), steps=2)


def test_param_name_that_changes_with_t_is_an_error(tmp_path):
    path = write_cell(tmp_path, "vary", param_w="W_{{ s.t }}")
    with pytest.raises(TemplateError) as e:
        unroll_cell(path)
    message = str(e.value)
    assert "vary.prototxt.j2" in message and "W_0" in message and "W_1" in message
    assert "params_vary_with_t" in message


def test_param_name_may_change_with_t_when_declared(tmp_path):
    path = write_cell(tmp_path, "vary", param_w="W_{{ s.t }}",
                      interface_extra='"params_vary_with_t": true')
    net = Net(unroll_cell(path, T=3))
    assert sorted(p.name for p in net.learnable_params) == ["U", "W_0", "W_1", "W_2"]


def test_state_that_the_step_never_produces(tmp_path):
    path = write_cell(tmp_path, "nocell", states='{"h": "hidden", "cell": "hidden"}')
    with pytest.raises(TemplateError) as e:
        unroll_cell(path)
    assert "nocell.prototxt.j2" in str(e.value) and "'cell'" in str(e.value)


def test_blob_written_by_every_step_is_a_collision(tmp_path):
    path = write_cell(tmp_path, "clash", out_w="tmp")
    with pytest.raises(TemplateError) as e:
        unroll_cell(path)
    assert "clash.prototxt.j2" in str(e.value) and "'tmp'" in str(e.value)
    assert len(Net(unroll_cell(path, T=1)).layers) > 0  # one step alone is fine


def test_missing_hyper_parameter():
    with pytest.raises(TemplateError) as e:
        expand("lstm", steps=2, batch=1, input_dim=2)
    assert "lstm.prototxt.j2" in str(e.value) and "hidden" in str(e.value)
    with pytest.raises(TemplateError, match=r"tagger\.prototxt\.j2.*tags, vocab"):
        expand("tagger", steps=2, batch=1)
    with pytest.raises(TemplateError, match=r"gru\.prototxt\.j2.*input_dim"):
        expand("gru", steps=2, batch=1, hidden=2)


def test_unknown_template_lists_the_builtin_ones():
    with pytest.raises(TemplateError) as e:
        expand("lstn", steps=2, batch=1, input_dim=2, hidden=2)
    assert "'lstn'" in str(e.value)
    for name in BUILTINS:
        assert name in str(e.value)


def test_user_templates_by_path_name_and_environment(tmp_path, monkeypatch):
    folder = tmp_path / "cells"
    folder.mkdir()
    path = write_cell(folder)
    monkeypatch.delenv("UNROLL_TEMPLATE_PATH", raising=False)
    by_path = unroll_cell(path)
    with pytest.raises(TemplateError, match="mycell"):
        unroll_cell("mycell")
    by_name = unroll_cell("mycell", search_path=[folder])
    monkeypatch.setenv("UNROLL_TEMPLATE_PATH", str(folder))
    by_env = unroll_cell("mycell")
    assert by_path.layer == by_name.layer == by_env.layer
    # a user folder comes before the built-ins, and its templates are listed on a miss
    write_cell(folder, "lstm")
    assert [p.name for p in Net(unroll_cell("lstm")).learnable_params] == ["U", "W"]
    with pytest.raises(TemplateError, match="mycell"):
        unroll_cell("nothing")


def test_net_template_calls_a_user_step_template(tmp_path):
    write_cell(tmp_path)
    net_template = tmp_path / "seq.prototxt.j2"
    net_template.write_text(
        '{% set interface = {"kind": "net", "defaults": {"hidden": 3}} %}\n'
        'layer { name: "in" type: "Input" top: "x" top: "cont"\n'
        "  input_param { shape { dim: {{ T }} dim: {{ batch }} dim: 2 }\n"
        "                shape { dim: {{ T }} dim: {{ batch }} } } }\n"
        '{{ recurrent("mycell", "x", "y", direction="bidirectional", hidden=hidden) }}\n'
    )
    net = Net(expand("seq", steps=4, batch=2, search_path=[tmp_path]))
    assert net.forward()["y"].shape == (4, 2, 6)


def _set(net, name, value):
    net.store[name].blob.data[...] = value


@pytest.mark.parametrize("step", ["rnn", "lstm", "gru"])
def test_learned_initial_state_starts_every_sequence(step):
    """Each sequence, wherever it starts in the batch, starts from the learned state."""
    rng = np.random.default_rng(7)
    T, N, D, H = 6, 2, 3, 4
    learned = Net(expand(step, steps=T, batch=N, input_dim=D, hidden=H,
                         initial_state="learned"), dtype="float64")
    states = [p.name[: -len("_init")] for p in learned.learnable_params
              if p.name.endswith("_init")]
    init = {s: rng.normal(size=H) for s in states}
    for s, v in init.items():
        _set(learned, f"{s}_init", v)
    x = rng.normal(size=(T, N, D))
    cont = np.ones((T, N))
    cont[0] = 0
    cont[3, 1] = 0  # column 1 holds two sequences: t = 0..2 and t = 3..5
    h = learned.forward(x=x, cont=cont)["h"]

    # reference: the carried-state net (same weights) run on each sequence alone,
    # its initial state set to the learned one and passed in (cont = 1 at the start)
    def alone(xs):
        ref = Net(expand(step, steps=len(xs), batch=1, input_dim=D, hidden=H,
                         expose_hidden=True), dtype="float64")
        for p in ref.learnable_params:
            p.blob.data[...] = learned.store[p.name].blob.data
        for s, v in init.items():
            ref.blobs[f"{s}_0"].data[...] = v
        return ref.forward(x=xs[:, None], cont=np.ones((len(xs), 1)))["h"][:, 0]

    np.testing.assert_allclose(h[:, 0], alone(x[:, 0]), rtol=1e-10)
    np.testing.assert_allclose(h[:3, 1], alone(x[:3, 1]), rtol=1e-10)
    np.testing.assert_allclose(h[3:, 1], alone(x[3:, 1]), rtol=1e-10)


def test_learned_initial_state_is_one_shared_param_and_gets_gradients():
    nets = [Net(expand("lstm", steps=T, batch=2, input_dim=3, hidden=2, layers=2,
                       direction="bidirectional", initial_state="learned"), dtype="float64")
            for T in (1, 9)]
    names = [[p.name for p in net.learnable_params] for net in nets]
    assert names[0] == names[1]
    assert {"l0_fw_h_init", "l0_fw_c_init", "l1_bw_h_init"} <= set(names[0])
    net_param = with_loss(expand("lstm", steps=3, batch=2, input_dim=3, hidden=2,
                                 direction="bidirectional", initial_state="learned"), [3, 2, 4])
    net = Net(net_param, dtype="float64")
    rng = np.random.default_rng(1)
    cont = np.array([[0, 0], [1, 0], [1, 1]], float)
    for p in net.learnable_params:
        if p.name.endswith("_init"):
            p.blob.data[...] = rng.normal(size=p.blob.shape)
    net.forward(x=rng.normal(size=(3, 2, 3)), cont=cont, y=rng.normal(size=(3, 2, 4)))
    check_net_gradient(net, wrt=["x"])
    net.clear_param_diffs()
    net.forward()
    net.backward()
    assert np.abs(net.store["fw_h_init"].blob.diff).sum() > 0
    assert np.abs(net.store["bw_c_init"].blob.diff).sum() > 0


def test_learned_initial_state_refuses_expose_hidden():
    with pytest.raises(TemplateError, match="learned initial state"):
        expand("lstm", steps=3, batch=2, input_dim=3, hidden=2, initial_state="learned",
               expose_hidden=True)
    with pytest.raises(TemplateError, match="initial_state"):
        expand("lstm", steps=3, batch=2, input_dim=3, hidden=2, initial_state="random")


# -- many-to-one: each sequence's own last state, whatever the padding -------------------------


@given(kind=st.sampled_from(["rnn", "lstm", "gru"]),
       direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
       align=st.sampled_from(["left", "right"]),
       lengths=st.lists(st.integers(1, 4), min_size=1, max_size=3), extra=st.integers(0, 2),
       seed=st.integers(0, 2**32 - 1))
def test_padded_and_unpadded_give_the_same_last_state(kind, direction, align, lengths, extra,
                                                      seed):
    """Once the state at step T-1 whatever the padding: [5] and [-7, 2] looked alike."""
    D, H, N = 2, 3, len(lengths)
    T = max(lengths) + extra
    rng = np.random.default_rng(seed)
    seqs = [rng.uniform(-1, 1, (n, D)) for n in lengths]
    x, cont = time_major(seqs, T, pad_value=0.5, align=align)
    R = rng.uniform(-1, 1, (1, N, H * (2 if direction == "bidirectional" else 1)))

    def last_and_grad(net, x, cont, R):
        last = net.forward(x=x, cont=cont)["h"].copy()
        net.blobs["h"].diff[...] = R
        net.backward()
        return last, net.blobs["x"].diff.copy()

    batch = build(kind, T, N, D, H, direction=direction, sequence_output=False, align=align)
    randomize(batch, rng)
    last, grad = last_and_grad(batch, x, cont, R)
    assert last.shape == R.shape
    for n, s in enumerate(seqs):
        alone = build(kind, len(s), 1, D, H, direction=direction, sequence_output=False,
                      align=align)
        copy_params(batch, alone)
        x1, c1 = time_major([s], len(s))
        last1, grad1 = last_and_grad(alone, x1, c1, R[:, n:n + 1])
        np.testing.assert_allclose(last[:, n:n + 1], last1, rtol=1e-12, atol=1e-14,
                                   err_msg=f"sequence {n} (length {len(s)})")
        at = slice(0, len(s)) if align == "left" else slice(T - len(s), T)
        np.testing.assert_allclose(grad[at, n:n + 1], grad1, rtol=1e-10, atol=1e-13)
        np.testing.assert_array_equal(np.delete(grad[:, n], np.arange(T)[at], axis=0), 0)


def test_many_to_one_needs_the_padding_side_and_refuses_the_other():
    with pytest.raises(TemplateError, match="sequence_output=False needs align="):
        expand("lstm", steps=3, batch=3, input_dim=1, hidden=2, sequence_output=False)
    net = Net(expand("lstm", steps=3, batch=3, input_dim=1, hidden=2, sequence_output=False,
                     align="right"), dtype="float64")
    x, cont = time_major([[[5.0]], [[-7.0], [2.0]], [[1.0], [2.0], [3.0]]], 3)  # left-aligned
    with pytest.raises(NetError, match=r"column 1 does not hold one sequence padded as this layer "
                                       r"reads it.*align="):
        net.forward(x=x, cont=cont)
    packed = np.array([[0, 0, 0], [1, 1, 1], [0, 1, 1]], float)  # column 0: two sequences
    with pytest.raises(NetError, match="column 0"):
        net.forward(x=x, cont=packed)
    x, cont = time_major([[[5.0]], [[-7.0], [2.0]], [[1.0], [2.0], [3.0]]], 3, align="right")
    assert net.forward(x=x, cont=cont)["h"].shape == (1, 3, 2)


def test_many_to_one_net_passes_the_gradient_check():
    net = Net(with_loss(expand("gru", steps=4, batch=3, input_dim=2, hidden=2,
                               sequence_output=False, align="left", direction="bidirectional",
                               initial_state="learned"), [1, 3, 4]), dtype="float64")
    rng = np.random.default_rng(5)
    randomize(net, rng)
    x, cont = time_major([rng.normal(size=(n, 2)) for n in (4, 1, 2)], 4, align="left")
    net.forward(x=x, cont=cont, y=rng.normal(size=(1, 3, 4)))
    check_net_gradient(net, wrt=["x"], rtol=1e-5, atol=1e-8)


# -- truncated BPTT: a stream fed in chunks with carried state equals it fed whole -------------


def _chunks(lengths, size):
    """(start, chunk length, per-stream lengths in the chunk) of streams cut every ``size``."""
    total = max(lengths)
    for start in range(0, total, size):
        T = min(size, total - start)
        yield start, T, [int(np.clip(n - start, 0, T)) for n in lengths]


@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("bucketed", [False, True])
def test_chunks_with_carried_state_equal_the_whole_stream(kind, bucketed):
    """Once every chunk restarted: cont[0] was 0, so carrying the state changed nothing."""
    D, H, lengths, size = 2, 3, [7, 5, 3], 3  # chunks of 3, 3 and 1 steps
    N, S = len(lengths), max(lengths)
    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, (S, N, D))
    whole = build(kind, S, N, D, H)
    randomize(whole, rng)
    cont = cont_from_lengths(lengths, S)
    h_whole = whole.forward(x=x, cont=cont)["h"].copy()

    def expose(T):
        net_param = expand(kind, steps=T, batch=N, input_dim=D, hidden=H, expose_hidden=True)
        net_param.force_backward = True
        return net_param

    if bucketed:
        model = BucketedModel(expose, dtype="float64", steps_from="x")
        copy_params(whole, model.net(size))
        run = model
    else:
        run = Net(expose(size), dtype="float64")
        copy_params(whole, run)
    state = {}
    for start, T, chunk_lengths in _chunks(lengths, size):
        if not bucketed and T != size:
            break  # one Net has one T; the bucketed model takes the short last chunk
        at = slice(start, start + T)
        c = cont_from_lengths(chunk_lengths, T, continues=start > 0)
        h = run.forward(x=x[at], cont=c, **state)["h"]
        valid = c.astype(bool) | (np.arange(T)[:, None] < np.array(chunk_lengths))
        np.testing.assert_allclose(np.where(valid[..., None], h, 0),
                                   np.where(valid[..., None], h_whole[at], 0), rtol=1e-12,
                                   atol=1e-14, err_msg=f"chunk at {start}")
        # backward within the chunk: the whole stream's gradient from this chunk's outputs
        R = rng.uniform(-1, 1, h.shape) * valid[..., None]
        net = run.active if bucketed else run
        net.blobs["h"].diff[...] = R
        net.backward()
        R_whole = np.zeros_like(h_whole)
        R_whole[at] = R
        whole.forward(x=x, cont=cont)
        whole.blobs["h"].diff[...] = R_whole
        whole.backward()
        np.testing.assert_allclose(net.blobs["x"].diff * valid[..., None],
                                   whole.blobs["x"].diff[at] * valid[..., None], rtol=1e-10,
                                   atol=1e-13, err_msg=f"chunk at {start}")
        state = carry_hidden(run)
        assert sorted(state) == (["c_0", "h_0"] if kind == "lstm" else ["h_0"])


def test_carry_hidden_needs_exposed_state():
    with pytest.raises(ValueError, match="expose_hidden=True"):
        carry_hidden(Net(expand("rnn", steps=2, batch=1, input_dim=1, hidden=2)))
    model = BucketedModel(lambda T: expand("rnn", steps=T, batch=1, input_dim=1, hidden=2,
                                           expose_hidden=True))
    with pytest.raises(ValueError, match="has not run forward"):
        carry_hidden(model)


# -- misspelled variables and options are errors ----------------------------------------------


NET_TEMPLATE = """\
{% set interface = {"kind": "net", "defaults": {"hidden": 3}} %}
layer { name: "in" type: "Input" top: "x" top: "cont"
  input_param { shape { dim: {{ T }} dim: {{ batch }} dim: 2 }
                shape { dim: {{ T }} dim: {{ batch }} } } }
{{ recurrent("rnn", "x", "y", CALL) }}
"""


def test_misspelled_variables_and_options_are_errors(tmp_path):
    """Once ignored: sequence_ouput=False returned every step, hiden=8 built the default size."""
    with pytest.raises(TemplateError, match="'sequence_ouput'; did you mean 'sequence_output'"):
        expand("lstm", steps=2, batch=1, input_dim=2, hidden=2, sequence_ouput=False)
    with pytest.raises(TemplateError, match="'hiden'; did you mean 'hidden'"):
        expand("lstm", steps=2, input_dim=2, hidden=2, hiden=8)
    net_template = tmp_path / "my_net.prototxt.j2"
    net_template.write_text(NET_TEMPLATE.replace("CALL", "hidden=hidden"))
    with pytest.raises(TemplateError, match=r"my_net\.prototxt\.j2.*'hiden'; did you mean"):
        expand(str(net_template), steps=2, hiden=8)
    assert Net(expand(str(net_template), steps=2, hidden=8)).forward()["y"].shape == (2, 1, 8)
    net_template.write_text(NET_TEMPLATE.replace("CALL", "hidden=hidden, directon='reverse'"))
    with pytest.raises(TemplateError, match="'directon'; did you mean 'direction'"):
        expand(str(net_template), steps=2)
    with pytest.raises(TemplateError, match="direction must be one of"):
        expand("rnn", steps=2, input_dim=2, hidden=2, direction="backward")


def test_a_hyper_parameter_may_be_named_like_an_option(tmp_path):
    path = write_cell(tmp_path, "wide", states='{"h": "layers"}')
    path.write_text(path.read_text().replace("{{ hidden }}", "{{ layers }}")
                    .replace('"hidden": none', '"layers": none'))
    net = Net(expand(str(path), steps=3, batch=2, input_dim=3, layers=2, hyper={"layers": 5}))
    assert net.forward()["h"].shape == (3, 2, 5)
    assert [p.name for p in net.learnable_params] == ["l0_U", "l0_W", "l1_U", "l1_W"]
    with pytest.raises(TemplateError, match="hidden given both as a keyword and in hyper="):
        expand("rnn", steps=2, input_dim=2, hidden=2, hyper={"hidden": 3})


def test_help_of_expand_lists_every_option():
    import unroll

    for option in ("direction", "layers", "scope", "sequence_output", "align", "expose_hidden",
                   "initial_state", "cont", "batch", "steps", "hyper"):
        assert f"``{option}``" in unroll.expand.__doc__, option


@pytest.mark.parametrize("module", ["unroll.frontend.unroller", "unroll.frontend.template",
                                    "unroll.frontend.builder", "unroll.frontend.render",
                                    "unroll.frontend.interface", "unroll.frontend.recurrence",
                                    "unroll.frontend.shared", "unroll.frontend.checks",
                                    "unroll.frontend.tree_unroller", "unroll.frontend.tree",
                                    "unroll.frontend.tree_recurrence", "unroll.train.carry",
                                    "unroll.testing", "unroll.train.bucketing"])
def test_every_public_helper_is_in_all(module):
    import importlib
    import inspect

    mod = importlib.import_module(module)
    public = {name for name, value in vars(mod).items()
              if not name.startswith("_") and (inspect.isfunction(value) or inspect.isclass(value))
              and value.__module__ == module}
    assert public <= set(mod.__all__), sorted(public - set(mod.__all__))


# -- step templates are checked when expanded ---------------------------------------------------


BROKEN_CELL = """\
{% set interface = {"inputs": ["x"], "states": {"h": "hidden"}, "outputs": ["h"],
                    "defaults": {"hidden": none}} %}
{% macro step(s) %}
BODY
{% endmacro %}
"""


def broken(tmp_path, body, name="broken"):
    path = tmp_path / f"{name}.prototxt.j2"
    path.write_text(BROKEN_CELL.replace("BODY", body))
    return path


def test_a_step_that_never_reads_its_state_is_refused(tmp_path):
    """A cell that ignores its state: unchecked, it built, gave h (3, 5) not (3, 2, 5), and left
    cont_t*/h_0 as outputs."""
    path = broken(tmp_path, """\
layer { name: "{{ s.layer('ip') }}" type: "InnerProduct" bottom: "{{ s.input.x }}"
        top: "{{ s.state.h }}" param { name: "{{ s.param('W') }}" }
        inner_product_param { num_output: {{ hidden }} } }""")
    with pytest.raises(TemplateError, match=r"broken\.prototxt\.j2: step 0 never reads state 'h' "
                                            r"\(s\.prev\.h, 'h_0'\)"):
        unroll_cell(path)


def test_a_step_whose_state_has_the_wrong_shape_is_refused(tmp_path):
    path = broken(tmp_path, """\
layer { name: "{{ s.layer('hc') }}" type: "Scale" bottom: "{{ s.prev.h }}" bottom: "{{ s.cont }}"
        top: "{{ s.blob('hc') }}" scale_param { axis: 0 } }
layer { name: "{{ s.layer('cat') }}" type: "Concat" bottom: "{{ s.input.x }}"
        bottom: "{{ s.blob('hc') }}" top: "{{ s.blob('cat') }}" concat_param { axis: 2 } }
layer { name: "{{ s.layer('ip') }}" type: "InnerProduct" bottom: "{{ s.blob('cat') }}"
        top: "{{ s.state.h }}" param { name: "{{ s.param('W') }}" }
        inner_product_param { num_output: {{ hidden }} } }""")
    with pytest.raises(TemplateError, match=r"broken\.prototxt\.j2 \(step t=0\): state 'h' "
                                            r"\('h_1'\) comes out \(1, 4\), but must be "
                                            r"\(1, 2, 4\)"):
        unroll_cell(path)


def test_a_state_that_cont_never_reaches_is_refused(tmp_path):
    path = broken(tmp_path, """\
layer { name: "{{ s.layer('cat') }}" type: "Concat" bottom: "{{ s.input.x }}"
        bottom: "{{ s.prev.h }}" top: "{{ s.blob('cat') }}" concat_param { axis: 2 } }
layer { name: "{{ s.layer('ip') }}" type: "InnerProduct" bottom: "{{ s.blob('cat') }}"
        top: "{{ s.state.h }}" param { name: "{{ s.param('W') }}" }
        inner_product_param { num_output: {{ hidden }} axis: 2 } }""")
    with pytest.raises(TemplateError, match=r"state 'h' \('h_1'\) does not depend on s\.cont"):
        unroll_cell(path)


def test_a_malformed_interface_names_the_template(tmp_path):
    path = write_cell(tmp_path, "liststates", states='["h"]')
    with pytest.raises(TemplateError, match=r"liststates\.prototxt\.j2: interface 'states' must "
                                            r"map each state"):
        unroll_cell(path)


def test_a_recursive_macro_is_a_template_error(tmp_path):
    path = tmp_path / "loop.prototxt.j2"
    path.write_text('{% set interface = {"kind": "net"} %}\n'
                    "{% macro again() %}{{ again() }}{% endmacro %}\n{{ again() }}\n")
    with pytest.raises(TemplateError, match=r"loop\.prototxt\.j2:2: recursion too deep"):
        expand(str(path), steps=1)


ESCAPES = [
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ self._TemplateReference__context }}",
    "{{ ''|attr('__class__') }}",
    "{{ s.__class__ }}",
    "{{ s._scope }}",
]


@pytest.mark.parametrize("escape", ESCAPES)
def test_known_template_escapes_are_refused(tmp_path, escape):
    as_net = tmp_path / "evil_net.prototxt.j2"
    as_net.write_text('{% set interface = {"kind": "net"} %}\n'
                      f"# {escape.replace('s.', 'recurrent.__self__.')}\n")
    with pytest.raises(TemplateError, match=r"evil_net\.prototxt\.j2:2: refused by the template "
                                            r"sandbox: access to attribute"):
        expand(str(as_net), steps=1)
    cell = write_cell(tmp_path, "evil_cell")
    cell.write_text(cell.read_text().replace("{% macro step(s) %}",
                                             "{% macro step(s) %}\n# " + escape))
    with pytest.raises(TemplateError, match=r"evil_cell\.prototxt\.j2:\d+: refused by the "
                                            r"template sandbox"):
        unroll_cell(cell)


def test_learned_initial_state_is_a_bias_without_a_dummy_param():
    net_param = expand("lstm", steps=2, batch=1, input_dim=2, hidden=3, initial_state="learned")
    init = [lp for lp in net_param.layer if lp.name.endswith("_init")]
    assert [(lp.type, [p.name for p in lp.param]) for lp in init] == [
        ("Bias", ["h_init"]), ("Bias", ["c_init"])]
    net = Net(net_param)
    assert sorted(p.name for p in net.learnable_params) == [
        "W_hc", "W_xc", "b_c", "c_init", "h_init"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("options", [
    dict(), dict(direction="bidirectional", layers=2), dict(direction="reverse",
                                                          initial_state="learned"),
    dict(expose_hidden=True), dict(sequence_output=False, align="left", scope="enc_"),
])
def test_steps_parsed_once_per_shape_equal_steps_parsed_one_by_one(tmp_path, monkeypatch, kind,
                                                                   options):
    """Steps whose text differs only in names reuse one parse; a text that names s.t doesn't."""
    import unroll.frontend.render

    parses = []
    parse = unroll.frontend.render.parse_text
    monkeypatch.setattr(unroll.frontend.render, "parse_text",
                        lambda text, *a: parses.append(text) or parse(text, *a))
    source = (builtin_template_dir() / f"{kind}.prototxt.j2").read_text()
    every_step = tmp_path / f"{kind}_each.prototxt.j2"
    head, tail = source.rsplit("{% endmacro %}", 1)  # the step macro is the last one
    every_step.write_text(head + "# {{ s.t }}\n{% endmacro %}" + tail)
    (tmp_path / "projection.j2").write_text(
        (builtin_template_dir() / "projection.j2").read_text())
    fast = expand(kind, steps=5, batch=2, input_dim=3, hidden=4, **options)
    fast_parses = len(parses)
    slow = expand(str(every_step), steps=5, batch=2, input_dim=3, hidden=4, **options)
    assert fast_parses < len(parses) - fast_parses
    fast.name = slow.name
    assert fast == slow


def test_a_recurrent_block_must_be_placed_once(tmp_path):
    path = tmp_path / "unplaced.prototxt.j2"
    path.write_text(NET_TEMPLATE.replace("{{ recurrent(", "{% set block = recurrent(")
                    .replace("CALL) }}", "hidden=hidden) %}"))
    with pytest.raises(TemplateError, match=r"unplaced\.prototxt\.j2: recurrent\(\) block 0 is "
                                            r"placed 0 times"):
        expand(str(path), steps=2)
    path.write_text(NET_TEMPLATE.replace("{{ recurrent(", "{% set block = recurrent(")
                    .replace("CALL) }}", "hidden=hidden) %}\n{{ block }}\n{{ block }}"))
    with pytest.raises(TemplateError, match="block 0 is placed 2 times"):
        expand(str(path), steps=2)


# -- expand checks the net at the T it is asked for, and builds each net once ----------------

CHUNKS_TEMPLATE = """\
{#- the recurrence's output cut in time where the caller says (points depend on T), the
    chunks put back in reverse order: y = h[p_k:] ++ ... ++ h[:p_1] #}
{% set interface = {"kind": "net", "defaults": {"input_dim": none, "hidden": none,
                                                 "points": []}} %}
layer { name: "input" type: "Input" top: "x" top: "cont"
        input_param { shape { dim: {{ T }} dim: {{ batch }} dim: {{ input_dim }} }
                      shape { dim: {{ T }} dim: {{ batch }} } } }
{{ recurrent("rnn", "x", "h", hidden=hidden) }}
layer { name: "chunks" type: "Slice" bottom: "h"
{% for i in range(points | length + 1) %}  top: "h_part{{ i }}"
{% endfor %}  slice_param { axis: 0 {% for p in points %} slice_point: {{ p }}{% endfor %} } }
layer { name: "reversed" type: "Concat"
{% for i in range(points | length, -1, -1) %}  bottom: "h_part{{ i }}"
{% endfor %}  top: "y" concat_param { axis: 0 } }
"""


def chunk_points(T):
    return sorted({p for p in (T // 3, 2 * T // 3) if 0 < p < T})


@pytest.mark.parametrize("T", [1, 7, 11])
def test_a_template_whose_slice_points_depend_on_T_expands_and_runs(tmp_path, T):
    """Slice points past 1 do not build at T = 1: the check must build the net at T."""
    path = tmp_path / "chunks.prototxt.j2"
    path.write_text(CHUNKS_TEMPLATE)
    points = chunk_points(T)
    net = Net(expand(str(path), steps=T, batch=2, input_dim=3, hidden=4, points=points),
              dtype="float64")
    plain = Net(expand("rnn", steps=T, batch=2, input_dim=3, hidden=4), dtype="float64")
    copy_params(net, plain)
    rng = np.random.default_rng(T)
    x, cont = rng.normal(size=(T, 2, 3)), cont_from_lengths([T, max(1, T - 2)], T)
    y = net.forward(x=x, cont=cont)["y"]
    h = plain.forward(x=x, cont=cont)["h"]
    bounds = [0, *points, T]
    want = np.concatenate([h[a:b] for a, b in zip(bounds, bounds[1:])][::-1])
    np.testing.assert_allclose(y, want, rtol=1e-12)


def test_a_net_that_does_not_build_at_its_T_names_the_T(tmp_path):
    path = tmp_path / "chunks.prototxt.j2"
    path.write_text(CHUNKS_TEMPLATE)
    with pytest.raises(TemplateError, match=r"chunks\.prototxt\.j2: the net unrolled to 4 "
                                            r"step\(s\) does not build: layer 'chunks' \(Slice\)"):
        expand(str(path), steps=4, batch=2, input_dim=3, hidden=4, points=[5])


def test_each_template_variables_and_T_is_expanded_once(tmp_path, monkeypatch):
    """Asked again, expand hands out a copy of the net it built; a changed file is rebuilt."""
    import unroll.frontend.render

    parses = []
    parse = unroll.frontend.render.parse_text
    monkeypatch.setattr(unroll.frontend.render, "parse_text",
                        lambda text, *a: parses.append(text) or parse(text, *a))
    cell = tmp_path / "cell.prototxt.j2"
    cell.write_text((builtin_template_dir() / "rnn.prototxt.j2").read_text())
    path = tmp_path / "chunks.prototxt.j2"
    path.write_text(CHUNKS_TEMPLATE.replace('recurrent("rnn"', 'recurrent("cell.prototxt.j2"'))
    options = dict(batch=2, input_dim=3, hidden=4, search_path=[tmp_path])
    first = expand(str(path), steps=5, points=[2], **options)
    built = len(parses)
    assert built > 0
    first.name = "changed by its caller"
    again = expand(str(path), steps=5, points=[2], **options)
    assert len(parses) == built and again.name != first.name
    assert again == expand(str(path), steps=5, points=[2], **options)
    expand(str(path), steps=6, points=[2], **options)  # another T: another net
    assert len(parses) > built
    built = len(parses)
    # the step template it calls changes: the cached nets are stale
    cell.write_text(cell.read_text().replace("TanH", "Sigmoid"))
    os.utime(cell, ns=(cell.stat().st_atime_ns, cell.stat().st_mtime_ns + 10**9))
    changed = expand(str(path), steps=5, points=[2], **options)
    assert len(parses) > built
    assert "Sigmoid" in {lp.type for lp in changed.layer}


# -- every state entering a step is gated by cont ---------------------------------------------

PEEPHOLE = """\
layer {
  name: "{{ s.layer('peep') }}"  type: "Scale"  bottom: "C_IN"  top: "{{ s.blob('peep') }}"
  param { name: "{{ s.param('w_peep') }}" }
  scale_param { axis: 2  num_axes: 1  filler { type: "constant" value: 0.5 } }
}
layer {
  name: "{{ s.layer('peep_pad') }}"  type: "Concat"
  bottom: "{{ s.blob('peep') }}"  bottom: "{{ s.blob('peep') }}"  bottom: "{{ s.blob('peep') }}"
  bottom: "{{ s.blob('peep') }}"  top: "{{ s.blob('peep4') }}"  concat_param { axis: 2 }
}
layer {
  name: "{{ s.layer('gates') }}"  type: "Eltwise"  bottom: "{{ s.input.x }}"
  bottom: "{{ s.blob('hc') }}"  bottom: "{{ s.blob('peep4') }}"  top: "{{ s.blob('gates') }}"
  eltwise_param { operation: SUM }
}
"""
C_CONT = """\
layer {
  name: "{{ s.layer('c_cont') }}"  type: "Scale"
  bottom: "{{ s.prev.c }}"  bottom: "{{ s.cont }}"  top: "{{ s.blob('c_cont') }}"
  scale_param { axis: 0 }
}
"""


def peephole_lstm(tmp_path, gated: bool):
    """The lstm template with the previous cell state added into every gate (a peephole),
    read as it comes in (the mistake: h is gated, c is not) or after a Scale by cont."""
    source = (builtin_template_dir() / "lstm.prototxt.j2").read_text()
    gates = source[source.index("layer {\n  name: \"{{ s.layer('gates') }}\""):
                   source.index("layer {\n  name: \"{{ s.layer('unit') }}\"")]
    c_in = "{{ s.blob('c_cont') }}" if gated else "{{ s.prev.c }}"
    source = source.replace(gates, (C_CONT if gated else "") + PEEPHOLE.replace("C_IN", c_in))
    path = tmp_path / f"peephole_{'gated' if gated else 'leaky'}.prototxt.j2"
    path.write_text(source)
    (tmp_path / "projection.j2").write_text(
        (builtin_template_dir() / "projection.j2").read_text())
    return path


def test_a_state_read_before_cont_gates_it_is_refused_naming_it(tmp_path):
    """The peephole-shaped mistake: cont reaches c (through h and the unit), yet the cell
    reads c_{t-1} ungated, so packed sequences would leak state into each other."""
    path = peephole_lstm(tmp_path, gated=False)
    with pytest.raises(TemplateError, match=r"peephole_leaky\.prototxt\.j2: state 'c' "
                                            r"\(s\.prev\.c, 'c_0'\) is read by layer 'peep_t0' "
                                            r"\(Scale\) at step 0 before s\.cont gates it"):
        expand(str(path), steps=3, batch=2, input_dim=3, hidden=4)
    primitive = (builtin_template_dir() / "lstm_primitive.prototxt.j2").read_text()
    leaky = tmp_path / "leaky_primitive.prototxt.j2"
    gated_c = "bottom: \"{{ s.blob('c_cont') }}\"  top: \"{{ s.blob('fc') }}\""
    assert gated_c in primitive
    leaky.write_text(primitive.replace(gated_c, gated_c.replace("s.blob('c_cont')", "s.prev.c")))
    with pytest.raises(TemplateError, match=r"state 'c' \(s\.prev\.c, 'c_0'\) is read by layer "
                                            r"'fc_t0' \(Eltwise\)"):
        expand(str(leaky), steps=3, batch=2, input_dim=3, hidden=4)


def test_the_gated_peephole_is_accepted_and_keeps_packed_sequences_apart(tmp_path):
    path = peephole_lstm(tmp_path, gated=True)
    net = Net(expand(str(path), steps=5, batch=1, input_dim=3, hidden=4), dtype="float64")
    alone = Net(expand(str(path), steps=2, batch=1, input_dim=3, hidden=4), dtype="float64")
    randomize(net, np.random.default_rng(0))
    copy_params(net, alone)
    x = np.random.default_rng(1).normal(size=(5, 1, 3))
    packed = net.forward(x=x, cont=np.array([[0], [1], [1], [0], [1]], float))["h"]
    second = alone.forward(x=x[3:], cont=np.array([[0], [1]], float))["h"]
    np.testing.assert_allclose(packed[3:], second, rtol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("options", [
    dict(), dict(direction="bidirectional", layers=2), dict(initial_state="learned"),
    dict(expose_hidden=True), dict(direction="reverse", sequence_output=False, align="left"),
])
def test_every_builtin_step_template_gates_every_state(kind, options):
    expand(kind, steps=3, batch=2, input_dim=3, hidden=4, **options)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_the_tagger_gates_every_state_of_its_cells(cell):
    expand("tagger", steps=3, batch=2, vocab=9, tags=3, embed=4, hidden=3, cell=cell,
           chars={"vocab": 6, "embed": 3, "hidden": 2, "length": 4}, char_columns=3)


# -- a recurrence started from blobs: encoder -> decoder ----------------------------------------

SEQ2SEQ = """\
{#- an LSTM encoder over src; an LSTM decoder over tgt started from its final states #}
{% set interface = {"kind": "net", "defaults": {"input_dim": none, "hidden": none,
                                                 "source": none}} %}
force_backward: true
layer { name: "input" type: "Input"
        top: "src" top: "src_cont" top: "tgt" top: "tgt_cont" top: "y"
        input_param { shape { dim: {{ source }} dim: {{ batch }} dim: {{ input_dim }} }
                      shape { dim: {{ source }} dim: {{ batch }} }
                      shape { dim: {{ T }} dim: {{ batch }} dim: {{ input_dim }} }
                      shape { dim: {{ T }} dim: {{ batch }} }
                      shape { dim: {{ T }} dim: {{ batch }} dim: {{ hidden }} } } }
{{ recurrent("lstm", "src", "enc_h", "src_cont", scope="enc_", steps=source,
             expose_hidden=True, hidden=hidden) }}
{{ recurrent("lstm", "tgt", "dec_h", "tgt_cont", scope="dec_", hidden=hidden,
             initial_state={"h": "enc_h_T", "c": "enc_c_T"}) }}
layer { name: "loss" type: "EuclideanLoss" bottom: "dec_h" bottom: "y" top: "loss" }
"""


def np_lstm(p, x, cont, h, c, given=None):
    """Caffe's LSTM over x (T, N, D) from (h, c); with ``given`` states, a sequence starts
    from them (step 0 whatever its cont) instead of from zeros. Returns hs, final h, c."""
    hs = []
    for t in range(len(x)):
        keep = cont[t][:, None]
        if given is not None:
            h, c = (given[0], given[1]) if t == 0 else (
                keep * h + (1 - keep) * given[0], keep * c + (1 - keep) * given[1])
            keep = np.ones_like(keep)
        a = x[t] @ p["W_xc"].T + p["b_c"] + (keep * h) @ p["W_hc"].T
        i, f, o, g = np.split(a, 4, axis=-1)
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        c = sig(f) * keep * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        hs.append(h)
    return np.stack(hs), h, c


def test_a_decoder_started_from_the_encoders_final_states_equals_numpy_and_its_gradient(
        tmp_path):
    path = tmp_path / "seq2seq.prototxt.j2"
    path.write_text(SEQ2SEQ)
    S, T, N, D, H = 4, 3, 2, 3, 4
    net = Net(expand(str(path), steps=T, batch=N, input_dim=D, hidden=H, source=S),
              dtype="float64")
    assert "dec_h_0" not in net.inputs and "enc_h_T" not in net.outputs
    rng = np.random.default_rng(5)
    randomize(net, rng, scale=0.6)
    src_cont = cont_from_lengths([4, 2], S)
    tgt_cont = np.array([[0, 0], [1, 0], [1, 1]], float)  # column 1: a second sequence at t=1
    inputs = {"src": rng.normal(size=(S, N, D)), "src_cont": src_cont,
              "tgt": rng.normal(size=(T, N, D)), "tgt_cont": tgt_cont,
              "y": rng.normal(size=(T, N, H)), "enc_h_0": np.zeros((1, N, H)),
              "enc_c_0": np.zeros((1, N, H))}
    dec_h = net.forward(blobs=["dec_h"], **inputs)["dec_h"].copy()
    p = {name: {w: net.store[f"{name}_{w}"].blob.data for w in ("W_xc", "b_c", "W_hc")}
         for name in ("enc", "dec")}
    zeros = np.zeros((N, H))
    # the encoder's final state of column 1 is the one after its last step (t = S - 1), as
    # cont_from_lengths left-aligns: the padded steps run on, as expose_hidden carries them
    _, enc_h, enc_c = np_lstm(p["enc"], inputs["src"], src_cont, zeros, zeros)
    want, _, _ = np_lstm(p["dec"], inputs["tgt"], tgt_cont, zeros, zeros, given=(enc_h, enc_c))
    np.testing.assert_allclose(dec_h, want, rtol=1e-10, atol=1e-12)
    # cont 0 at the decoder's first step does not drop the given state
    cold, _, _ = np_lstm(p["dec"], inputs["tgt"], tgt_cont, zeros, zeros)
    assert not np.allclose(dec_h[0], cold[0])
    for name, value in inputs.items():
        net.set_input(name, value)
    check_net_gradient(net, wrt=["src", "tgt"])  # every param: the encoder's through the decoder
    net.forward()
    net.clear_param_diffs()
    net.backward()
    assert np.abs(net.store["enc_W_hc"].blob.diff).max() > 1e-6


def test_an_initial_state_from_blobs_must_name_every_state_and_an_existing_blob(tmp_path):
    path = tmp_path / "seq2seq.prototxt.j2"
    with pytest.raises(TemplateError, match=r"initial_state gives no blob for state 'c'; "
                                            r"lstm\.prototxt\.j2 starts from one blob per state, "
                                            r"'h' \(1, N, 4\), 'c' \(1, N, 4\)"):
        path.write_text(SEQ2SEQ.replace(', "c": "enc_c_T"', ""))
        expand(str(path), steps=3, batch=2, input_dim=3, hidden=4, source=4)
    path.write_text(SEQ2SEQ.replace('"enc_c_T"', '"enc_cell_T"'))
    with pytest.raises(TemplateError, match=r"starts state 'c' from blob 'enc_cell_T', which no "
                                            r"layer above the recurrence makes"):
        expand(str(path), steps=3, batch=2, input_dim=3, hidden=4, source=4)
    path.write_text(SEQ2SEQ.replace("hidden=hidden,\n", "hidden=5,\n"))
    with pytest.raises(TemplateError, match=r"initial state 'h' \('enc_h_T'\) comes out "
                                            r"\(1, 2, 4\), but must be \(1, 2, 5\)"):
        expand(str(path), steps=3, batch=2, input_dim=3, hidden=4, source=4)


def test_expand_takes_the_initial_states_as_inputs():
    net = Net(expand("gru", steps=3, batch=2, input_dim=3, hidden=4,
                     initial_state={"h": "h_start"}), dtype="float64")
    assert net.inputs == ["x", "cont", "h_start"]
    rng = np.random.default_rng(0)
    x, start = rng.normal(size=(3, 2, 3)), rng.normal(size=(1, 2, 4))
    carried = Net(expand("gru", steps=3, batch=2, input_dim=3, hidden=4, expose_hidden=True),
                  dtype="float64")
    copy_params(net, carried)
    h = net.forward(x=x, cont=np.array([[0, 0], [1, 1], [1, 1]], float), h_start=start)["h"]
    # the carried-state net with cont 1 at the start: the same, as nothing restarts after it
    want = carried.forward(x=x, cont=np.ones((3, 2)), h_0=start)["h"]
    np.testing.assert_allclose(h, want, rtol=1e-12)


# -- the first-step rule: one place owns it (docs/design.md, "State from anywhere") --------
@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=6))
def test_the_first_step_from_a_given_state_reads_one_cont_whatever_cont_says(cont):
    from unroll.frontend.recurrence import GIVEN_STATE_CONT, first_step_cont

    assert first_step_cont(np.array([cont])).tolist() == [[GIVEN_STATE_CONT] * len(cont)]


def test_the_unroller_feeds_a_given_state_the_first_step_rule_as_a_layer():
    from unroll.frontend.recurrence import GIVEN_STATE_CONT

    net = expand("lstm", steps=3, batch=2, input_dim=3, hidden=4,
                 initial_state={"h": "h_given", "c": "c_given"})
    ones = [lp for lp in net.layer if lp.name.endswith("_ones")]
    assert [(lp.type, lp.power_param.scale, lp.power_param.shift) for lp in ones] == [
        ("Power", 0.0, GIVEN_STATE_CONT)]
