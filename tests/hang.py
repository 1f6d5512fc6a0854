"""Hang guards that scale with the machine: a limit is a count of measured units, not seconds.

A subprocess a test starts is bounded only so that a hang fails the test instead of CI; the
bound must never fail a slow or busy machine. The unit is the time this machine takes to
start a Python that imports unroll, measured once per session.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time


@functools.cache
def unit() -> float:
    """Seconds to start ``python -c "import unroll"`` here, now (at least 0.5)."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import unroll"], check=True, capture_output=True)
    return max(0.5, time.monotonic() - started)


def limit(units: float) -> float:
    """A timeout of ``units`` start-up times, for a subprocess that should take a few."""
    return units * unit()
