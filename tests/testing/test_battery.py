"""The batteries on every built-in layer and step template, the strategies, `unroll check`.

Every registered layer type and every built-in step template has a battery
entry with a NumPy reference (unroll.testing.references): a new one without
an entry fails here. Correct layers and templates pass with no false alarm
over hypothesis examples, in float32 and float64 (the float32 check runs in
every battery).
"""

import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unroll import testing
from unroll.engine.layer import LAYERS
from unroll.frontend.unroller import expand, load_template
from unroll.testing.references import LAYER_CASES, STEP_REFERENCES, sigmoid
from unroll.tools.cli import main

BUILT_IN_LAYERS = sorted(t for t, cls in LAYERS.items() if cls.__module__.startswith("unroll."))
TEMPLATES = testing.builtin_templates()
STEP_TEMPLATES = testing.builtin_templates("step")


def test_every_registered_layer_type_has_a_battery_entry_with_a_reference():
    missing = [t for t in BUILT_IN_LAYERS if t not in LAYER_CASES]
    assert missing == [], f"layer types without a battery entry in references.py: {missing}"
    assert all(any(c.reference is not None for c in LAYER_CASES[t]) for t in BUILT_IN_LAYERS)
    assert sorted(LAYER_CASES) == BUILT_IN_LAYERS  # no entry for a type that is gone


def test_every_built_in_template_is_covered():
    """Step templates by a reference step; net and module templates by their layers' entries."""
    assert [t for t in STEP_TEMPLATES if t not in STEP_REFERENCES] == []
    for name in set(TEMPLATES) - set(STEP_TEMPLATES):
        kind = load_template(name).kind
        if kind == "module":
            continue  # applied by the net templates below, whose layers it is part of
        if kind == "tree_step":
            continue  # against its per-node NumPy reference: tests/frontend/test_tree_unroller.py
        defaults = {"tagger": dict(vocab=7, tags=3), "siamese": dict(input_dim=3, hidden=4,
                                                                     embed=2)}[name]
        types = {lp.type for lp in expand(name, steps=2, **defaults).layer}
        assert types <= set(LAYER_CASES), (name, types - set(LAYER_CASES))


CASES = [(t, k, c) for t, cases in LAYER_CASES.items() for k, c in enumerate(cases)]


@pytest.mark.parametrize("case", [c for _, _, c in CASES], ids=[f"{t}-{k}" for t, k, _ in CASES])
def test_every_built_in_layer_passes_its_battery(case):
    report = testing.check_layer(case.spec, case.inputs, case.reference, **case.options)
    names = {c.name for c in report.checks}
    assert "bottoms unchanged" in names or not case.inputs
    if case.reference is not None:
        assert "forward vs reference" in names


@pytest.mark.parametrize("name", STEP_TEMPLATES)
def test_every_built_in_step_template_passes_its_battery(name):
    report = testing.check_template(name, STEP_REFERENCES[name], hidden=3, steps=4, batch=2,
                                    configs=["forward", "reverse", "bidirectional", "stacked"])
    names = {c.name for c in report.checks}
    assert {"forward vs reference", "cont: state reset at cont 0", "cont: packed equals alone",
            "cont: no gradient across a boundary", "backward vs central differences",
            "param diffs accumulate", "float32 vs float64"} <= names
    assert {c.device for c in report.checks} == set(testing.available_devices())


ELEMENTWISE = {"TanH": np.tanh, "Sigmoid": sigmoid,
               "ReLU": lambda x: np.where(x > 0, x, 0.2 * x)}


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(sorted(ELEMENTWISE)),
       x=testing.arrays(testing.shapes(max_dims=3), low=-4, high=4, away_from=[0.0]))
def test_no_false_alarm_on_elementwise_layers(kind, x):
    spec = f'type: "{kind}"' + (" relu_param { negative_slope: 0.2 }" if kind == "ReLU" else "")
    testing.check_layer(spec, [x], ELEMENTWISE[kind], devices=["cpu"])


@settings(max_examples=20, deadline=None)
@given(x=testing.arrays(testing.shapes(min_dims=2, max_dims=3, max_side=5)),
       outputs=st.integers(1, 5), bias=st.booleans())
def test_no_false_alarm_on_inner_product_and_softmax(x, outputs, bias):
    spec = (f'type: "InnerProduct" inner_product_param {{ num_output: {outputs} '
            f'bias_term: {str(bias).lower()} weight_filler {{ type: "gaussian" std: 1 }} '
            f'bias_filler {{ type: "gaussian" std: 1 }} }}')

    def reference(x, W, b=0.0):
        return x.reshape(len(x), -1) @ W.T + b

    testing.check_layer(spec, [x], reference, devices=["cpu"], directions=2)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    testing.check_layer('type: "Softmax"', [x], lambda x: e / e.sum(axis=1, keepdims=True),
                        devices=["cpu"])


@settings(max_examples=8, deadline=None)
@given(variables=testing.step_variables(max_hidden=3, max_steps=4, max_batch=2),
       cell=st.sampled_from(["rnn", "gru", "lstm"]), data=st.data())
def test_no_false_alarm_on_templates_over_drawn_variables_and_cont(variables, cell, data):
    T, N = variables["steps"], variables["batch"]
    conts = [data.draw(testing.cont_patterns(T, N)) for _ in range(2)]
    config = {"forward": "forward", "reverse": "reverse",
              "bidirectional": "bidirectional"}[variables["direction"]]
    configs = [config] + (["stacked"] if variables["layers"] == 2 else [])
    testing.check_template(cell, STEP_REFERENCES[cell], steps=T, batch=N,
                           input_dim=variables["input_dim"], hidden=variables["hidden"],
                           conts=conts + [testing.cont_pattern("packed", T, N)],
                           configs=configs, devices=["cpu"])


