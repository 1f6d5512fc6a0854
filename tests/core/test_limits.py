"""Bounds on untrusted input (DESIGN.md section 8, Trust): templates render under a time and
output budget, nets refuse a memory plan they cannot hold, Python layers' failures and bad
cont values are one-line errors, and the command's output is complete or an error."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from unroll import BucketedModel, expand
from unroll.core import atomic
from unroll.core.atomic import write_atomic
from unroll.core.errors import NetError, TemplateError
from unroll.engine.layer import ALLOW_PYTHON_ENV
from unroll.engine.net import Net
from unroll.frontend.render import render_error
from unroll.frontend.render_limits import CHARS_ENV, SECONDS_ENV, bounded_rendering
from unroll.frontend.template import load_template

ROOT = Path(__file__).resolve().parents[2]


# -- templates ----------------------------------------------------------------------------

NET_HEAD = '{% set interface = {"kind": "net", "defaults": {}} %}\n'
STEP_HEAD = """{% set interface = {"kind": "step", "inputs": ["x"], "states": {"h": "hidden"},
                        "outputs": ["h"], "defaults": {"hidden": 2}} %}
"""
STEP_BODY = """{% macro step(s) %}
layer { name: "{{ s.layer('h_cont') }}" type: "Scale" scale_param { axis: 0 }
        bottom: "{{ s.prev.h }}" bottom: "{{ s.cont }}" top: "{{ s.state.h }}" }
BODY
{% endmacro %}
"""
NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}BODY{% endfor %}{% endfor %}"


def expand_text(tmp_path, text, name="bomb", steps=2):
    path = tmp_path / f"{name}.prototxt.j2"
    path.write_text(text)
    variables = {} if text.startswith(NET_HEAD) else {"input_dim": 2}
    return expand(str(path), steps=steps, **variables)


def one_line(error, where):
    message = str(error.value)
    assert "\n" not in message and message.startswith(where), message
    return message


@pytest.mark.parametrize("body, line, problem", [
    ("{% for i in range(10**9) %}{{ i }}{% endfor %}", 2,
     "range(1000000000) has 1000000000 items; the template sandbox allows at most 100000"),
    ("{{ range(10**30) | list }}", 2, "range(~2**99) has over 2**63 items"),
    ("\n{{ 1 // 0 }}", 3, "ZeroDivisionError"),
    ("{{ 10.0 ** 999 }}", 2, "OverflowError"),
    ("{{ 'x' * 10**10 }}", 2, "a value of 10000000000 items or characters passes the limit"),
    ("{{ [0] * 10**10 }}", 2, "a value of 10000000000 items or characters passes the limit"),
    ("{{ 7 ** (10**9) }}", 2, "bits; the template sandbox allows"),
    ("{{ 'x'.center(10**10) }}", 2, "a value of 10000000000 items or characters"),
    ("{{ ('a' * 100000) | replace('a', 'b' * 100000) }}", 2, "a value of 10000100000 items"),
    ("{{ ['y' * 40000000, 'z' * 40000000] | join }}", 2, "a value of 80000000 items"),
    ("{{ range(100000) | join('x' * 60000000) }}", 2, "a value of 6000000488890 items"),
    ("{{ no_such_name }}", 2, "undefined variable: 'no_such_name' is undefined"),
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}", 2, "passes the limit of 67108864"),
])
def test_a_template_bomb_is_a_one_line_error_naming_template_and_line(tmp_path, body, line,
                                                                     problem):
    with pytest.raises(TemplateError) as error:
        expand_text(tmp_path, NET_HEAD + body + "\n")
    assert problem in one_line(error, f"bomb.prototxt.j2:{line}: ")


def test_running_out_of_memory_is_a_template_error(tmp_path):
    path = tmp_path / "t.prototxt.j2"
    path.write_text(NET_HEAD)
    error = render_error(load_template(str(path)), MemoryError())
    assert str(error) == "t.prototxt.j2: out of memory (a value too large to make)"


@pytest.mark.parametrize("inner, limits, problem", [
    ("", {"seconds": 0.2}, "rendering ran past the limit of 0.2 s (UNROLL_TEMPLATE_SECONDS)"),
    ("x", {"chars": 10_000}, "the output passed the limit of 10000 characters"),
])
def test_nested_loops_stop_at_the_limits(tmp_path, inner, limits, problem):
    with bounded_rendering(**limits), pytest.raises(TemplateError) as error:
        expand_text(tmp_path, NET_HEAD + NESTED.replace("BODY", inner) + "\n")
    assert problem in one_line(error, "bomb.prototxt.j2:2: ")


def test_a_loop_over_a_list_is_bounded_too(tmp_path):
    body = ("{% set xs = range(100000) | list %}"
            "{% for i in xs %}{% for j in xs %}{% endfor %}{% endfor %}")
    with bounded_rendering(seconds=0.2), pytest.raises(TemplateError, match="ran past"):
        expand_text(tmp_path, NET_HEAD + body + "\n")


def test_the_limits_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(SECONDS_ENV, "0.2")
    with pytest.raises(TemplateError, match="past the limit of 0.2 s"):
        expand_text(tmp_path, NET_HEAD + NESTED.replace("BODY", "") + "\n")
    monkeypatch.delenv(SECONDS_ENV)
    monkeypatch.setenv(CHARS_ENV, "1000")
    with pytest.raises(TemplateError, match="output passed the limit of 1000 characters"):
        expand_text(tmp_path, NET_HEAD + NESTED.replace("BODY", "x") + "\n")
    monkeypatch.setenv(CHARS_ENV, "lots")
    with pytest.raises(TemplateError, match="UNROLL_TEMPLATE_CHARS must be a positive number"):
        expand_text(tmp_path, NET_HEAD + "\n")


@pytest.mark.parametrize("where, line", [("in_macro", 6), ("at_top", 1)])
def test_a_step_template_is_bounded_in_its_macros_and_its_body(tmp_path, where, line):
    bomb = NESTED.replace("BODY", "")
    text = STEP_HEAD + STEP_BODY.replace("BODY", bomb if where == "in_macro" else "")
    if where == "at_top":
        text = bomb + text
    with bounded_rendering(seconds=0.2), pytest.raises(TemplateError) as error:
        expand_text(tmp_path, text)
    assert "ran past the limit" in one_line(error, f"bomb.prototxt.j2:{line}: ")


def test_a_real_template_renders_within_the_defaults():
    net = expand("lstm", steps=20, batch=2, input_dim=3, hidden=4, direction="bidirectional")
    assert len(net.layer) > 100


# -- shapes ------------------------------------------------------------------------------

HUGE = 'layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 100000000000 } } }'
SMALL = """
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
        inner_product_param { num_output: 10 } }
