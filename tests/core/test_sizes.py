"""Byte sizes: one parser for every budget a user gives (unroll.core.sizes; docs/design.md, 3)."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll.core.sizes import byte_size


@pytest.mark.parametrize("text, bytes_", [
    ("500MB", 500 * 10**6), ("1.5GiB", 3 * 2**29), ("1.5 gib", 3 * 2**29), ("2e9", 2 * 10**9),
    ("64k", 64 * 1024), ("64kB", 64_000), (" 1000 ", 1000), ("7", 7), ("3TB", 3 * 10**12),
])
def test_a_size_string_is_read_as_bytes(text, bytes_):
    assert byte_size(text) == bytes_


@given(st.integers(1, 2**62) | st.floats(1, 1e18))
def test_a_number_is_its_own_bytes(value):
    assert byte_size(value) == int(value)
    assert byte_size(np.int64(1) * int(value)) == int(value)


@pytest.mark.parametrize("value", [
    math.nan, math.inf, -math.inf, -5, 0, 0.5, True, None, [500], "nan", "inf", "-5", "",
    "lots", "5XB", "5 M B", "1_000", "\uff11\uff10", "0x10", "1e", "0.1",
])
def test_no_size_is_refused_in_one_line_naming_the_argument(value):
    with pytest.raises(ValueError) as e:
        byte_size(value, "memory_budget")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("memory_budget: expected a number of bytes") and "found" in message