# -- the strategies -------------------------------------------------------------------


@given(cont=testing.cont_patterns(st.integers(1, 6), st.integers(1, 3)))
def test_cont_patterns_are_caffe_masks(cont):
    assert cont.ndim == 2 and set(np.unique(cont)) <= {0.0, 1.0}


@pytest.mark.parametrize("kind", testing.CONT_KINDS)
def test_each_cont_pattern_kind(kind):
    cont = testing.cont_pattern(kind, 8, 4, seed=2)
    if kind in ("ones", "zeros"):
        assert (cont == (kind == "ones")).all()
        return
    assert (cont[0] == 0).all()  # every column starts a sequence (or padding)
    for n in range(4):
        column = cont[:, n].tolist()
        starts = [t for t, c in enumerate(column) if c == 0]
        if kind == "packed":
            assert len(starts) >= 2  # more than one sequence in the column
            continue
        run = [t for t, c in enumerate(column) if c == 1]
        if run:  # one sequence of length > 1: its start, then ones, in one block
            assert run == list(range(run[0], run[-1] + 1)) and run[0] - 1 in starts
            if kind == "padded_left":
                assert run[-1] == 7  # the padding comes first: the sequence ends the column
            else:
                assert run[0] == 1  # the sequence starts the column, the padding after it
    with pytest.raises(ValueError, match="unknown cont pattern"):
        testing.cont_pattern("sideways", 3, 1)


# -- unroll check -----------------------------------------------------------------------

CELLS_MODULE = """
import numpy as np

def gated(x, states, params):
    h = np.tanh(x @ params["W_xh"].T + params["b_h"] + states["h"] @ params["W_hh"].T)
    return {"h": h}, {"h": h}

def wrong(x, states, params):
    h = np.tanh(x @ params["W_xh"].T + states["h"] @ params["W_hh"].T)  # b_h forgotten
    return {"h": h}, {"h": h}
"""


def test_unroll_check_passes_a_correct_template_and_prints_the_table(tmp_path, monkeypatch,
                                                                      capsys):
    (tmp_path / "mycells.py").write_text(CELLS_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["check", "rnn", "--reference", "mycells:gated", "--set", "hidden=3",
                 "--set", "steps=3"]) == 0
    out = capsys.readouterr().out
    assert "battery of template 'rnn.prototxt.j2'" in out and "FAIL" not in out
    for check in ("forward vs reference", "cont: packed equals alone",
                  "backward vs central differences", "float32 vs float64"):
        assert f"PASS  cpu    {check}" in out


def test_unroll_check_exits_1_naming_the_check_and_the_hint(tmp_path, monkeypatch, capsys):
    (tmp_path / "mycells.py").write_text(CELLS_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["check", "rnn", "--reference", "mycells:wrong", "--set", "hidden=3",
                 "--set", "steps=3"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  cpu    forward vs reference" in out
    assert ("- forward vs reference [cpu] h (forward, cont ones): h (forward, cont ones) entry"
            in out)
    assert "net " in out and "reference " in out
    assert "hint: the unrolled forward disagrees with the reference step" in out


def test_unroll_check_on_a_layer_prototxt(tmp_path, capsys):
    net = tmp_path / "one.prototxt"
    net.write_text(textwrap.dedent("""
        layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 3 dim: 4 } } }
        layer { name: "act" type: "TanH" bottom: "x" top: "y" }
    """))
    assert main(["check", str(net), "--reference", "numpy:tanh"]) == 0
    out = capsys.readouterr().out
    assert "battery of layer 'act' (TanH)" in out and "PASS  trace" in out


@pytest.mark.parametrize("argv, message", [
    (["check", "rnn", "--reference", "nowhere_at_all:step", "--set", "hidden=2"],
     "cannot import module 'nowhere_at_all'"),
    (["check", "rnn", "--reference", "numpy", "--set", "hidden=2"], "expected module:function"),
    (["check", "rnn", "--reference", "numpy:no_such_thing", "--set", "hidden=2"],
     "module 'numpy' has no 'no_such_thing'"),
    (["check", "rnn", "--set", "hiden=2"], "did you mean 'hidden'"),
    (["check", "rnn", "--set", "hidden=2", "--set", "direction=reverse"],
     "direction is chosen by configs="),
])
def test_unroll_check_refuses_bad_arguments_with_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("unroll check: error: ") and message in err


# -- attention: static inputs in the battery --------------------------------------------------


@pytest.mark.parametrize("score", ["general", "concat"])
@pytest.mark.parametrize("name", ["lstm_attention", "lstm_attention_feed"])
def test_attention_steps_pass_their_battery_for_every_score(name, score):
    report = testing.check_template(name, STEP_REFERENCES[name], hidden=3, steps=4, batch=2,
                                    score=score, configs=["forward", "stacked"],
                                    devices=["cpu"])
    checked = {c.subject.split(" (")[0] for c in report.checks
               if c.name == "backward vs central differences"}
    assert {"memory", "memory_mask", "x"} <= checked  # a static input's diff sums the steps'
    assert {"W_c", "W_a" if score == "general" else "v_a"} <= checked


def test_the_battery_catches_an_attention_that_ignores_the_mask():
    def unmasked(x, states, params, static):
        return STEP_REFERENCES["lstm_attention"](
            x, states, params, {**static, "memory_mask": 0 * static["memory_mask"]})

    report = testing.check_template("lstm_attention", unmasked, hidden=3, steps=3, batch=2,
                                    configs=["forward"], devices=["cpu"], strict=False)
    failed = {c.name for c in report.checks if not c.passed}
    assert failed == {"forward vs reference"}
