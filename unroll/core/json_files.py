"""JSON files read without trusting them: bounded, then schema-checked.

A file must be a regular file (not a FIFO, which is opened without blocking,
nor a folder or a symlink loop) of at most :data:`MAX_BYTES`, nested at most
:data:`MAX_DEPTH` deep (counted on the bytes, before the parser recurses),
with finite numbers only (no NaN, Infinity or 1e400) and integers of at most
:data:`MAX_DIGITS` digits. Then it is validated against its schema
(``jsonschema``), so types, ranges and sizes are known before any value is
used. Every problem is a :class:`FileFormatError` naming the file and the field.
:func:`count`, :func:`ratio`, :func:`finite` and :data:`SHA256_HEX` are schema
pieces that describe themselves in those messages.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "config.json"
>>> _ = path.write_text('{"hidden": 1e400}')
>>> read_checked(path, {"type": "object", "properties": {"hidden": count(8192)}})
Traceback (most recent call last):
unroll.core.errors.FileFormatError: ...config.json: hidden must be an integer >= 1, found 1e400
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import stat

from unroll.core.errors import FileFormatError

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_DIGITS", "SHA256_HEX", "Unusable", "count", "finite",
           "parse", "parse_checked", "problem", "ratio", "read_bytes", "read_checked"]

#: bounds of any JSON file read: bytes, nesting, digits of an integer
MAX_BYTES, MAX_DEPTH, MAX_DIGITS = 1 << 28, 16, 18


def count(maximum: int) -> dict:
    """The schema of an integer in [1, ``maximum``] (a size, a count)."""
    return {"type": "integer", "minimum": 1, "maximum": maximum,
            "description": "an integer >= 1"}


def ratio() -> dict:
    """The schema of a number in [0, 1) (a dropout rate)."""
    return {"type": "number", "minimum": 0, "exclusiveMaximum": 1,
            "description": "a number in [0, 1)"}


def finite(maximum: float | None = None) -> dict:
    """The schema of a finite number >= 0, at most ``maximum`` where given."""
    schema = {"type": "number", "minimum": 0, "description": "a finite number >= 0"}
    if maximum is not None:
        schema |= {"maximum": maximum, "description": f"a number in [0, {maximum:g}]"}
    return schema


#: the schema of a SHA-256 in hex
SHA256_HEX = {"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "a SHA-256 in hex"}


@functools.cache
def _validator():
    """The validator class, made on first use: jsonschema takes a tenth of a second to
    import, which every command reading a prototxt (this module's read_bytes) would pay."""
    import jsonschema

    # JSON's 1.0 is an integer to jsonschema, and True one to Python: neither is a size here
    checker = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool))
    return jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=checker)


