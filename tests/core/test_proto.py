"""The schema: generated code up to date, Caffe's field numbers, real Caffe prototxt."""

import re
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import given
from hypothesis import strategies as st

from unroll import testing
from unroll.core import proto
from unroll.core._generated import unroll_pb2
from unroll.core.proto import (
    BlobProto,
    LayerParameter,
    NetParameter,
    PrototxtError,
    SolverParameter,
    parse_text,
    read_message,
)
from unroll.engine.net import Net

REPO = Path(__file__).resolve().parents[2]
CAFFE_FIELDS = REPO.parent / "shared" / "caffe_fields.txt"


# -- the generated module ----------------------------------------------------------


def test_generated_module_is_not_stale(tmp_path):
    fresh = tmp_path / "unroll_pb2.py"
    proto.generate(fresh)
    assert fresh.read_bytes() == proto.GENERATED.read_bytes(), (
        f"{proto.GENERATED.relative_to(REPO)} is stale: it differs from what "
        f"{proto.SCHEMA.relative_to(REPO)} generates; run `python -m unroll.core.proto --generate`"
    )


def test_schema_paths_point_into_the_repository():
    assert proto.SCHEMA == REPO / "proto" / "unroll.proto"
    assert proto.GENERATED == REPO / "unroll" / "core" / "_generated" / "unroll_pb2.py"


# -- Caffe's field names and numbers --------------------------------------------------

SCALARS = {
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
}
#: fields of Caffe's messages that unroll deliberately leaves out
OMITTED = {("NetParameter", "layers")}  # V1 layers: upgrade with Caffe's own tools


def read_caffe_fields(path):
    """{message: {field: (label, type, number, options)}}, {(message, enum): {name: value}}."""
    messages, enums, current = {}, {}, None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        if m := re.fullmatch(r"message (\w+)", line):
            current = messages.setdefault(m[1], {})
            current_name = m[1]
        elif m := re.fullmatch(r"\s+enum (\w+) \{(.*)\}", line):
            pairs = (item.split("=") for item in m[2].split(";"))
            enums[(current_name, m[1])] = {k.strip(): int(v) for k, v in pairs}
        elif m := re.fullmatch(
            r"\s+(optional|repeated|required) (\w+) (\w+) = (\d+)(?: \[(.*)\])?", line
        ):
            current[m[3]] = (m[1], m[2], int(m[4]), m[5] or "")
        else:
            raise AssertionError(f"{path}:{n}: unexpected line {line!r}")
    return messages, enums


@pytest.fixture(scope="module")
def caffe_fields():
    if not CAFFE_FIELDS.is_file():
        pytest.skip(f"{CAFFE_FIELDS} is absent (it lives in shared/ beside the repository)")
    messages, enums = read_caffe_fields(CAFFE_FIELDS)
    for name, fields in BEYOND_CAFFE_FIELDS.items():
        messages.setdefault(name, {}).update(fields)
    return messages, enums


#: What we implement beyond caffe_fields.txt: as BVLC caffe.proto (master) has them, the
#: Power layer, which the unroller uses for a learned initial state (1 - cont), and the
#: Reduction and Tile layers; and unroll's own solver fields (docs/design.md, Solver),
#: numbered from UNROLL_FIELD_NUMBERS.
BEYOND_CAFFE_FIELDS = {
    "LayerParameter": {"power_param": ("optional", "PowerParameter", 122, ""),
                       "reduction_param": ("optional", "ReductionParameter", 136, ""),
                       "tile_param": ("optional", "TileParameter", 138, "")},
    "ReductionParameter": {
        "operation": ("optional", "ReductionOp", 1, "default = SUM"),
        "axis": ("optional", "int32", 2, "default = 0"),
        "coeff": ("optional", "float", 3, "default = 1.0"),
    },
    "TileParameter": {
        "axis": ("optional", "int32", 1, "default = 1"),
        "tiles": ("optional", "int32", 2, ""),
    },
    "PowerParameter": {
        "power": ("optional", "float", 1, "default = 1.0"),
        "scale": ("optional", "float", 2, "default = 1.0"),
        "shift": ("optional", "float", 3, "default = 0.0"),
    },
    "SolverParameter": {
        "min_lr": ("optional", "float", 1001, "default = 0"),
        "warmup_iter": ("optional", "int32", 1002, "default = 0"),
        "warmup_start": ("optional", "float", 1003, "default = 0"),
    },
}
#: unroll's own fields are numbered from here: far above any number Caffe's messages use
UNROLL_FIELD_NUMBERS = 1001


def type_name(field):
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return field.message_type.name
    if field.type == FieldDescriptor.TYPE_ENUM:
        return field.enum_type.name
    return SCALARS[field.type]


