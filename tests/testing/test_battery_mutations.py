"""The battery catches planted bugs, and names the check that caught each.

Each mutant is a copy of a built-in layer (a subclass registered under a
test-only type name) or of a template (a modified copy written to tmp_path),
with one bug of the kind people write. Its correct twin passes the same
battery. The table of what caught what is MUTATIONS; `test_mutation_table`
prints it (run with -s).
"""

import re

import numpy as np
import pytest

from unroll import testing
from unroll.engine.layer import register_layer
from unroll.engine.layers.inner_product import InnerProductLayer
from unroll.engine.layers.neuron import SigmoidLayer, TanHLayer
from unroll.frontend.template import builtin_template_dir
from unroll.testing import BatteryFailure, check_layer, check_template
from unroll.testing.references import lstm_step, sigmoid
from unroll.testing.template_battery import GATED

X = np.random.default_rng(0).uniform(-1, 1, (3, 4))
SQUARE_IP = ('type: "{}" inner_product_param {{ num_output: 4 weight_filler {{ type: "uniform" '
             'min: -1 max: 1 }} bias_filler {{ type: "uniform" min: -1 max: 1 }} }}')


@register_layer("BatteryTanHWrongSign")
class TanHWrongSign(TanHLayer):
    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            y = tops[0].data
            bottoms[0].diff[...] = tops[0].diff * (y * y - 1)  # the sign flipped


@register_layer("BatteryIPOverwrites")
class InnerProductOverwrites(InnerProductLayer):
    def backward(self, tops, propagate_down, bottoms):
        for blob in self.blobs:
            blob.diff[...] = 0  # = where += belongs: what was there is lost
        super().backward(tops, propagate_down, bottoms)


@register_layer("BatteryIPTransposed")
class InnerProductTransposed(InnerProductLayer):
    def backward(self, tops, propagate_down, bottoms):
        gy = tops[0].diff.reshape(self.M, self.num_output)
        self.param_backward(bottoms[0].data.reshape(self.M, self.K), gy)
        if propagate_down[0]:
            bottoms[0].diff[...] = (gy @ self.blobs[0].data.T).reshape(bottoms[0].shape)


@register_layer("BatterySigmoidReadsBottom")
class SigmoidReadsBottom(SigmoidLayer):
    """Declares in place, but its backward reads x, which an in-place forward overwrote."""

    def backward(self, tops, propagate_down, bottoms):
        if propagate_down[0]:
            s = sigmoid(bottoms[0].data)
            bottoms[0].diff[...] = tops[0].diff * s * (1 - s)


@register_layer("BatteryTanHWritesBottom")
class TanHWritesBottom(TanHLayer):
    def forward(self, bottoms, tops):
        x = bottoms[0].data
        self.xp.tanh(x, out=x)  # computed in the bottom's memory, then copied
        tops[0].data[...] = x


@register_layer("BatterySigmoidExp")
class SigmoidExp(SigmoidLayer):
    def forward(self, bottoms, tops):
        e = self.xp.exp(bottoms[0].data)  # overflows in float32 beyond x = 88
        tops[0].data[...] = e / (1 + e)


@register_layer("BatteryTanHIgnoresPropagateDown")
class TanHIgnoresPropagateDown(TanHLayer):
    def backward(self, tops, propagate_down, bottoms):
        y = tops[0].data
        bottoms[0].diff[...] = tops[0].diff * (1 - y * y)


@register_layer("BatteryTanHMemoryOrder")
class TanHMemoryOrder(TanHLayer):
    def forward(self, bottoms, tops):
        x = bottoms[0].data
        # reads the bottom in its memory order, as a kernel that ignores strides would
        flat = x.reshape(-1, order="A") if x.flags.f_contiguous else x.reshape(-1)
        tops[0].data[...] = np.tanh(flat).reshape(x.shape)


def catches(report, check):
    assert not report.passed, "the mutant passed the battery"
    assert check in report.caught_by(), report.failure_message()
    return report