"""


def test_a_huge_shape_is_refused_at_build_naming_blob_and_layer():
    with pytest.raises(NetError) as error:
        Net(HUGE)
    message = str(error.value)
    assert "the memory plan needs 372.5 GiB" in message
    assert "blob 'x' (100000000000,)" in message and "layer 'in' (Input)" in message
    assert "the memory available" in message


def test_a_reshape_to_shapes_laid_out_before_asks_the_device_nothing(monkeypatch):
    # docs/design.md, 6: a top no larger than what the net holds is refused by no limit,
    # and a bucket's nets reshape back and forth to layouts they kept
    from unroll.engine import memory_limit

    net = Net(SMALL)
    net.forward(x=np.ones((7, 3)))
    net.forward(x=np.ones((4, 3)))
    asked = []
    monkeypatch.setattr(memory_limit, "available_bytes", lambda xp: asked.append(xp) or 1000)
    assert net.forward(x=np.ones((7, 3)))["y"].shape == (7, 10)
    assert asked == []
    with pytest.raises(NetError) as error:  # a top beyond what it holds: asked, and refused
        net.forward(x=np.zeros((2000, 3)))
    assert len(asked) == 1 and "blob 'x' (2000, 3)" in str(error.value)


def test_a_huge_param_is_refused_before_it_is_filled():
    text = SMALL.replace("num_output: 10", "num_output: 4000000000")
    with pytest.raises(NetError, match=r"param 0 \('ip.0'\) \(4000000000, 3\) 89.4 GiB, of "
                                       r"layer 'ip' \(InnerProduct\)"):
        Net(text)


def test_max_bytes_overrides_the_limit():
    Net(SMALL, max_bytes=10_000)
    with pytest.raises(NetError, match=r"over the limit of 100 B \(max_bytes\)"):
        Net(SMALL, max_bytes=100)


def test_an_input_too_large_for_the_limit_is_refused_before_it_runs():
    net = Net(SMALL, max_bytes=10_000)
    with pytest.raises(NetError, match="blob 'x' \\(2000, 3\\)"):
        net.forward(x=np.zeros((2000, 3)))
    with pytest.raises(NetError, match="blob 'x' \\(2000, 3\\)"):
        net.forward()  # the input kept its refused shape: refused again, never run
    assert net.forward(x=np.ones((4, 3)))["y"].shape == (4, 10)
    # each blob fits, all of them do not: the plan names the largest first
    with pytest.raises(NetError, match=r"largest: blob 'y' \(200, 10\) 7.8 KiB, of layer "
                                       r"'ip' \(InnerProduct\); blob 'x' \(200, 3\)"):
        net.forward(x=np.zeros((200, 3)))


def test_a_bucketed_model_passes_max_bytes_to_its_nets():
    def make(steps):
        return expand("rnn", steps=steps, batch=2, input_dim=3, hidden=4)
    with pytest.raises(NetError, match="max_bytes"):
        BucketedModel(make, max_bytes=100)


def run_cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "unroll.tools.cli", *args], cwd=ROOT, text=True,
                          timeout=120, check=False, **kwargs)


@pytest.mark.parametrize("command", ["inspect", "memory"])
def test_the_command_reports_a_huge_shape_as_one_line(tmp_path, command):
    net = tmp_path / "huge.prototxt"
    net.write_text(HUGE + "\n")
    done = run_cli(command, str(net), capture_output=True)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"unroll {command}: error: ")
    assert "the memory plan needs 372.5 GiB" in lines[0] and "KiB" not in lines[0]


# -- Python layers ---------------------------------------------------------------------------

PY_NET = """
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 } } }
layer { name: "py" type: "Python" bottom: "x" top: "y"
        python_param { module: "%s" layer: "Bad" } }
