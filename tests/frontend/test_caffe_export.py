"""Export to BVLC Caffe: only Caffe's layer types, lowerings that compute the same function.

A lowered net runs in unroll's own engine against the net it came from, on
the same weights, forward and backward in float64 (design: "Correctness
discipline"); every built-in template's export holds only the layer types
real Caffe registers and the fields Caffe's proto has, and a layer Caffe
cannot express is refused, one line per layer.
"""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.net_helpers import assert_nets_agree
from unroll import NetError, expand, to_prototxt
from unroll.core.proto import NetParameter, parse_text
from unroll.engine.layer import LAYERS, Layer
from unroll.engine.net import Net
from unroll.frontend.caffe_export import (
    caffe_layer_types,
    export_for_caffe,
    unroll_only_header,
    unroll_only_types,
)
from unroll.frontend.template import load_template
from unroll.testing import builtin_templates
from unroll.tools import cli
from unroll.train.bucketing import cont_from_lengths

SHARED_TYPES = Path(__file__).resolve().parents[2].parent / "shared" / "caffe_layer_types.txt"
CELLS = builtin_templates("step")


def test_the_layer_types_are_the_list_read_off_caffe():
    if not SHARED_TYPES.is_file():
        pytest.skip(f"{SHARED_TYPES} is absent (it lives in shared/ beside the repository)")
    listed = {line for line in SHARED_TYPES.read_text().splitlines()
              if line and not line.startswith("#")}
    assert caffe_layer_types() == listed | {"ImageData", "WindowData"}
    assert not {"GRUUnit", "Scatter", "TrailingSequenceEnd"} & caffe_layer_types()


# -- the lowered nets compute the same function -----------------------------------------


def net_of(net_param):
    net_param = NetParameter.FromString(net_param.SerializeToString())
    net_param.force_backward = True  # no loss layer: the test sets the diff of h
    return Net(net_param, dtype="float64")



@st.composite
def configurations(draw):
    T, N = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    options = dict(direction=draw(st.sampled_from(["forward", "reverse", "bidirectional"])),
                   layers=draw(st.integers(1, 2)))
    align = draw(st.sampled_from(["left", "right"]))
    if draw(st.booleans()):  # many-to-one; stacked, only the top layer's last step is output
        options.update(sequence_output=False, align=align, layers=1)
    return dict(cell=draw(st.sampled_from(CELLS)), T=T, N=N, D=draw(st.integers(1, 3)),
                H=draw(st.integers(1, 3)), align=align, options=options,
                lengths=draw(st.lists(st.integers(1, T), min_size=N, max_size=N)),
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=40, deadline=None)
@given(case=configurations())
def test_the_lowered_net_equals_the_unrolled_one(case):
    T, N, D, H = case["T"], case["N"], case["D"], case["H"]
    original = expand(case["cell"], steps=T, batch=N, input_dim=D, hidden=H, **case["options"])
    lowered, _ = export_for_caffe(original)
    assert {lp.type for lp in lowered.layer} <= caffe_layer_types()
    a, b = net_of(original), net_of(lowered)
    assert sorted(a.outputs) == sorted(b.outputs)
    # the same params, by name and shape, in the same order: weight sharing is kept
    assert_nets_agree(a, b, np.random.default_rng(case["seed"]),
                      cont_from_lengths(case["lengths"], T, align=case["align"]))