# (mutation, layer spec or None, bottoms, reference, devices, check expected to catch it)
LAYER_MUTANTS = [
    ("wrong sign in a backward", 'type: "BatteryTanHWrongSign"', "TanH", [X], np.tanh,
     "backward vs central differences"),
    ("= instead of += into a param diff", SQUARE_IP.format("BatteryIPOverwrites"),
     SQUARE_IP.format("InnerProduct"), [X], None, "param diffs accumulate"),
    ("a transposed weight in backward", SQUARE_IP.format("BatteryIPTransposed"),
     SQUARE_IP.format("InnerProduct"), [X], None, "backward vs central differences"),
    ("an in-place write clobbers what backward reads", 'type: "BatterySigmoidReadsBottom"',
     "Sigmoid", [X], sigmoid, "in place equals out of place"),
    ("a bottom modified by forward", 'type: "BatteryTanHWritesBottom"', "TanH", [X], np.tanh,
     "bottoms unchanged"),
    ("float32 overflow in an exp", 'type: "BatterySigmoidExp"', "Sigmoid",
     [np.array([[-100.0, -1.0, 0.5, 95.0]])], sigmoid, "float32 vs float64"),
    ("backward ignores propagate_down", 'type: "BatteryTanHIgnoresPropagateDown"', "TanH", [X],
     np.tanh, "propagate_down"),
    ("forward depends on the memory layout", 'type: "BatteryTanHMemoryOrder"', "TanH", [X],
     np.tanh, "non-contiguous bottoms"),
]


@pytest.mark.parametrize("mutation, spec, twin, bottoms, reference, check", LAYER_MUTANTS,
                         ids=[m[0] for m in LAYER_MUTANTS])
def test_the_battery_catches_a_planted_layer_bug(mutation, spec, twin, bottoms, reference,
                                                  check):
    if not twin.startswith("type:"):
        twin = f'type: "{twin}"'
    check_layer(twin, bottoms, reference)  # the correct twin passes: no false alarm
    report = catches(check_layer(spec, bottoms, reference, strict=False), check)
    with pytest.raises(BatteryFailure, match=re.escape(check)) as raised:
        check_layer(spec, bottoms, reference)
    assert isinstance(raised.value, AssertionError)
    assert "hint: " in str(raised.value)
    assert raised.value.report.caught_by() == report.caught_by()


def test_a_failure_names_the_blob_the_direction_and_both_values():
    report = check_layer('type: "BatteryTanHWrongSign"', [np.linspace(-1, 1, 40)], np.tanh,
                         devices=["cpu"], strict=False)
    (failed,) = [c for c in report.failures if c.name == "backward vs central differences"]
    assert failed.subject == "bottom 0 (3 directions)"
    assert re.search(r"bottom 0 along random direction \d: analytic -?[\d.e-]+, numeric",
                     failed.detail)
    assert "wrong sign" in failed.hint
    message = check_layer(SQUARE_IP.format("BatteryIPOverwrites"), [X], devices=["cpu"],
                          strict=False).failure_message()
    assert "backward overwrites the param diff instead of adding to it" in message
    assert "param 0 diff after two forward-backwards" in message


# -- templates -------------------------------------------------------------------------

