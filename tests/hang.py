"""Hang guards that scale with the machine: a limit is a count of measured units, not seconds.

A subprocess a test starts is bounded only so that a hang fails the test instead of CI; the
bound must never fail a slow or busy machine. The unit is the time this machine takes to
start a Python that imports unroll, measured once per session.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
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


def at_once(call, *args, units: float = 10):
    """``call(*args)``'s value (or exception), run in a thread that must end within
    ``limit(units)``: a call that blocks (on a FIFO, say) fails the test, never hangs it."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call(*args)
        except BaseException as e:  # handed to the test's thread, which raises it
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit(units))
    assert not thread.is_alive(), f"{getattr(call, '__name__', call)} blocked"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
