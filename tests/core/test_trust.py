"""Untrusted input to the library: weights, Python layers, prototxt bytes."""

import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll.core.atomic import remove_stale_temps, write_atomic
from unroll.core.errors import FileFormatError, NetError, TemplateError
from unroll.core.proto import NetParameter, PrototxtError, parse_text, read_message
from unroll.engine.layer import ALLOW_PYTHON_ENV
from unroll.engine.net import Net

FILLED = 'weight_filler { type: "gaussian" std: 1 }'
TWO_IP = f"""
layer {{ name: "in" type: "Input" top: "x" input_param {{ shape {{ dim: 2 dim: 3 }} }} }}
layer {{ name: "ip1" type: "InnerProduct" bottom: "x" top: "h"
        inner_product_param {{ num_output: 4 {FILLED} }} }}
layer {{ name: "ip2" type: "InnerProduct" bottom: "h" top: "y"
        inner_product_param {{ num_output: 2 {FILLED} }} }}
"""
#: errors that say what is wrong with the input; anything else escaping is a bug
OURS = (NetError, PrototxtError, TemplateError, FileFormatError)


# -- weights -----------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    net = Net(TWO_IP, dtype="float64", seed=1)
    path = tmp_path / "w.caffemodel"
    net.save(path)
    return net, path


@pytest.mark.parametrize("content, problem", [
    (b"", "holds no weights"),
    (b"\xff\xfe garbage", "not a .caffemodel"),
])
def test_a_file_without_weights_is_an_error_naming_it(saved, content, problem):
    _, path = saved
    path.write_bytes(content)
    with pytest.raises(FileFormatError, match=f"w.caffemodel: {problem}"):
        Net(TWO_IP).copy_from(path, strict=True)


def test_every_learnable_param_must_get_weights(saved):
    full, path = saved
    partial = NetParameter()
    partial.ParseFromString(path.read_bytes())
    del partial.layer[-1]  # as a file cut short after ip1
    net = Net(TWO_IP, dtype="float64", seed=2)
    with pytest.raises(NetError, match="no weights for 2 of the net's 4 learnable params"):
        net.copy_from(partial)
    net.copy_from(partial, allow_missing=True)  # a partial fine-tuning load, asked for
    np.testing.assert_array_equal(net.params["ip1"][0].data, full.params["ip1"][0].data)
    assert not np.array_equal(net.params["ip2"][0].data, full.params["ip2"][0].data)