def check_default(where, field, text):
    value = field.default_value
    if field.type == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type.values_by_number[value].name == text, where
    elif field.type == FieldDescriptor.TYPE_BOOL:
        assert value == (text == "true"), where
    elif field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        assert value == pytest.approx(float(text), rel=1e-6), where
    elif field.type == FieldDescriptor.TYPE_STRING:
        assert value == text, where
    else:
        assert value == int(text), where


def test_messages_match_caffe(caffe_fields):
    messages, _ = caffe_fields
    ours = unroll_pb2.DESCRIPTOR.message_types_by_name
    for key in (
        "BlobShape",
        "BlobProto",
        "FillerParameter",
        "NetParameter",
        "LayerParameter",
        "ParamSpec",
        "NetState",
        "NetStateRule",
        "SolverParameter",
        "SolverState",
    ):
        assert key in messages, f"{CAFFE_FIELDS} lacks message {key}"
    assert sorted(ours) == sorted(messages), "unroll.proto must hold exactly Caffe's messages"
    for name, fields in messages.items():
        descriptor = ours[name]
        for field_name, (label, type_, number, options) in fields.items():
            where = f"{name}.{field_name}"
            field = descriptor.fields_by_name.get(field_name)
            if field is None:
                assert (name, field_name) in OMITTED, f"{where} is missing from unroll.proto"
                continue
            assert field.number == number, f"{where}: number {field.number}, Caffe {number}"
            assert type_name(field) == type_, f"{where}: type {type_name(field)}, Caffe {type_}"
            assert field.is_repeated == (label == "repeated"), f"{where}: label, Caffe {label}"
            assert field.is_packed == ("packed" in options), f"{where}: packed"
            default = re.search(r"default = ([^,\]]*)", options)
            assert field.has_default_value == bool(default), f"{where}: default"
            if default:
                check_default(where, field, default[1])
        for field in descriptor.fields:
            assert field.name in fields, f"{name}.{field.name} is not a Caffe field"


def test_unrolls_own_fields_cannot_collide_with_caffes():
    """A field Caffe might add to a message keeps a number below unroll's own."""
    caffe, _ = read_caffe_fields(CAFFE_FIELDS) if CAFFE_FIELDS.is_file() else ({}, {})
    for message in unroll_pb2.DESCRIPTOR.message_types_by_name.values():
        ours = [f for f in message.fields if f.number >= UNROLL_FIELD_NUMBERS]
        assert all(f.name in BEYOND_CAFFE_FIELDS.get(message.name, {}) for f in ours), message.name
        numbers = [number for _, _, number, _ in caffe.get(message.name, {}).values()]
        assert all(n < UNROLL_FIELD_NUMBERS for n in numbers), message.name
    own = BEYOND_CAFFE_FIELDS["SolverParameter"]
    assert all(number >= UNROLL_FIELD_NUMBERS for _, _, number, _ in own.values())


def test_enums_match_caffe(caffe_fields):
    messages, enums = caffe_fields
    assert (unroll_pb2.TRAIN, unroll_pb2.TEST) == (0, 1)
    for (message, enum), values in enums.items():
        descriptor = unroll_pb2.DESCRIPTOR.message_types_by_name[message].enum_types_by_name[enum]
        assert {v.name: v.number for v in descriptor.values} == values, f"{message}.{enum}"


def test_caffe_fields_reader(tmp_path):
    path = tmp_path / "fields.txt"
    path.write_text(
        "# comment\nmessage M\n  enum E { A = 0; B = 1 }\n"
        "  repeated int64 dim = 1 [packed]\n  optional float x = 2 [default = 0.5]\n"
    )
    messages, enums = read_caffe_fields(path)
    assert messages == {
        "M": {
            "dim": ("repeated", "int64", 1, "packed"),
            "x": ("optional", "float", 2, "default = 0.5"),
        }
    }
    assert enums == {("M", "E"): {"A": 0, "B": 1}}


# -- reading real Caffe prototxt ------------------------------------------------------

LENET = """\
name: "LeNet"
layer {
  name: "mnist"
  type: "Input"
  top: "data"
  top: "label"
  input_param {
    shape {
      dim: 8
      dim: 1
      dim: 28
      dim: 28
    }
    shape {
      dim: 8
    }
  }
}
layer {
  name: "ip1"
  type: "InnerProduct"
  bottom: "data"
  top: "ip1"
  param {
    lr_mult: 1
  }
  param {
    lr_mult: 2
  }
  inner_product_param {
    num_output: 50
    weight_filler {
      type: "xavier"
    }
    bias_filler {
      type: "constant"
    }
  }
}
layer {
  name: "relu1"
  type: "ReLU"
  bottom: "ip1"
  top: "ip1"
}
layer {
  name: "ip2"
  type: "InnerProduct"
  bottom: "ip1"
  top: "ip2"
  param {
    lr_mult: 1
  }
  param {
    lr_mult: 2
  }
  inner_product_param {
    num_output: 10
    weight_filler {
      type: "xavier"
    }
    bias_filler {
      type: "constant"
    }
  }
}
layer {
  name: "accuracy"
  type: "Accuracy"
  bottom: "ip2"
  bottom: "label"
  top: "accuracy"
  include {
    phase: TEST
  }
}
layer {
  name: "loss"
  type: "SoftmaxWithLoss"
  bottom: "ip2"
  bottom: "label"
  top: "loss"
}
"""


