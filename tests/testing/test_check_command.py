"""`unroll check` bounded and safe: every size it is given is refused past its limit in one
line, a --reference is a module's dotted name, a reference that exits or raises fails the
check, and an exception inside a check is reported as the cause (docs/design.md, 8. Trust)."""

import sys

import pytest

from tests.cli_helpers import one_line_error
from unroll.engine.layer import register_layer
from unroll.engine.layers.neuron import TanHLayer
from unroll.frontend.template import builtin_template_dir
from unroll.testing import check_template
from unroll.testing.references import rnn_step
from unroll.testing.template_battery import LIMITS
from unroll.tools.cli import main

RNN = ["check", "rnn", "--set", "hidden=2", "--set", "steps=2", "--set", "batch=2"]

REFERENCES = """
import sys

def exits(x, states, params):
    sys.exit(0)

def raises(x, states, params):
    raise RuntimeError("no equation yet")

def not_a_pair(x, states, params):
    return 3
"""


@pytest.fixture
def references(tmp_path, monkeypatch):
    """A module `refs` in the current folder, as a user's references are."""
    (tmp_path / "refs.py").write_text(REFERENCES)
    (tmp_path / "import_raises.py").write_text("1 / 0\n")
    (tmp_path / "import_exits.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))


@pytest.mark.parametrize("setting, message", [
    ("steps=1000000", f"steps=1000000 is over the battery's limit of {LIMITS['steps']} "
                      f"(LIMITS['steps'])"),
    ("batch=10000000", f"batch=10000000 is over the battery's limit of {LIMITS['batch']} "
                       f"(LIMITS['batch'])"),
    ("input_dim=100000", "input_dim=100000 is over the battery's limit"),
    ("hidden=100000", "hidden=100000 is over the battery's limit of "
                      f"{LIMITS['state size']} (LIMITS['state size'])"),
    ("directions=1000", "directions=1000 is over the battery's limit"),
    ("steps=0", f"steps=0: expected a whole number from 1 to {LIMITS['steps']}"),
    ("steps=-3", "steps=-3: expected a whole number from 1"),
    ("batch=0", f"batch=0: expected a whole number from 1 to {LIMITS['batch']}"),
    ("batch=-1", "batch=-1: expected a whole number from 1"),
    ("hidden=0", "hidden=0: expected a whole number from 1"),
    ("steps=2.5", "steps=2.5: expected a whole number"),
    ("steps=True", "steps=True: expected a whole number"),
    ("seed=x", "seed='x': expected a whole number >= 0"),
    ("strict=True", "--set strict: not a template variable, and not one of the battery "
                    "options --set takes (steps, batch, input_dim, directions, seed)"),
    ("devices=['gpu']", "--set devices: not a template variable"),
])
def test_every_size_and_option_is_refused_in_one_line(setting, message, capsys):
    assert main(["check", "rnn", "--set", "hidden=2", "--set", setting]) == 2
    one_line_error(capsys, "unroll check: error: ", message)


def test_the_library_refuses_the_same_sizes():
    with pytest.raises(ValueError, match=r"steps=0: expected a whole number from 1"):
        check_template("rnn", steps=0, hidden=2)
    with pytest.raises(ValueError, match=rf"batch=100 is over the battery's limit of "
                                         rf"{LIMITS['batch']}"):
        check_template("rnn", batch=100, hidden=2)


@pytest.mark.parametrize("reference, message", [
    ("../../etc/passwd:x", "--reference '../../etc/passwd:x': expected a module's dotted name, "
                           "found '../../etc/passwd'"),
    (".refs:exits", "expected a module's dotted name, found '.refs'"),
    ("/etc/passwd:x", "expected a module's dotted name, found '/etc/passwd'"),
    ("refs.py:exits", "cannot import module 'refs.py'"),
    ("import_raises:f", "importing module 'import_raises' raised ZeroDivisionError: division by "
                        "zero (at import_raises.py:1 in <module>)"),
    ("import_exits:f", "importing module 'import_exits' called sys.exit(3)"),
    ("refs:missing", "module 'refs' has no 'missing'"),
])
def test_a_bad_reference_is_refused_in_one_line(reference, message, references, capsys):
    assert main([*RNN, "--reference", reference]) == 2
    one_line_error(capsys, "unroll check: error: ", message)


@pytest.mark.parametrize("name, cause", [
    ("exits", "raised ReferenceExited: the reference refs:exits called sys.exit(0) (at refs.py:5 "
              "in exits)"),
    ("raises", "raised RuntimeError: no equation yet (at refs.py:8 in raises)"),
    ("not_a_pair", "raised TypeError: reference_step returned 3; expected (outputs, states), "
                   "two dicts of arrays"),
])
def test_a_reference_that_exits_or_raises_fails_the_check(name, cause, references, capsys):
    assert main([*RNN, "--reference", f"refs:{name}"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("battery of template 'rnn.prototxt.j2'")
    assert "FAIL  cpu    forward vs reference" in out
    failed = [line for line in out.splitlines() if line.startswith("- forward vs reference")]
    assert failed and all(cause in line for line in failed), failed
    assert "hint: the unrolled forward disagrees" not in out  # the reference is the cause


def test_a_layer_reference_that_exits_fails_the_check(references, tmp_path, capsys):
    net = tmp_path / "one.prototxt"
    net.write_text('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 3 '
                   'dim: 4 } } }\nlayer { name: "act" type: "TanH" bottom: "x" top: "y" }\n')
    (tmp_path / "layer_refs.py").write_text("import sys\ndef tanh(x):\n    sys.exit(0)\n")
    assert main(["check", str(net), "--reference", "layer_refs:tanh"]) == 1
    out = capsys.readouterr().out
    assert ("- forward vs reference [cpu] tops: raised ReferenceExited: the reference "
            "layer_refs:tanh called sys.exit(0) (at layer_refs.py:3 in tanh)") in out


@register_layer("BatteryTanHBackwardRaises")
class TanHBackwardRaises(TanHLayer):
    """A bug that raises in backward, as a wrong blob name in a step's equation does."""

    def backward(self, tops, propagate_down, bottoms):
        raise KeyError("fh_t2")


def test_an_exception_inside_a_check_is_reported_as_its_cause(tmp_path):
    text = (builtin_template_dir() / "rnn.prototxt.j2").read_text()
    path = tmp_path / "rnn_raises.prototxt.j2"
    path.write_text(text.replace('type: "TanH"', 'type: "BatteryTanHBackwardRaises"'))
    report = check_template(path, rnn_step, steps=4, batch=2, hidden=2, devices=["cpu"],
                            configs=["forward"], strict=False)
    assert report.failures
    for check in report.failures:  # the layer, the error, and the line that raised it
        assert check.detail.startswith("raised NetError: layer 'tanh_t"), check.detail
        assert "failed in backward: KeyError: 'fh_t2'" in check.detail
        line = TanHBackwardRaises.backward.__code__.co_firstlineno + 1
        assert check.detail.endswith(f"(at test_check_command.py:{line} in backward)")
        assert check.hint == ""
    # forward-only checks pass: the gating failures are the checks that ran backward
    passed = {c.name for c in report.checks if c.passed}
    assert {"cont: state reset at cont 0", "cont: packed equals alone"} <= passed
    assert "cont: no gradient across a boundary" in report.caught_by()
    assert "hint:" not in report.failure_message()