def test_a_truncated_file_never_loads_silently(saved):
    _, path = saved
    data = path.read_bytes()
    for cut in range(1, len(data), max(1, len(data) // 40)):
        path.write_bytes(data[:cut])
        with pytest.raises((FileFormatError, NetError)):
            Net(TWO_IP, dtype="float64").copy_from(path)


# -- Python layers --------------------------------------------------------------------------

PYTHON_NET = """
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 } } }
layer { name: "py" type: "Python" bottom: "x" top: "y"
        python_param { module: "%s" layer: "Double" } }
"""
PYTHON_MODULE = """
import pathlib
pathlib.Path(%r).write_text("imported")
from unroll.engine.layer import Layer

class Double(Layer):
    def reshape(self, bottoms, tops):
        tops[0].reshape(bottoms[0].shape)

    def forward(self, bottoms, tops):
        tops[0].data[...] = 2 * bottoms[0].data
"""


@pytest.fixture
def python_layer(tmp_path, monkeypatch):
    """(module name, marker file its import writes), importable from tmp_path."""
    name = f"trust_layer_{tmp_path.name.replace('-', '_')}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(PYTHON_MODULE % str(marker))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(ALLOW_PYTHON_ENV, raising=False)
    yield name, marker
    sys.modules.pop(name, None)


def test_python_layers_are_not_imported_without_opt_in(python_layer):
    name, marker = python_layer
    with pytest.raises(NetError, match="refusing to import module.*allow_python_layers"):
        Net(PYTHON_NET % name)
    assert not marker.exists()  # its code never ran


@pytest.mark.parametrize("opt_in", ["flag", "env"])
def test_python_layers_load_after_opt_in(python_layer, monkeypatch, opt_in):
    name, marker = python_layer
    if opt_in == "env":
        monkeypatch.setenv(ALLOW_PYTHON_ENV, "1")
    net = Net(PYTHON_NET % name, allow_python_layers=opt_in == "flag")
    assert marker.exists()
    np.testing.assert_array_equal(net.forward(x=np.array([1.0, 2.0]))["y"], [2.0, 4.0])


@pytest.mark.parametrize("module, problem", [
    ("../evil", "is not a module path"),
    ("os.path; import os", "is not a module path"),
    ("no_such_module_anywhere", "no module 'no_such_module_anywhere'"),
])
def test_python_layer_modules_must_be_module_paths(module, problem):
    with pytest.raises(NetError, match=problem):
        Net(PYTHON_NET % module, allow_python_layers=True)


# -- other checks -----------------------------------------------------------------------------


def test_a_non_float_dtype_is_refused_when_the_net_is_built():
    with pytest.raises(ValueError, match="dtype must be a float type.*int32"):
        Net(TWO_IP, dtype="int32")


def test_a_fractional_label_is_an_error_not_a_truncation():
    net = Net("""
      layer { name: "in" type: "Input" top: "s" top: "l"
              input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }
      layer { name: "loss" type: "SoftmaxWithLoss" bottom: "s" bottom: "l" top: "loss" }
    """, dtype="float64")
    net.forward(s=np.zeros((2, 3)), l=np.array([1.0, 2.0]))
    with pytest.raises(NetError, match="layer 'loss'.*label 1.5 .* not a whole number"):
        net.forward(s=np.zeros((2, 3)), l=np.array([1.5, 2.0]))


def test_a_prototxt_that_is_not_utf8_names_the_file_and_line(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_bytes(b'name: "n"\r\nlayer { name: "caf\xe9" type: "Input" }\n')
    with pytest.raises(PrototxtError, match="net.prototxt:2: not UTF-8 text"):
        read_message(path, NetParameter)


def test_cr_only_prototxt_reports_the_right_line_and_not_the_whole_file():
    text = "\r".join(['name: "n"', 'layer { name: "a" }', 'layer { nmae: "b" }'] + ["# x" * 60])
    with pytest.raises(PrototxtError) as error:
        parse_text(text, NetParameter(), "cr.prototxt")
    message = str(error.value)
    assert message.startswith("cr.prototxt:3:") and 'nmae: "b"' in message
    assert len(message) < 400


def test_stale_temp_files_are_removed_and_nothing_else(tmp_path):
    write_atomic(tmp_path / "keep.caffemodel", b"w")
    (tmp_path / ".keep.caffemodel.k2j4_x0a.tmp").write_bytes(b"half")
    (tmp_path / ".hidden").write_bytes(b"mine")
    (tmp_path / "notes.tmp").write_bytes(b"mine")
    removed = remove_stale_temps(tmp_path)
    assert [p.name for p in removed] == [".keep.caffemodel.k2j4_x0a.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden", "keep.caffemodel",
                                                          "notes.tmp"]


# -- fuzz: only our own errors escape ----------------------------------------------------------

PIECES = [
    'name: "n"', "layer {", "}", 'name: "a"', 'type: "InnerProduct"', 'type: "Input"',
    'type: "Nope"', 'bottom: "x"', 'top: "x"', 'top: "y"', "input_param { shape { dim: 2 } }",
    "inner_product_param { num_output: 3 }", "num_output: -1", "dim: 99999999999999999999",
    'param { name: "W" }', "axis: 7", "{", ":", '"', "\\", "#", "\n", "\r", "\t", " ", "1e999",
]


@given(st.lists(st.sampled_from(PIECES) | st.text(max_size=8), max_size=30).map(" ".join))
def test_fuzzed_prototxt_text_raises_only_our_errors(text):
    try:
        parse_text(text, NetParameter(), "fuzz.prototxt")
    except PrototxtError as e:
        assert str(e).startswith("fuzz.prototxt")


@given(st.binary(max_size=200))
def test_fuzzed_prototxt_bytes_raise_only_our_errors(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "net.prototxt"
    path.write_bytes(data)
    try:
        read_message(path, NetParameter)
    except PrototxtError as e:
        assert str(path) in str(e)


LAYER_TYPES = ["InnerProduct", "ReLU", "Sigmoid", "TanH", "Dropout", "Power", "Concat", "Slice",
               "Split", "Silence", "Scale", "Eltwise", "Softmax", "SoftmaxWithLoss",
               "EuclideanLoss", "Accuracy", "Reshape", "Flatten", "Embed", "BatchNorm", "Nope"]
SETTINGS = ["", "inner_product_param { num_output: 2 }", "inner_product_param { axis: 5 }",
            "concat_param { axis: 1 }", "slice_param { axis: 0 }", "embed_param { input_dim: 3 "
            "num_output: 2 }", "reshape_param { shape { dim: -1 dim: 7 } }", "loss_weight: 2",
            "softmax_param { axis: -3 }", 'param { name: "W" }', "eltwise_param { operation: "
            "PROD }", "power_param { power: -1.5 }"]
BLOBS = ["x", "y", "z", "w"]


@st.composite
def nets(draw):
    dims = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    text = ('layer { name: "in" type: "Input" top: "x" input_param { shape { '
            + " ".join(f"dim: {d}" for d in dims) + " } } }\n")
    for k in range(draw(st.integers(1, 4))):
        bottoms = draw(st.lists(st.sampled_from(BLOBS), max_size=2))
        tops = draw(st.lists(st.sampled_from(BLOBS), max_size=2))
        text += (f'layer {{ name: "l{k}" type: "{draw(st.sampled_from(LAYER_TYPES))}" '
                 + "".join(f'bottom: "{b}" ' for b in bottoms)
                 + "".join(f'top: "{t}" ' for t in tops)
                 + f"{draw(st.sampled_from(SETTINGS))} }}\n")
    return text


@given(nets())
def test_fuzzed_nets_build_and_run_or_raise_only_our_errors(text):
    try:
        net = Net(text, dtype="float64")
        net.forward()
        net.backward()
    except OURS:
        pass