# a JSON string (with its escapes) or a bracket: the brackets outside strings give the depth
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def read_bytes(path, limit: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``), or a FileFormatError.

    What ``path`` leads to is looked at before it is opened, so a FIFO, a device
    (``/dev/zero``) or a link to one is refused without opening it, and the
    open itself never blocks (``O_NONBLOCK``) should the entry be swapped in
    between; the open file is checked again, and read no further than the
    size it had then (at most ``limit``), so a file that grows while read is
    refused too. A missing file
    stays a FileNotFoundError, for the caller to explain.

    >>> read_bytes("/dev/zero")
    Traceback (most recent call last):
    unroll.core.errors.FileFormatError: /dev/zero: is a device; expected a regular file
    """
    try:
        _regular(path, os.stat(path))
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise FileFormatError(path, f"cannot be read: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        status = os.fstat(fd)
        _regular(path, status)
        if status.st_size > limit:
            raise FileFormatError(path, f"is larger than {limit} bytes, the most it may hold")
        data = f.read(status.st_size + 1)
    if len(data) != status.st_size:
        raise FileFormatError(path, f"changed size while it was read ({status.st_size} bytes "
                                    f"when opened): is something writing it?")
    return data


def _regular(path, status: os.stat_result) -> None:
    mode = status.st_mode
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
                "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise FileFormatError(path, f"is {kind}; expected a regular file")


def parse(path, data: bytes):
    """The JSON value of ``data`` (read from ``path``), bounded in depth, numbers finite."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileFormatError(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    depth = 0
    for token in _TOKENS.finditer(data):
        bracket = token.group()
        if bracket in (b"[", b"{"):
            depth += 1
            if depth > MAX_DEPTH:
                raise FileFormatError(path, f"not valid here: nested deeper than {MAX_DEPTH} "
                                            f"levels (at byte {token.start()})")
        elif bracket in (b"]", b"}"):
            depth -= 1
    try:
        return json.loads(text, parse_constant=Unusable, parse_float=_finite_float,
                          parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        raise FileFormatError(path, f"not valid JSON (line {e.lineno} column {e.colno}: "
                                    f"{e.msg})") from None


class Unusable:
    """A number no field takes (NaN, Infinity, 1e400, a thousand digits), kept as its text
    so that the schema, which matches it to no type, names its field."""

    def __init__(self, text: str):
        self.text = text if len(text) <= 24 else f"{text[:20]}... ({len(text)} digits)"

    def __repr__(self) -> str:
        return self.text


def _finite_float(text: str):
    value = float(text)
    return value if math.isfinite(value) else Unusable(text)


def _bounded_int(text: str):
    return int(text) if len(text.lstrip("-")) <= MAX_DIGITS else Unusable(text)


def problem(value, schema: dict) -> str | None:
    """What is wrong with ``value`` under ``schema``, naming the field; None if nothing.

    >>> problem({"hidden": 0}, {"type": "object", "properties": {"hidden": count(64)}})
    'hidden must be an integer >= 1, found 0'
    >>> problem({"chars": {"length": 10**9}},
    ...         {"properties": {"chars": {"properties": {"length": count(256)}}}})
    'chars.length must be at most 256, found 1000000000'
    """
    import jsonschema

    error = jsonschema.exceptions.best_match(_validator()(schema).iter_errors(value))
    if error is None:
        return None
    field = _field(error.absolute_path)
    found = f"found {error.instance!r:.60}"
    if error.validator == "maximum":
        return f"{field} must be at most {error.validator_value}, {found}"
    if error.validator in ("maxItems", "maxProperties"):
        return f"{field} holds more than {error.validator_value} entries"
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return (f"unknown key(s) {extra}" + (f" in {field}" if error.absolute_path else "")
                + f"; expected {sorted(error.schema.get('properties', {}))}")
    if error.validator in ("required", "dependentRequired"):
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return f"{field} lacks the key {missing!r}"
    if error.validator == "propertyNames":
        return f"{field} has an unknown key {error.instance!r:.60}"
    description = error.schema.get("description")
    if description is None:
        return f"{field}: {error.message:.200}"
    if not error.absolute_path:
        return f"expected {description}, found {_json_type(error.instance)}"
    return f"{field} must be {description}, {found}"


def _json_type(value) -> str:
    for kind, name in ((bool, "true or false"), (dict, "an object"), (list, "a list"),
                       (str, "a string"), ((int, float), "a number")):
        if isinstance(value, kind):
            return name
    return "null"


def _field(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the top level"


def read_checked(path, schema: dict):
    """The JSON value in ``path``, bounded (see the module) and valid under ``schema``,
    which must type every value (so that no :class:`Unusable` number gets through)."""
    return parse_checked(path, read_bytes(path), schema)


def parse_checked(path, data: bytes, schema: dict):
    """The JSON value of ``data`` (the bytes of ``path``, already read and perhaps
    checksummed), bounded and valid under ``schema``: :func:`read_checked` for bytes in hand.

    >>> parse_checked("log.json", b"[" * 100_000, {"type": "array"})
    Traceback (most recent call last):
    unroll.core.errors.FileFormatError: log.json: not valid here: nested deeper than 16 ...
    """
    value = parse(path, data)
    wrong = problem(value, schema)
    if wrong is not None:
        raise FileFormatError(path, wrong)
    return value
