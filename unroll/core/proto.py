"""The net and solver schema: Caffe's messages, and reading them from prototxt.

This is the only module that imports the generated ``unroll_pb2``; everything
else uses the names re-exported here. The schema in ``proto/unroll.proto`` is a
subset of BVLC ``caffe.proto`` with the same names and field numbers, so files
interoperate with real Caffe.

Regenerate the Python module after editing the schema::

    python -m unroll.core.proto --generate
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from google.protobuf.message import DecodeError

from unroll.core._generated import unroll_pb2 as pb
from unroll.core.errors import FileFormatError
from unroll.core.json_files import read_bytes
from unroll.core.net_text import parse_net_text

__all__ = ["BlobProto", "BlobShape", "DimCheckMode", "EltwiseOp", "EltwiseParameter",
           "FillerParameter", "LayerParameter", "LossParameter", "NetParameter", "NetState",
           "NetStateRule", "NormalizationMode", "ParamSpec", "Phase", "PrototxtError",
           "SnapshotFormat", "SolverMode", "SolverParameter", "SolverState", "SolverType", "TEST",
           "TRAIN", "VarianceNorm", "array_from_blob_proto", "blob_proto_from_array", "parse_text",
           "read_binary", "read_message", "read_prototxt", "to_text"]

BlobProto = pb.BlobProto
BlobShape = pb.BlobShape
EltwiseParameter = pb.EltwiseParameter
FillerParameter = pb.FillerParameter
LayerParameter = pb.LayerParameter
LossParameter = pb.LossParameter
NetParameter = pb.NetParameter
NetState = pb.NetState
NetStateRule = pb.NetStateRule
ParamSpec = pb.ParamSpec
SolverParameter = pb.SolverParameter
SolverState = pb.SolverState

# The enums, by Caffe's names; each value is also an attribute of its message
# (ParamSpec.PERMISSIVE), and Name/Value convert: Phase.Name(TEST) == "TEST".
Phase = pb.Phase
TRAIN = pb.TRAIN
TEST = pb.TEST
DimCheckMode = pb.ParamSpec.DimCheckMode  # share_mode: STRICT, PERMISSIVE
EltwiseOp = pb.EltwiseParameter.EltwiseOp  # PROD, SUM, MAX
NormalizationMode = pb.LossParameter.NormalizationMode  # FULL, VALID, BATCH_SIZE, NONE
VarianceNorm = pb.FillerParameter.VarianceNorm  # FAN_IN, FAN_OUT, AVERAGE
SolverType = pb.SolverParameter.SolverType  # SGD, NESTEROV, ... (deprecated solver_type)
SolverMode = pb.SolverParameter.SolverMode  # CPU, GPU
SnapshotFormat = pb.SolverParameter.SnapshotFormat  # HDF5, BINARYPROTO

SCHEMA = Path(__file__).resolve().parents[2] / "proto" / "unroll.proto"
GENERATED = Path(__file__).resolve().parent / "_generated" / "unroll_pb2.py"


class PrototxtError(ValueError):
    """A prototxt file or text that does not parse; names the source and line."""


def parse_text(text: str, message, source: str = "<prototxt>"):
    """Parse prototxt ``text`` into ``message`` (a fresh message instance).

    >>> net = parse_text('name: "n" layer { name: "d" type: "Input" top: "x" }', NetParameter())
    >>> net.layer[0].type
    'Input'
    """
    # protobuf counts lines by "\n" only: a file saved with CR-only endings would be
    # one line, and its error would name line 1 and print the whole file
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if (isinstance(message, NetParameter) and not message.ListFields()
            and parse_net_text(text, message)):  # an unrolled net: once per layer shape
        return message
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as e:
        line = e.GetLine()
        where = f"{source}:{line}" if line else source
        bad = ""
        if line and 0 < line <= text.count("\n") + 1:
            shown = text.split("\n")[line - 1].strip()
            bad = f"\n    {shown[:120]}{' ...' if len(shown) > 120 else ''}"
        raise PrototxtError(f"{where}: cannot parse {type(message).__name__}: {e}{bad}") from None
    return message


def read_prototxt(path) -> str:
    """The text of a prototxt file; bytes that are not UTF-8 are a PrototxtError naming it."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[: e.start]
        line = len(before.splitlines()) + (not before or before.endswith((b"\n", b"\r")))
        raise PrototxtError(
            f"{path}:{line}: not UTF-8 text ({e.reason} at byte {e.start}); a prototxt file "
            f"is UTF-8"
        ) from None


def read_message(source, message_type):
    """A ``message_type`` from a message, a prototxt path or prototxt text."""
    if isinstance(source, message_type):
        return source
    if isinstance(source, str) and ("{" in source or ":" in source or "\n" in source):
        if "\n" in source or not Path(source).is_file():
            return parse_text(source, message_type())
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no prototxt file at {path} (and it is not prototxt text)")
        return parse_text(read_prototxt(path), message_type(), str(path))
    raise TypeError(
        f"expected a {message_type.__name__}, a prototxt path or prototxt text, "
        f"found {type(source).__name__}"
    )


def read_binary(path, message_type, what: str):
    """A ``message_type`` decoded from the binary file at ``path`` (a .caffemodel, a state).

    A missing file is a FileNotFoundError, bytes that do not decode a
    FileFormatError, each naming the file and ``what`` it should be.
    """
    message = message_type()
    try:  # a regular file only: a FIFO or a link to /dev/zero is refused, not read forever
        data = read_bytes(path, limit=1 << 40)
    except FileNotFoundError:
        raise FileNotFoundError(f"no {what} file at {path}") from None
    try:
        message.ParseFromString(data)
    except DecodeError as e:
        raise FileFormatError(path, f"not a {what} (binary {message_type.__name__}): {e}") from None
    return message


def to_text(message) -> str:
    """Prototxt text of ``message``."""
    return text_format.MessageToString(message)


def generate(out: Path = GENERATED) -> None:
    """Regenerate ``unroll/core/_generated/unroll_pb2.py`` from ``proto/unroll.proto``."""
    from grpc_tools import protoc

    out.parent.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{SCHEMA.parent}", f"--python_out={out.parent}", str(SCHEMA)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {SCHEMA}")
    produced = out.parent / "unroll_pb2.py"
    if produced != out:
        produced.replace(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unroll.core.proto", description=__doc__)
    parser.add_argument("--generate", action="store_true", help="regenerate the _pb2 module")
    args = parser.parse_args(argv)
    if not args.generate:
        parser.print_help()
        return 2
    generate()
    print(f"wrote {GENERATED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def array_from_blob_proto(blob: BlobProto):
    """A NumPy array from a BlobProto (shape or legacy 4-D dims; float or double data)."""
    if blob.HasField("shape"):
        shape = tuple(blob.shape.dim)
    else:
        shape = tuple(d for d in (blob.num, blob.channels, blob.height, blob.width))
    if blob.double_data:
        values = np.asarray(blob.double_data, np.float64)
    else:
        values = np.asarray(blob.data, np.float32)
    if values.size != int(np.prod(shape)):
        raise ValueError(f"BlobProto holds {values.size} values for shape {shape}")
    return values.reshape(shape)


def blob_proto_from_array(array) -> BlobProto:
    """A BlobProto holding ``array`` (float64 goes to double_data, all else to data)."""
    array = np.asarray(array)
    blob = BlobProto()
    blob.shape.dim.extend(array.shape)
    if array.dtype == np.float64:
        blob.double_data.extend(array.ravel().tolist())
    else:
        blob.data.extend(array.astype(np.float32).ravel().tolist())
    return blob
