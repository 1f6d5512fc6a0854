"""The SolverParameter a Solver runs on: built from a file and keywords, and checked.

Hyper-parameters live in a caffe.proto ``SolverParameter``, so they have its
float32 precision, as in Caffe (``base_lr=0.01`` is ``0.009999999776482582``).
This module holds what every solver type and lr policy shares: the error type,
one-line field errors, keyword fields set onto the message, the checks of the
fields no type or policy owns, and the rule that a field whose Caffe default
would silently change the method must be given (docs/design.md, "No silent
defaults that change a method").

>>> param = build_param('base_lr: 0.5', {"type": "SGD", "max_iter": 10.0})
>>> param.type, param.max_iter, param.base_lr
('SGD', 10, 0.5)
>>> check_common(SolverParameter(base_lr=-1))
Traceback (most recent call last):
...
unroll.train.solver_param.SolverError: solver field 'base_lr': expected a number >= 0, found -1.0
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping

from unroll.core.proto import SolverParameter, read_message

__all__ = ["IGNORED_FIELDS", "SolverError", "bad", "build_param", "check_common", "is_set",
           "require_set"]

#: Fields of a Caffe solver file that concern what the caller owns here: the net
#: (passed in), test nets, and the device (the net's). Set, they draw a warning.
IGNORED_FIELDS = (
    "net", "net_param", "train_net", "train_net_param", "train_state", "test_net",
    "test_net_param", "test_state", "test_iter", "test_interval", "test_compute_loss",
    "test_initialization", "solver_mode", "device_id", "snapshot_diff", "layer_wise_reduce",
    "debug_info",
)


class SolverError(ValueError):
    """A solver setting, snapshot or net that the solver cannot use; says which and why."""


def bad(field: str, expected: str, found) -> SolverError:
    """The one-line error for a field's value: ``solver field 'f': expected ..., found ...``."""
    return SolverError(f"solver field '{field}': expected {expected}, found {found!r}")


def build_param(solver_param, fields: Mapping) -> SolverParameter:
    """A SolverParameter from ``solver_param`` (a message, a prototxt path or text, or None)
    with the keyword ``fields`` set on top; a keyword ``type`` or ``solver_type`` overrides
    the file's, whichever of the two the file gave."""
    param = SolverParameter()
    if solver_param is not None:
        param.CopyFrom(read_message(solver_param, SolverParameter))
    if "type" in fields and "solver_type" in fields:
        raise SolverError("give 'type' or 'solver_type', not both ('type' is Caffe's current)")
    for name, value in fields.items():
        _set_field(param, name, value)
    if "type" in fields:
        param.ClearField("solver_type")
    elif "solver_type" in fields:
        param.ClearField("type")
    return param


def _set_field(param: SolverParameter, name: str, value) -> None:
    fd = param.DESCRIPTOR.fields_by_name.get(name)
    if fd is None:
        close = difflib.get_close_matches(name, param.DESCRIPTOR.fields_by_name, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise TypeError(f"Solver() got an unknown SolverParameter field '{name}'{hint}")
    try:
        if fd.is_repeated:
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                value = [value]
            container = getattr(param, name)
            del container[:]
            if fd.message_type is not None:
                for v in value:
                    container.add().CopyFrom(v)
            else:
                container.extend(value)
        elif fd.message_type is not None:
            getattr(param, name).CopyFrom(value)
        else:
            if (fd.cpp_type in (fd.CPPTYPE_INT32, fd.CPPTYPE_INT64)
                    and isinstance(value, float) and value.is_integer()):
                value = int(value)
            setattr(param, name, value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"Solver() field '{name}': cannot take {value!r}: {e}") from None


def check_common(p: SolverParameter) -> None:
    """The checks of the fields no solver type or lr policy owns."""
    if not p.HasField("base_lr"):
        raise SolverError("solver field 'base_lr' is not set; give the base learning rate")
    for name in ("base_lr", "gamma", "power", "momentum", "momentum2", "weight_decay", "delta",
                 "rms_decay", "clip_gradients"):
        if not math.isfinite(getattr(p, name)):
            raise bad(name, "a finite number", getattr(p, name))
    for name in ("base_lr", "weight_decay", "momentum", "gamma", "delta"):
        if getattr(p, name) < 0:
            raise bad(name, "a number >= 0", getattr(p, name))
    for name, minimum in (("iter_size", 1), ("average_loss", 1), ("max_iter", 0),
                          ("display", 0), ("snapshot", 0), ("stepsize", 0)):
        if getattr(p, name) < minimum:
            raise bad(name, f"an integer >= {minimum}", getattr(p, name))
    if p.regularization_type not in ("L1", "L2"):
        raise bad("regularization_type", '"L2" or "L1"', p.regularization_type)
    if p.HasField("clip_gradients") and p.clip_gradients <= 0:
        raise bad("clip_gradients", "a norm > 0 (leave it unset for no clipping)",
                  p.clip_gradients)
    if p.snapshot_format != SolverParameter.BINARYPROTO:
        raise bad("snapshot_format", "BINARYPROTO (unroll writes no HDF5)",
                  SolverParameter.SnapshotFormat.Name(p.snapshot_format))
    if p.snapshot and not p.snapshot_prefix:
        raise SolverError(
            f"solver field 'snapshot' is {p.snapshot} but 'snapshot_prefix' is not set; "
            f"give the prefix of the snapshot files"
        )


def is_set(p: SolverParameter, name: str) -> bool:
    """Whether field ``name`` was given (a repeated field: has a value), 0 included."""
    fd = p.DESCRIPTOR.fields_by_name[name]
    return len(getattr(p, name)) > 0 if fd.is_repeated else p.HasField(name)


def require_set(p: SolverParameter, fields: Mapping, what: str, hint: str) -> None:
    """Each of ``fields`` is set, to any value, 0 included (presence, not value, tells): an
    unset one is an error naming it, Caffe's default for it and a value to give."""
    for name, value in fields.items():
        if not is_set(p, name):
            fd = p.DESCRIPTOR.fields_by_name[name]
            default = "none" if fd.is_repeated else f"{fd.default_value:g}"
            raise SolverError(
                f"solver field '{name}' is not set, and {what} needs it: Caffe would use its "
                f"default ({default}) without a word; give it explicitly ({hint} "
                f"{name}={value!r}); a value given is used as given, 0 included"
            )
