"""JSON files read without trusting them (design: 8. Trust): only regular files, bounded in
size and depth, schema-checked, every refusal one line naming the file."""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.hang import at_once
from unroll.core.errors import FileFormatError
from unroll.core.json_files import (
    MAX_DEPTH,
    count,
    parse,
    read_bytes,
    read_checked,
)

SCHEMA = {"type": "object", "additionalProperties": False, "properties": {"hidden": count(64)}}


def _fifo(path):
    os.mkfifo(path)


def _link_to_zero(path):
    path.symlink_to("/dev/zero")


def _link_to_fifo(path):
    os.mkfifo(path.with_name("pipe"))
    path.symlink_to("pipe")


def _folder(path):
    path.mkdir()


@pytest.mark.parametrize("make, kind", [
    (_fifo, "is a FIFO"), (_link_to_zero, "is a device"), (_link_to_fifo, "is a FIFO"),
    (_folder, "is a folder"),
])
def test_anything_but_a_regular_file_is_refused_at_once(tmp_path, make, kind):
    path = tmp_path / "config.json"
    make(path)
    with pytest.raises(FileFormatError) as e:
        at_once(read_checked, path, SCHEMA)
    assert str(e.value) == f"{path}: {kind}; expected a regular file"


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused_without_reading_it(device):
    with pytest.raises(FileFormatError, match=f"^{device}: is a device; expected a regular"):
        at_once(read_bytes, device)


def test_a_missing_file_stays_file_not_found_for_the_caller_to_explain(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "absent.json")


def test_a_file_over_its_bound_is_refused_unread(tmp_path):
    path = tmp_path / "log.json"
    path.write_bytes(b"[" + b"0," * 100 + b"0]")
    with pytest.raises(FileFormatError, match="is larger than 64 bytes, the most it may hold"):
        read_bytes(path, limit=64)


def test_json_nested_100000_deep_is_one_line_not_a_recursion_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(FileFormatError) as e:
        read_checked(path, SCHEMA)
    assert "\n" not in str(e.value)
    assert f"nested deeper than {MAX_DEPTH} levels" in str(e.value)


@given(st.integers(1, 2 * MAX_DEPTH), st.sampled_from(["[]", "{}"]))
def test_nesting_is_accepted_up_to_its_bound_and_refused_beyond(depth, brackets):
    text = ('{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1) if brackets == "{}"
            else "[" * depth + "]" * depth)
    if depth <= MAX_DEPTH:
        parse("x.json", text.encode())
    else:
        with pytest.raises(FileFormatError, match="nested deeper"):
            parse("x.json", text.encode())


@pytest.mark.parametrize("text, found", [
    ('{"hidden": 1e400}', "hidden must be an integer >= 1, found 1e400"),
    ('{"hidden": NaN}', "hidden must be an integer >= 1, found NaN"),
    ('{"hidden": 65}', "hidden must be at most 64, found 65"),
    ('{"hidden": true}', "hidden must be an integer >= 1, found True"),
    ('{"width": 3}', "unknown key(s) ['width']; expected ['hidden']"),
])
def test_a_value_outside_its_schema_is_named_by_its_field(tmp_path, text, found):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(FileFormatError) as e:
        read_checked(path, SCHEMA)
    assert str(e.value) == f"{path}: {found}"
