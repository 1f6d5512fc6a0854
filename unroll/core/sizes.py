"""Sizes in bytes as a person gives them: a number, or a string such as ``"500MB"``.

Every option that takes a byte count (a net's ``memory_budget``, ``unroll memory
--budget``, the examples' ``--memory-budget``) reads it through :func:`byte_size`,
so each accepts the same spellings and refuses the same mistakes in the same words.

>>> byte_size("500MB"), byte_size("1.5GiB"), byte_size("2e9"), byte_size(4096)
(500000000, 1610612736, 2000000000, 4096)
"""

from __future__ import annotations

import argparse
import math
import numbers
import re

__all__ = ["byte_size", "byte_size_argument"]

#: a lone letter is binary (``64k`` is 65536), as the memory a person has in mind usually is
_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 2**20, "mb": 10**6,
          "mib": 2**20, "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12,
          "tib": 2**40}
#: an ASCII decimal number (``2e9`` included), then an optional unit
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?|\.[0-9]+(?:e[+-]?[0-9]+)?)"
                   r"\s*([a-z]*)\s*", re.ASCII)


def byte_size(value, name: str = "size") -> int:
    """``value`` (a number of bytes, or a string: ``"500MB"`` is 500 * 10**6 bytes,
    ``"1.5GiB"`` 1.5 * 2**30, ``"64k"`` 64 * 1024, ``"2e9"`` bytes) as whole bytes, at
    least 1. Anything else (nan, inf, a negative, a bool, junk) is a ValueError naming
    ``name``, what it expected and what it found.

    >>> byte_size("64k"), byte_size(" 1000 "), byte_size(1.5e3)
    (65536, 1000, 1500)
    >>> byte_size(float("nan"), "memory_budget")
    Traceback (most recent call last):
    ValueError: memory_budget: expected a number of bytes of at least 1, or a size such as \
'500MB' or '1.5GiB', found nan
    """
    found = _bytes(value)
    if isinstance(found, str):
        raise ValueError(f"{name}: {_EXPECTED}, found {found}")
    return found


def byte_size_argument(text: str) -> int:
    """:func:`byte_size` as an argparse ``type``: argparse names the option in its error.

    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> _ = parser.add_argument("--budget", type=byte_size_argument)
    >>> parser.parse_args(["--budget", "1.5GiB"]).budget
    1610612736
    """
    found = _bytes(text)
    if isinstance(found, str):
        raise argparse.ArgumentTypeError(f"{_EXPECTED}, found {found}")
    return found


_EXPECTED = "expected a number of bytes of at least 1, or a size such as '500MB' or '1.5GiB'"


def _bytes(value) -> int | str:
    """The bytes ``value`` says, or (a string) how to show a ``value`` that says none."""
    if isinstance(value, str):
        match = _SIZE.fullmatch(value.lower())
        if match is None or match[2] not in _UNITS:
            return repr(value)
        number = float(match[1]) * _UNITS[match[2]]
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
    else:
        return f"{value!r} ({type(value).__name__})"
    if not math.isfinite(number) or number < 1:
        return repr(value) if isinstance(value, str) else str(value)
    return int(number)