"""
PY_LAYER = """
from unroll.engine.layer import Layer
%s
class Bad(Layer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        %s

    def layer_setup(self, bottoms, tops):
        %s

    def reshape(self, bottoms, tops):
        tops[0].reshape(bottoms[0].shape)
"""
PASS = "pass"


@pytest.fixture
def python_module(tmp_path, monkeypatch):
    """Write a module into tmp_path, importable; returns its name."""
    name = f"limits_layer_{tmp_path.name.replace('-', '_')}"
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(ALLOW_PYTHON_ENV, raising=False)

    def write(at_import=PASS, at_init=PASS, at_setup=PASS):
        (tmp_path / f"{name}.py").write_text(PY_LAYER % (at_import, at_init, at_setup))
        return name

    yield write
    sys.modules.pop(name, None)


@pytest.mark.parametrize("where, problem", [
    ("at_import", "importing module '{m}' raised RuntimeError: no GPU here"),
    ("at_import", "importing module '{m}' raised SystemExit: 3"),
    ("at_init", "cannot be made: RuntimeError: no GPU here"),
    ("at_setup", "cannot set up: RuntimeError: no GPU here"),
])
def test_a_python_layer_that_raises_is_a_net_error_naming_module_layer_and_type(
        python_module, where, problem):
    code = "raise SystemExit(3)" if "SystemExit" in problem else "raise RuntimeError('no GPU here')"
    module = python_module(**{where: code})
    with pytest.raises(NetError) as error:
        Net(PY_NET % module, allow_python_layers=True)
    message = str(error.value)
    assert message.startswith(f"layer 'py' (Python, module '{module}', class 'Bad')"), message
    assert problem.format(m=module) in message


def test_a_python_layer_reports_its_type_as_python(python_module):
    net = Net(PY_NET % python_module(), allow_python_layers=True)
    assert [layer.type for layer in net.layers] == ["Input", "Python"]


# -- cont ----------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"sequence_output": False, "align": "left"}],
                         ids=["sequence", "many_to_one"])
@pytest.mark.parametrize("value", [0.5, 2.0, -1.0, np.nan])
def test_cont_must_be_0_or_1(options, value):
    net = Net(expand("rnn", steps=3, batch=2, input_dim=2, hidden=3, **options))
    x = np.zeros((3, 2, 2))
    cont = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    net.forward(x=x, cont=cont)
    cont[2, 1] = value
    with pytest.raises(NetError, match=rf"input 'cont' holds {value!r} at index \(2, 1\); "
                                       "cont must be 0"):
        net.forward(x=x, cont=cont)
    with pytest.raises(NetError, match="input 'cont' holds"):
        net.check_inputs(cont=cont)


# -- output ---------------------------------------------------------------------------------

EXPAND = ["expand", "lstm", "--steps", "3", "--set", "input_dim=2", "--set", "hidden=3"]


def draw_args(tmp_path):
    net = tmp_path / "small.prototxt"
    net.write_text(SMALL)
    return {"expand": EXPAND, "inspect": ["inspect", str(net)], "memory": ["memory", str(net)],
            "draw": ["draw", str(net)]}


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
@pytest.mark.parametrize("command", ["expand", "inspect", "memory", "draw"])
def test_a_full_standard_output_is_one_line_and_exit_1(tmp_path, command):
    with open("/dev/full", "w") as full:
        done = run_cli(*draw_args(tmp_path)[command], stdout=full, stderr=subprocess.PIPE)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"unroll {command}: error: standard output: No space left on device"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_expand_to_a_full_device_names_it():
    done = run_cli(*EXPAND, "-o", "/dev/full", capture_output=True)
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["unroll expand: error: /dev/full: No space left on device"]


def test_a_closed_pipe_ends_the_command_quietly():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        done = run_cli(*EXPAND, stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == ""  # 128 + SIGPIPE, as a shell reports


def test_the_atomic_writer_names_the_file_on_a_full_disk(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    path = tmp_path / "best.caffemodel"
    with pytest.raises(OSError) as error:
        write_atomic(path, b"weights")
    assert error.value.errno == errno.ENOSPC
    assert str(error.value) == f"{path}: No space left on device"
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 64 KiB tmpfs at tmp_path/disk (needs root and mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_really_full_disk_names_the_file_and_keeps_the_old_one(small_tmpfs):
    path = small_tmpfs / "best.caffemodel"
    write_atomic(path, b"old weights")
    with pytest.raises(OSError) as error:
        write_atomic(path, b"x" * 2**20)
    assert error.value.errno == errno.ENOSPC
    assert str(error.value) == f"{path}: No space left on device"
    assert path.read_bytes() == b"old weights"
    assert [p.name for p in small_tmpfs.iterdir()] == ["best.caffemodel"]
