"""The ``unroll`` command, run in-process through main(argv) and once as the console script."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.cli_helpers import one_line_error
from tests.hang import limit
from unroll.core.proto import NetParameter, parse_text
from unroll.engine.net import Net
from unroll.frontend.template import builtin_template_dir
from unroll.frontend.unroller import expand
from unroll.testing import builtin_templates
from unroll.testing.template_battery import LIMITS
from unroll.tools import cli
from unroll.tools.commands import COMMANDS
from unroll.tools.commands.arguments import parse_value
from unroll.tools.commands.help_text import KIND_WORDS

LSTM5 = ["expand", "lstm", "--steps", "5", "--set", "batch=2", "--set", "input_dim=3",
         "--set", "hidden=4"]



def test_expand_writes_a_net_that_loads_and_runs(tmp_path, capsys):
    out = tmp_path / "f.prototxt"
    assert cli.main([*LSTM5, "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    summary = captured.err.strip()
    assert len(summary.splitlines()) == 1
    for part in ("layers", "blobs", "3 learnable params", "values", "KiB", str(out)):
        assert part in summary
    net = Net(str(out), dtype="float64")
    h = net.forward(x=np.ones((5, 2, 3)), cont=np.ones((5, 2)))["h"]
    assert h.shape == (5, 2, 4)


def test_expand_to_stdout_equals_the_library(capsys):
    assert cli.main([*LSTM5, "--set", "direction=bidirectional", "--set", "layers=2"]) == 0
    captured = capsys.readouterr()
    printed = parse_text(captured.out, NetParameter())
    assert printed == expand("lstm", steps=5, batch=2, input_dim=3, hidden=4,
                             direction="bidirectional", layers=2)
    assert "written to stdout" in captured.err


def test_set_values_are_python_literals_where_possible(tmp_path, capsys):
    out = tmp_path / "tagger.prototxt"
    argv = ["expand", "tagger", "-T", "4", "--set", "batch=3", "--set", "vocab=30",
            "--set", "tags=5", "--set", "embed=6", "--set", "hidden=2",
            "--set", 'features={"suffix": [50, 8]}', "--set", "dropout=0.25",
            "--set", "cell=gru", "-o", str(out)]
    assert cli.main(argv) == 0
    net = Net(str(out))
    shapes = {p.name: p.blob.shape for p in net.learnable_params}
    assert shapes["E_suffix"] == (50, 8)
    assert "fw_W_h" in shapes  # the gru cell was used
    assert "dropout_ratio: 0.25" in out.read_text()


@pytest.mark.parametrize("text, value", [
    ("4", 4), ("-0.5", -0.5), ("1e-3", 1e-3), ("True", True), ("false", False),
    ("none", None), ("[50, 8]", [50, 8]), ("{'a': (1, 2)}", {"a": (1, 2)}),
    ("bidirectional", "bidirectional"), ("xavier", "xavier"), ("08", "08"), ("", ""),
])
def test_parse_value(text, value):
    assert parse_value(text) == value


def test_bad_template_exits_2_with_one_line(capsys):
    assert cli.main(["expand", "lstn", "--steps", "3"]) == 2
    line = one_line_error(capsys, "'lstn'")
    assert "lstm" in line and "gru" in line


def test_template_errors_exit_2(tmp_path, capsys):
    assert cli.main(["expand", "lstm", "--steps", "3", "--set", "input_dim=2"]) == 2
    one_line_error(capsys, "hidden")
    assert cli.main([*LSTM5, "--set", "layers=two"]) == 2
    one_line_error(capsys, "layers")
    bad = tmp_path / "bad.prototxt.j2"
    bad.write_text('{% set interface = {"kind": "net"} %}\n'
                   'layer { name: "x" type: "NoSuchLayer" top: "x" }\n')
    assert cli.main(["expand", "bad", "--template-dir", str(tmp_path), "--steps", "2"]) == 2
    one_line_error(capsys, "NoSuchLayer")  # a NetError from building the net
    assert cli.main([*LSTM5, "-o", str(tmp_path / "missing" / "f.prototxt")]) == 2
    one_line_error(capsys, "missing")


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["expand", "lstm", "--steps", "3", "--set", "hidden"])
    assert e.value.code == 2
    assert "key=value" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2


@pytest.mark.parametrize("argv", [["--help"], ["expand", "--help"], ["draw", "--help"]])
def test_help_has_examples(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "unroll " + (argv[0] if len(argv) > 1 else "expand") in out


def help_of(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", [c.__name__.rsplit(".", 1)[1] for c in COMMANDS])
def test_every_subcommand_module_is_a_subcommand_with_help(command, capsys):
    assert f"usage: unroll {command} " in help_of(capsys, command)
    assert f"    {command} " in help_of(capsys)


def test_help_lists_every_built_in_template_by_kind(capsys):
    for argv in ([], ["expand"]):
        out = help_of(capsys, *argv)
        listed = []
        for kind, words in KIND_WORDS.items():
            line = next(line for line in out.splitlines() if line.startswith(f"  {words}: "))
            assert line.split(": ", 1)[1].split(", ") == builtin_templates(kind)
            listed += builtin_templates(kind)
        assert sorted(listed) == builtin_templates()  # a kind without words would be missing
    check = help_of(capsys, "check")
    assert f"  step templates: {', '.join(builtin_templates('step'))}" in check
    assert f"steps 1 to {LIMITS['steps']}, batch 1 to {LIMITS['batch']}" in check


def test_help_lists_a_new_built_in_template_by_itself(tmp_path, capsys, monkeypatch):
    """A template dropped in the templates folder (here a copy of it) needs no help edit."""
    steps = sorted(["elman", *builtin_templates("step")])
    folder = tmp_path / "templates"
    shutil.copytree(builtin_template_dir(), folder)
    (folder / "elman.prototxt.j2").write_text((folder / "rnn.prototxt.j2").read_text())
    monkeypatch.setattr("unroll.testing.builtins.builtin_template_dir", lambda: folder)
    out = help_of(capsys)
    assert f"  step templates: {', '.join(steps)}" in out


# -- draw --------------------------------------------------------------------------------


@pytest.fixture
def lstm_prototxt(tmp_path):
    path = tmp_path / "lstm3.prototxt"
    assert cli.main(["expand", "lstm", "--steps", "3", "--set", "input_dim=2",
                     "--set", "hidden=2", "-o", str(path)]) == 0
    return path


def test_draw_dot_marks_shared_params(lstm_prototxt, tmp_path, capsys):
    out = tmp_path / "net.dot"
    assert cli.main(["draw", str(lstm_prototxt), "-o", str(out)]) == 0
    dot = out.read_text()
    assert dot.startswith('digraph "lstm_T3"')
    # W_hc is used by the three steps' hc layers: each names it and wears its colour
    hc = [line for line in dot.splitlines() if line.lstrip().startswith('"layer:') and
          "(InnerProduct)" in line and "hc_t" in line]
    assert len(hc) == 3
    fills = {line.split("fillcolor=")[1].split('"')[1] for line in hc}
    assert len(fills) == 1
    assert all("W_hc (shared)" in line for line in hc)
    # a legend node for the param, with a dashed edge to each of its layers
    assert '"param:W_hc" [label="shared param W_hc\\nused by 3 layers"' in dot
    assert sum('"param:W_hc" ->' in line and "dashed" in line for line in dot.splitlines()) == 3
    # W_xc is used once (the sequence projection): named, but not marked as shared
    assert '"param:W_xc"' not in dot
    assert "param: W_xc, b_c" in dot
    # edges bottom -> layer -> top
    assert '"blob:gates_t0" -> "layer:' in dot and '-> "blob:h_1"' in dot


def test_draw_to_stdout(lstm_prototxt, capsys):
    assert cli.main(["draw", str(lstm_prototxt), "--rankdir", "TB"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("digraph") and "rankdir=TB;" in out


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed")
def test_draw_svg_with_graphviz(lstm_prototxt, tmp_path, capsys):
    out = tmp_path / "net.svg"
    assert cli.main(["draw", str(lstm_prototxt), "-o", str(out)]) == 0
    svg = out.read_text()
    assert "<svg" in svg and "W_hc" in svg


def test_draw_svg_without_graphviz_writes_the_dot(lstm_prototxt, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    out = tmp_path / "net.svg"
    assert cli.main(["draw", str(lstm_prototxt), "-o", str(out)]) == 0
    assert not out.exists()
    assert (tmp_path / "net.dot").read_text().startswith("digraph")
    err = capsys.readouterr().err
    assert "not on PATH" in err and "net.dot" in err and "dot -Tsvg" in err


def test_draw_runs_dot_from_path(lstm_prototxt, tmp_path, capsys, monkeypatch):
    """The svg/png branch hands the graph to whatever `dot` is on PATH (here a stand-in)."""
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport sys\n"
                    "out = sys.argv[sys.argv.index('-o') + 1]\n"
                    "open(out, 'w').write(sys.argv[1] + '\\n' + sys.stdin.read())\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    out = tmp_path / "net.png"
    assert cli.main(["draw", str(lstm_prototxt), "-o", str(out)]) == 0
    made = out.read_text()
    assert made.startswith("-Tpng\ndigraph")
    assert capsys.readouterr().err.strip() == f"unroll draw: wrote {out}"
    fake.write_text("#!/bin/sh\necho 'Error: syntax error in line 1' >&2\nexit 1\n")
    assert cli.main(["draw", str(lstm_prototxt), "-o", str(out)]) == 2
    one_line_error(capsys, "syntax error in line 1")


def test_draw_errors_exit_2(tmp_path, lstm_prototxt, capsys):
    assert cli.main(["draw", str(tmp_path / "nothing.prototxt"), "-o", "x.dot"]) == 2
    one_line_error(capsys, "nothing.prototxt")
    bad = tmp_path / "bad.prototxt"
    bad.write_text('layer {\n  nme: "x"\n}\n')
    assert cli.main(["draw", str(bad)]) == 2
    one_line_error(capsys, "bad.prototxt:2")
    assert cli.main(["draw", str(lstm_prototxt), "-o", str(tmp_path / "net.jpeg")]) == 2
    one_line_error(capsys, ".jpeg")


def test_a_misspelled_set_key_is_an_error_with_a_suggestion(capsys):
    assert cli.main([*LSTM5, "--set", "weight_filer=gaussian"]) == 2
    one_line_error(capsys, "--set weight_filer: template 'lstm' has no variable 'weight_filer' "
                           "(did you mean weight_filler?)")
    assert cli.main(["expand", "tagger", "-T", "2", "--set", "vocab=5", "--set", "tags=3",
                     "--set", "hiden=4"]) == 2
    one_line_error(capsys, "did you mean hidden?")


def test_a_missing_template_dir_is_an_error(tmp_path, capsys):
    assert cli.main([*LSTM5, "--template-dir", str(tmp_path / "cells")]) == 2
    one_line_error(capsys, f"--template-dir {tmp_path / 'cells'}: no such folder")


def test_draw_a_prototxt_that_is_not_utf8(tmp_path, capsys):
    bad = tmp_path / "latin1.prototxt"
    bad.write_bytes('name: "caf\xe9"\n'.encode("latin-1"))
    assert cli.main(["draw", str(bad)]) == 2
    one_line_error(capsys, "latin1.prototxt:1: not UTF-8 text")


def test_failures_exit_1_and_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)  # where the atomic writer finds a full disk
    out = str(tmp_path / "lstm5.prototxt")
    assert cli.main([*LSTM5, "-o", out]) == 1
    one_line_error(capsys, f"{out}: No space left on device")
    assert not Path(out).exists()
    with pytest.raises(OSError, match="No space left"):
        cli.main([*LSTM5, "-o", out, "--debug"])


# -- the installed console script ---------------------------------------------------------


def test_console_script(tmp_path):
    script = Path(sys.executable).with_name("unroll")
    if not script.exists():
        script = shutil.which("unroll")
    if script is None:
        pytest.skip("the `unroll` console script is not installed")
    done = subprocess.run([str(script), *LSTM5], capture_output=True, text=True,
                          timeout=limit(100))
    assert done.returncode == 0, done.stderr
    assert parse_text(done.stdout, NetParameter()) == expand("lstm", steps=5, batch=2,
                                                             input_dim=3, hidden=4)
    assert "layers" in done.stderr
    done = subprocess.run([str(script), "expand", "nope", "--steps", "2"],
                          capture_output=True, text=True,
                          timeout=limit(100))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "'nope'" in done.stderr


def test_unroll_memory_budget_computes_the_report_once(tmp_path, monkeypatch, capsys):
    # docs/design.md, 6: the budget's line comes from the plan, not from a second report
    path = tmp_path / "lstm.prototxt"
    assert cli.main([*LSTM5, "-o", str(path)]) == 0
    capsys.readouterr()
    reports = []
    report = Net.memory_report
    monkeypatch.setattr(Net, "memory_report",
                        lambda self, *a, **k: reports.append(1) or report(self, *a, **k))
    assert cli.main(["memory", str(path), "--budget", "1MB"]) == 0
    out = capsys.readouterr().out
    assert len(reports) == 1
    assert out.splitlines()[-1].startswith("recomputed in backward: ")
    assert out.splitlines()[-1].endswith(" of a budget of 976.6 KiB")  # 1MB: 10**6 bytes


def test_unroll_memory_plans_an_lstm_without_importing_numba_or_jsonschema(tmp_path):
    # docs/design.md, 6: a net built to be planned never runs a kernel nor reads a JSON file,
    # and their imports were a fifth of the command's time
    path = tmp_path / "lstm.prototxt"
    assert cli.main([*LSTM5, "-o", str(path)]) == 0
    code = ("import sys; from unroll.tools import cli; "
            f"status = cli.main(['memory', {str(path)!r}, '--budget', '1MB']); "
            "print(status, sorted(m for m in ('numba', 'jsonschema') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=limit(100))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0 []"