PEEPHOLE = """\
{#- LSTM with peepholes (Gers and Schmidhuber):
      i = sig(a_i + p_i c'),  f = sig(a_f + p_f c'),  o = sig(a_o + p_o c_t),  c' = cont c_{t-1}
      c_t = f c' + i tanh(a_g),  h_t = o tanh(c_t) #}
{% set interface = {"kind": "step", "inputs": ["x"], "states": {"h": "hidden", "c": "hidden"},
                    "outputs": ["h"], "defaults": {"hidden": none}} %}
{% from "projection.j2" import input_projection %}
{% macro sequence(s) %}
{{ input_projection(s, 4 * hidden, "W_xc", "b_c", "xavier") }}
{% endmacro %}
{% macro peep(s, name, bottom) %}
layer { name: "{{ s.layer(name) }}" type: "Scale" bottom: "{{ bottom }}"
        top: "{{ s.blob(name) }}" param { name: "{{ s.param(name) }}" }
        scale_param { axis: 2 num_axes: 1 filler { type: "uniform" min: -1 max: 1 } } }
{% endmacro %}
{% macro add(s, name, a, b) %}
layer { name: "{{ s.layer(name) }}" type: "Eltwise" bottom: "{{ a }}" bottom: "{{ b }}"
        top: "{{ s.blob(name) }}" }
{% endmacro %}
{% macro unary(s, type, name, bottom) %}
layer { name: "{{ s.layer(name) }}" type: "{{ type }}" bottom: "{{ bottom }}"
        top: "{{ s.blob(name) }}" }
{% endmacro %}
{% macro mul(s, name, a, b, top=none) %}
layer { name: "{{ s.layer(name) }}" type: "Eltwise" bottom: "{{ a }}" bottom: "{{ b }}"
        top: "{{ top or s.blob(name) }}" eltwise_param { operation: PROD } }
{% endmacro %}
{% macro step(s) %}
layer { name: "{{ s.layer('h_cont') }}" type: "Scale" bottom: "{{ s.prev.h }}"
        bottom: "{{ s.cont }}" top: "{{ s.blob('h_cont') }}" scale_param { axis: 0 } }
layer { name: "{{ s.layer('hc') }}" type: "InnerProduct" bottom: "{{ s.blob('h_cont') }}"
        top: "{{ s.blob('hc') }}" param { name: "{{ s.param('W_hc') }}" }
        inner_product_param { num_output: {{ 4 * hidden }} bias_term: false axis: 2
                              weight_filler { type: "xavier" } } }
{{ add(s, 'gates', s.input.x, s.blob('hc')) }}
layer { name: "{{ s.layer('split') }}" type: "Slice" bottom: "{{ s.blob('gates') }}"
        top: "{{ s.blob('i_pre') }}" top: "{{ s.blob('f_pre') }}" top: "{{ s.blob('o_pre') }}"
        top: "{{ s.blob('g_pre') }}" slice_param { axis: 2 } }
layer { name: "{{ s.layer('c_cont') }}" type: "Scale" bottom: "{{ s.prev.c }}"
        bottom: "{{ s.cont }}" top: "{{ s.blob('c_cont') }}" scale_param { axis: 0 } }
{{ peep(s, 'p_i', s.blob('c_cont')) }}
{{ peep(s, 'p_f', s.blob('c_cont')) }}
{{ add(s, 'i_in', s.blob('i_pre'), s.blob('p_i')) }}
{{ add(s, 'f_in', s.blob('f_pre'), s.blob('p_f')) }}
{{ unary(s, 'Sigmoid', 'i', s.blob('i_in')) }}
{{ unary(s, 'Sigmoid', 'f', s.blob('f_in')) }}
{{ unary(s, 'TanH', 'g', s.blob('g_pre')) }}
{{ mul(s, 'fc', s.blob('f'), s.blob('c_cont')) }}
{{ mul(s, 'ig', s.blob('i'), s.blob('g')) }}
layer { name: "{{ s.layer('c') }}" type: "Eltwise" bottom: "{{ s.blob('fc') }}"
        bottom: "{{ s.blob('ig') }}" top: "{{ s.state.c }}" }
{{ peep(s, 'p_o', OUTPUT_GATE_READS) }}
{{ add(s, 'o_in', s.blob('o_pre'), s.blob('p_o')) }}
{{ unary(s, 'Sigmoid', 'o', s.blob('o_in')) }}
{{ unary(s, 'TanH', 'tanh_c', s.state.c) }}
{{ mul(s, 'h', s.blob('o'), s.blob('tanh_c'), s.state.h) }}
{% endmacro %}
"""


def peephole_step(x, states, params):
    """One step of the peephole LSTM, from its equation."""
    p, c_prev = params, states["c"]
    a = x @ p["W_xc"].T + p["b_c"] + states["h"] @ p["W_hc"].T
    i, f, o, g = np.split(a, 4, axis=-1)
    i, f = sigmoid(i + p["p_i"] * c_prev), sigmoid(f + p["p_f"] * c_prev)
    c = f * c_prev + i * np.tanh(g)
    h = sigmoid(o + p["p_o"] * c) * np.tanh(c)
    return {"h": h}, {"h": h, "c": c}


def peephole(tmp_path, output_gate_reads="s.state.c", name="peephole"):
    path = tmp_path / f"{name}.prototxt.j2"
    path.write_text(PEEPHOLE.replace("OUTPUT_GATE_READS", output_gate_reads))
    return path


SMALL = dict(steps=4, batch=2, input_dim=2, hidden=3)