@settings(max_examples=15, deadline=None)
@given(T=st.integers(1, 3), N=st.integers(1, 2), C=st.integers(1, 3),
       columns=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_the_lowered_scatter_equals_the_taggers_scatter(T, N, C, columns, seed):
    """The character tagger, whose Scatter the export turns into a gather."""
    original = expand("tagger", steps=T, batch=N, vocab=5, tags=3, embed=2, hidden=2,
                      char_columns=columns,
                      chars={"vocab": 4, "embed": 2, "hidden": 2, "length": C})
    lowered, _ = export_for_caffe(original)
    assert {lp.type for lp in lowered.layer} <= caffe_layer_types()
    a, b = (Net(n, dtype="float64") for n in (original, lowered))
    rng = np.random.default_rng(seed)
    params = {p.name: p for p in b.learnable_params}
    for p in a.learnable_params:
        p.blob.data[...] = params[p.name].blob.data[...] = rng.uniform(-1, 1, p.blob.shape)
    frozen = [p for p in b.learnable_params if p.lr_mult == 0]
    assert len(frozen) == len(params) - len(a.learnable_params) == 4
    cells, slots = T * N, C * columns
    at = np.full(slots, -1.0)  # distinct cells at some slots, -1 (no word ends here) elsewhere
    words = rng.choice(slots, size=rng.integers(0, min(cells, slots) + 1), replace=False)
    at[words] = rng.choice(cells, size=len(words), replace=False)
    inputs = dict(words=rng.integers(0, 5, (T, N)), cont=rng.integers(0, 2, (T, N)),
                  labels=rng.integers(0, 3, (T, N)), chars_fw=rng.integers(0, 4, (C, columns)),
                  chars_bw=rng.integers(0, 4, (C, columns)),
                  chars_cont=rng.integers(0, 2, (C, columns)), chars_at=at.reshape(C, columns))
    results = []
    for net in (a, b):
        out = {k: v.copy() for k, v in net.forward(**inputs).items()}
        net.clear_param_diffs()
        net.backward()
        results.append((out, {p.name: p.blob.diff.copy() for p in net.learnable_params}))
    (out_a, grad_a), (out_b, grad_b) = results
    assert out_a.keys() == out_b.keys()
    for name in out_a:
        np.testing.assert_allclose(out_b[name], out_a[name], rtol=1e-12, atol=1e-13)
    for name, diff in grad_a.items():
        np.testing.assert_allclose(grad_b[name], diff, rtol=1e-10, atol=1e-12, err_msg=name)


def dot_attention(S, N, H) -> NetParameter:
    """Luong's dot attention over a memory, in BatchMatMul: scores, softmax over S, context."""
    return parse_text(f"""
      force_backward: true
      layer {{ name: "in" type: "Input" top: "memory" top: "query" top: "target"
              input_param {{ shape {{ dim: {S} dim: {N} dim: {H} }} shape {{ dim: {N} dim: {H} }}
                            shape {{ dim: {N} dim: {H} }} }} }}
      layer {{ name: "scores" type: "BatchMatMul" bottom: "memory" bottom: "query"
              top: "scores" }}
      layer {{ name: "weights" type: "Softmax" bottom: "scores" top: "weights"
              softmax_param {{ axis: 0 }} }}
      layer {{ name: "context" type: "BatchMatMul" bottom: "weights" bottom: "memory"
              top: "context" }}
      layer {{ name: "loss" type: "EuclideanLoss" bottom: "context" bottom: "target"
              top: "loss" }}""", NetParameter())


@settings(max_examples=10, deadline=None)
@given(S=st.integers(1, 4), N=st.integers(1, 3), H=st.integers(1, 3), seed=st.integers(0, 99))
def test_the_lowered_batch_matmul_equals_it(S, N, H, seed):
    original = dot_attention(S, N, H)
    lowered, notes = export_for_caffe(original)
    assert {lp.type for lp in lowered.layer} <= caffe_layer_types()
    assert fields_set(lowered) - caffe_fields() == set()
    assert [n.split()[1] for n in notes] == ["BatchMatMul"]
    rng = np.random.default_rng(seed)
    inputs = {name: rng.uniform(-1, 1, shape) for name, shape in
              (("memory", (S, N, H)), ("query", (N, H)), ("target", (N, H)))}
    results = []
    for net in (Net(original, dtype="float64"), Net(lowered, dtype="float64")):
        loss = float(net.forward(**inputs)["loss"])
        net.backward()
        results.append((loss, {k: net.blobs[k].diff.copy() for k in ("memory", "query")}))
    (loss_a, grad_a), (loss_b, grad_b) = results
    assert loss_b == pytest.approx(loss_a, rel=1e-12, abs=1e-14)
    for name, diff in grad_a.items():
        np.testing.assert_allclose(grad_b[name], diff, rtol=1e-10, atol=1e-12, err_msg=name)


def test_lowering_replaces_exactly_the_unroll_only_layers():
    original = expand("gru", steps=3, batch=2, input_dim=2, hidden=2, sequence_output=False,
                      align="right")
    assert unroll_only_types(original) == ["GRUUnit", "TrailingSequenceEnd"]
    lowered, notes = export_for_caffe(original)
    assert unroll_only_types(lowered) == []
    assert [n.split()[1] for n in notes] == ["GRUUnit", "TrailingSequenceEnd"]
    kept = [lp for lp in original.layer if lp.type in caffe_layer_types()]
    assert all(lp in lowered.layer for lp in kept)
    assert unroll_only_types(original) == ["GRUUnit", "TrailingSequenceEnd"]  # unchanged


# -- every built-in template -------------------------------------------------------------

#: the variables of each built-in net template, in the configurations exported
NET_TEMPLATES = {
    "tagger": [dict(vocab=7, tags=3, embed=4, hidden=3),
               dict(vocab=7, tags=3, embed=4, hidden=3, cell="gru", layers=2),
               dict(vocab=7, tags=3, embed=4, hidden=3, features={"suffix": [5, 2]},
                    chars={"vocab": 6, "embed": 3, "hidden": 2, "length": 4})],
    "siamese": [dict(input_dim=3, hidden=4, embed=2)],
}
STEP_OPTIONS = [dict(), dict(direction="bidirectional", layers=2),
                dict(sequence_output=False, align="left"),
                dict(sequence_output=False, align="right", direction="reverse"),
                dict(initial_state="learned"), dict(expose_hidden=True)]


def export_cases():
    for name in builtin_templates():
        kind = load_template(name).kind
        if kind == "step":
            for options in STEP_OPTIONS:
                yield name, dict(input_dim=3, hidden=2, **options)
        elif kind == "net":
            for variables in NET_TEMPLATES.get(name, [None]):
                yield name, variables


@pytest.mark.parametrize("name, variables", list(export_cases()))
def test_every_builtin_template_exports_only_caffe_layer_types(name, variables):
    assert variables is not None, f"net template '{name}' needs an entry in NET_TEMPLATES"
    net_param = expand(name, steps=3, batch=2, **variables)
    text = to_prototxt(net_param, caffe=True)
    exported = parse_text(text, NetParameter())
    assert {lp.type for lp in exported.layer} <= caffe_layer_types()
    Net(exported)  # and unroll builds what it wrote


SHARED_FIELDS = SHARED_TYPES.parent / "caffe_fields.txt"
#: fields of Caffe's that caffe_fields.txt leaves out (tests/core/test_proto.py:
#: BEYOND_CAFFE_FIELDS)
BEYOND_LISTED_FIELDS = {
    ("LayerParameter", "power_param"), ("PowerParameter", "power"), ("PowerParameter", "scale"),
    ("PowerParameter", "shift"), ("LayerParameter", "reduction_param"),
    ("ReductionParameter", "operation"), ("ReductionParameter", "axis"),
    ("ReductionParameter", "coeff"), ("LayerParameter", "tile_param"), ("TileParameter", "axis"),
    ("TileParameter", "tiles")}


def caffe_fields() -> set:
    """(message, field) of every field caffe_fields.txt lists, read off BVLC caffe.proto."""
    fields, message = set(BEYOND_LISTED_FIELDS), None
    for line in SHARED_FIELDS.read_text().splitlines():
        words = line.split()
        if line.startswith("message "):
            message = words[1]
        elif words and words[0] in ("optional", "repeated", "required"):
            fields.add((message, words[2]))
    return fields


def fields_set(message) -> set:
    """(message, field) of every field set in ``message`` and the messages inside it."""
    found = set()
    for field, value in message.ListFields():
        found.add((message.DESCRIPTOR.name, field.name))
        if field.message_type is not None:
            for item in value if field.is_repeated else [value]:
                found |= fields_set(item)
    return found


@pytest.mark.parametrize("name, variables", list(export_cases()))
def test_exported_nets_set_only_fields_caffe_has(name, variables):
    if not SHARED_FIELDS.is_file():
        pytest.skip(f"{SHARED_FIELDS} is absent (it lives in shared/ beside the repository)")
    exported = parse_text(to_prototxt(expand(name, steps=2, batch=2, **variables), caffe=True),
                          NetParameter())
    assert fields_set(exported) - caffe_fields() == set()


def test_module_templates_are_not_nets():
    kinds = {name: load_template(name).kind for name in builtin_templates()}
    assert set(kinds.values()) <= {"step", "net", "module", "tree_step"}
    assert set(NET_TEMPLATES) == {n for n, k in kinds.items() if k == "net"}


class SquareLayer(Layer):
    """y = x ** 2: a layer type of a user's own, which Caffe lacks."""

    def reshape(self, bottoms, tops):
        tops[0].reshape(bottoms[0].shape)

    def forward(self, bottoms, tops):
        tops[0].data[...] = bottoms[0].data ** 2

    def backward(self, tops, propagate_down, bottoms):
        bottoms[0].diff[...] = 2 * bottoms[0].data * tops[0].diff


def test_a_refusal_is_one_line_per_layer_saying_why(monkeypatch):
    monkeypatch.setitem(LAYERS, "ExportSquare", SquareLayer)
    net_param = expand("gru", steps=2, input_dim=1, hidden=1)
    net_param.layer.add(name="sq", type="ExportSquare", bottom=["h"], top=["h2"])
    net_param.layer.add(name="mine", type="NoSuchType", bottom=["h2"], top=["h3"])
    with pytest.raises(NetError) as e:
        export_for_caffe(net_param)
    assert str(e.value).splitlines() == [
        "cannot export net 'gru_T2' to BVLC Caffe: 2 layer(s) have no form in Caffe's layers:",
        "  layer 'sq' (ExportSquare): a layer type of unroll's own (registered by "
        "@register_layer) that BVLC Caffe lacks, with no lowering to Caffe's layers;",
        "  layer 'mine' (NoSuchType): a layer type that neither BVLC Caffe nor unroll knows",
    ]


def test_a_lowering_that_would_drop_a_field_is_refused():
    net_param = expand("gru", steps=1, input_dim=1, hidden=1)
    unit = next(lp for lp in net_param.layer if lp.type == "GRUUnit")
    unit.loss_weight.append(1.0)
    with pytest.raises(NetError, match=rf"layer '{unit.name}' \(GRUUnit\): sets loss_weight"):
        export_for_caffe(net_param)


# -- the header of plain output, and the command -----------------------------------------


def test_plain_prototxt_names_its_unroll_only_types_in_a_comment():
    gru = expand("gru", steps=2, input_dim=1, hidden=2, sequence_output=False, align="left")
    text = to_prototxt(gru)
    assert text.startswith("# unroll-only layer types (BVLC Caffe lacks them): GRUUnit, "
                           "LeadingSequenceEnd\n")
    assert parse_text(text, NetParameter()) == gru
    lstm = expand("lstm", steps=2, input_dim=1, hidden=2)
    assert unroll_only_header(lstm) == "" and not to_prototxt(lstm).startswith("#")


def test_expand_caffe_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "gru.prototxt"
    args = ["expand", "gru", "--steps", "3", "--set", "input_dim=2", "--set", "hidden=2"]
    assert cli.main([*args, "--caffe", "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# for BVLC Caffe")
    assert {lp.type for lp in parse_text(text, NetParameter()).layer} <= caffe_layer_types()
    assert cli.main(args) == 0
    assert capsys.readouterr().out.startswith("# unroll-only layer types")


SQUARE_CELL = """\
{% set interface = {"kind": "step", "inputs": ["x"], "states": {"h": "hidden"},
                    "outputs": ["h"], "defaults": {"hidden": none}} %}
{% macro step(s) %}
layer { name: "{{ s.layer('h_cont') }}" type: "Scale" bottom: "{{ s.prev.h }}"
        bottom: "{{ s.cont }}" top: "{{ s.blob('h_cont') }}" scale_param { axis: 0 } }
layer { name: "{{ s.layer('sq') }}" type: "ExportSquare" bottom: "{{ s.blob('h_cont') }}"
        top: "{{ s.blob('sq') }}" }
layer { name: "{{ s.layer('h') }}" type: "Eltwise" bottom: "{{ s.input.x }}"
        bottom: "{{ s.blob('sq') }}" top: "{{ s.state.h }}" }
{% endmacro %}
"""


def test_expand_caffe_refusal_is_one_line_and_exit_status_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(LAYERS, "ExportSquare", SquareLayer)
    (tmp_path / "square.prototxt.j2").write_text(SQUARE_CELL)
    status = cli.main(["expand", "square", "--template-dir", str(tmp_path), "--steps", "2",
                       "--set", "input_dim=2", "--set", "hidden=2", "--caffe"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1
    assert err.startswith("unroll expand: error: cannot export net 'square_T2' to BVLC Caffe: "
                          "2 layer(s)")
    assert "layer 'sq_t0' (ExportSquare): a layer type of unroll's own" in err
    assert "; layer 'sq_t1' (ExportSquare)" in err