def test_caffe_prototxt_parses_unchanged(tmp_path):
    net = parse_text(LENET, NetParameter())
    # what we print is Caffe's text up to float formatting ("1" -> "1.0")
    printed = proto.to_text(net)
    assert printed == re.sub(r"lr_mult: (\d+)\n", r"lr_mult: \1.0\n", LENET)
    assert parse_text(printed, NetParameter()) == net
    again = NetParameter()
    again.ParseFromString(net.SerializeToString())
    assert again == net
    assert [lp.type for lp in net.layer] == [
        "Input",
        "InnerProduct",
        "ReLU",
        "InnerProduct",
        "Accuracy",
        "SoftmaxWithLoss",
    ]
    ip1 = net.layer[1]
    assert [p.lr_mult for p in ip1.param] == [1, 2]
    assert ip1.inner_product_param.weight_filler.type == "xavier"
    assert net.layer[4].include[0].phase == proto.TEST
    path = tmp_path / "lenet.prototxt"
    path.write_text(LENET)
    assert read_message(path, NetParameter) == net


def test_caffe_prototxt_builds_in_both_phases():
    label = np.arange(8) % 10
    data = np.random.default_rng(0).normal(size=(8, 1, 28, 28))
    train = Net(LENET)
    assert "accuracy" not in train.layer_names
    assert train.outputs == ["loss"]
    test = Net(LENET, phase="test")
    assert "ip2_ip2_0_split" in test.layer_names
    out = test.forward(data=data, label=label)
    assert set(out) == {"accuracy", "loss"}
    assert 0 <= float(out["accuracy"]) <= 1 and float(out["loss"]) > 0
    train.forward(data=data, label=label)
    train.backward()
    assert [p.lr_mult for p in train.learnable_params] == [1, 2, 1, 2]


# -- errors and helpers ------------------------------------------------------------------


def test_parse_error_names_source_and_line():
    text = 'name: "n"\nlayer {\n  name: "a"\n  top: x\n}\n'
    with pytest.raises(PrototxtError, match=r"^my\.prototxt:4: ") as e:
        parse_text(text, NetParameter(), "my.prototxt")
    assert "top: x" in str(e.value)
    with pytest.raises(PrototxtError, match=r"<prototxt>:1: .*SolverParameter"):
        read_message("base_lr: 0.1 bogus: 1", SolverParameter)


def test_read_message_sources():
    message = parse_text('type: "ReLU"', LayerParameter())
    assert read_message(message, LayerParameter) is message
    assert read_message('type: "ReLU"', LayerParameter) == message
    with pytest.raises(TypeError, match="NetParameter"):
        read_message(3, NetParameter)
    with pytest.raises(FileNotFoundError):
        read_message("missing.prototxt", NetParameter)


def test_main_without_arguments_prints_help(capsys):
    assert proto.main([]) == 2
    assert "--generate" in capsys.readouterr().out


@given(
    shape=testing.shapes(min_dims=0, max_dims=4),
    dtype=st.sampled_from([np.float32, np.float64]),
    data=st.data(),
)
def test_blob_proto_round_trip(shape, dtype, data):
    array = data.draw(testing.arrays(shape)).astype(dtype)
    blob = proto.blob_proto_from_array(array)
    assert bool(blob.double_data) == (dtype == np.float64 and array.size > 0)
    again = BlobProto()
    again.ParseFromString(blob.SerializeToString())
    back = proto.array_from_blob_proto(again)
    assert back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_blob_proto_legacy_dims_and_bad_counts():
    blob = BlobProto(num=2, channels=3, height=1, width=1, data=list(range(6)))
    np.testing.assert_array_equal(
        proto.array_from_blob_proto(blob), np.arange(6, dtype=np.float32).reshape(2, 3, 1, 1)
    )
    blob.shape.dim.extend([4])
    with pytest.raises(ValueError, match="6 values for shape"):
        proto.array_from_blob_proto(blob)


def test_text_format_is_the_protobuf_one():
    message = parse_text('layer { name: "a" type: "ReLU" }', NetParameter())
    assert proto.to_text(message) == text_format.MessageToString(message)