@pytest.mark.slow
def test_the_peephole_mistake_passes_every_gradient_check_and_fails_the_reference(tmp_path):
    check_template(peephole(tmp_path), peephole_step, **SMALL)
    wrong = peephole(tmp_path, "s.blob('c_cont')", "peephole_wrong")  # o reads c_{t-1}
    report = catches(check_template(wrong, peephole_step, strict=False, devices=["cpu"],
                                    **SMALL), "forward vs reference")
    # the gradient checks alone prove nothing about the equation: only the reference catches it
    assert report.caught_by() == ["forward vs reference"]
    assert check_template(wrong, strict=False, devices=["cpu"], configs=["forward"],
                          **SMALL).passed


def ungated_lstm(tmp_path):
    """lstm_primitive with c_{t-1} read directly: the c_cont Scale removed."""
    text = (builtin_template_dir() / "lstm_primitive.prototxt.j2").read_text()
    text, n = re.subn(r"layer \{\n  name: \"\{\{ s\.layer\('c_cont'\) \}\}\".*?\n\}\n", "", text,
                      flags=re.S)
    assert n == 1
    text = text.replace("s.blob('c_cont')", "s.prev.c")
    path = tmp_path / "lstm_ungated.prototxt.j2"
    path.write_text(text)
    return path


def test_a_state_not_gated_by_cont_is_caught_without_a_reference(tmp_path):
    # the unroller proves gating when it expands the step, so nothing needs to run
    report = catches(check_template(ungated_lstm(tmp_path), strict=False, **SMALL), GATED)
    assert [c.subject for c in report.failures] == ["state 'c'"]
    with pytest.raises(BatteryFailure, match="state 'c'"):
        check_template(ungated_lstm(tmp_path), **SMALL)


MUTATIONS = [(m[0], m[1], m[3], m[4], m[5]) for m in LAYER_MUTANTS]


def test_mutation_table(tmp_path, capsys):
    """Every mutant, the check that caught it and its worst error (printed with -s)."""
    rows = []
    for mutation, spec, bottoms, reference, check in MUTATIONS:
        report = check_layer(spec, bottoms, reference, strict=False, devices=["cpu"])
        rows.append((mutation, check, report.worst(check)))
    for mutation, path, reference, check in [
            ("a state not gated by cont", ungated_lstm(tmp_path), None, GATED),
            ("peephole: o reads c_{t-1}, against a reference",
             peephole(tmp_path, "s.blob('c_cont')", "wrong"), peephole_step,
             "forward vs reference")]:
        report = check_template(path, reference, strict=False, devices=["cpu"],
                                configs=["forward"], **SMALL)
        rows.append((mutation, check, report.worst(check)))
    for mutation, check, worst in rows:  # a numeric check's error, or a refusal's nan
        assert not np.isnan(worst) or check == GATED, (mutation, check)
    with capsys.disabled():
        print("\nmutation | caught by | worst error")
        for mutation, check, worst in rows:
            print(f"{mutation} | {check} | {'refused' if np.isnan(worst) else f'{worst:.3g}'}")


def test_the_lstm_reference_is_the_peephole_one_without_peepholes(tmp_path):
    rng = np.random.default_rng(0)
    p = {"W_xc": rng.normal(size=(8, 3)), "b_c": rng.normal(size=8),
         "W_hc": rng.normal(size=(8, 2))}
    s = {"h": rng.normal(size=(2, 2)), "c": rng.normal(size=(2, 2))}
    x = rng.normal(size=(2, 3))
    zero = {k: np.zeros(2) for k in ("p_i", "p_f", "p_o")}
    (out, st), (out2, st2) = lstm_step(x, s, p), peephole_step(x, s, {**p, **zero})
    np.testing.assert_allclose(out["h"], out2["h"])
    np.testing.assert_allclose(st["c"], st2["c"])
    assert testing.available_devices()[:2] == ["cpu", "trace"]


def test_a_backward_with_nothing_to_do_launches_nothing_on_the_trace_device():
    good = check_layer('type: "TanH"', [X], np.tanh, devices=["trace"])
    assert "every bottom off: no work" in [c.subject for c in good.checks]
    bad = check_layer('type: "BatteryTanHIgnoresPropagateDown"', [X], devices=["trace"],
                      strict=False)
    (row,) = [c for c in bad.failures if c.subject == "every bottom off: no work"]
    assert row.name == "propagate_down" and "backward launched 5 operations" in row.detail
