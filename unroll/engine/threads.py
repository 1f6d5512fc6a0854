"""BLAS threads that respect the machine: never more threads than free cores.

OpenBLAS starts one thread per core and has them spin-wait for each other at
every GEMM. On a machine whose cores are busy with other work (a second
training, a browser, the other ranks of a data-parallel job) a thread that
waits for a descheduled partner burns its time slice: a small GEMM went from
1 ms to 53 ms, a tagger epoch from 80 s to over 800 s. So every net run asks
:func:`run_threads` how many BLAS threads it may use, and the answer is the
cores this process may run on, less the cores other processes kept busy over
the last second (``psutil``'s counters: the machine's busy time less our own, less
the counters' own rounding, so a free core is never given up for it).

``UNROLL_NUM_THREADS=N`` or :func:`set_num_threads` fixes the count instead
(the tagger's ``--threads``). The pool is set for the run and restored after,
so code around a net (the user's own NumPy) keeps the size it had.

>>> set_num_threads(1)
>>> with run_threads() as n:
...     n
1
>>> set_num_threads(None)  # back to the measured policy
"""

from __future__ import annotations

import functools
import os
import threading
import time

__all__ = ["ENV", "cores", "num_threads", "others_busy", "run_threads", "set_num_threads"]

ENV = "UNROLL_NUM_THREADS"
#: how long a measurement of the other processes' load stands before it is taken again
MEASURE_EVERY = 1.0

#: the seconds of one tick of the kernel's CPU-time counters (Linux's USER_HZ, else 100 Hz)
TICK = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)

#: the first measurement's interval: long enough that the counters' rounding (a tick a
#: core, see ``_Load._measure``) is well under half a core on a small machine, so that
#: neither a free core nor a busy one is mistaken for the other (0.15 s: 0.2 cores on 2)
FIRST_INTERVAL = 0.15

_fixed: int | None = None


def set_num_threads(n: int | None) -> None:
    """Fix the BLAS threads of every net run to ``n`` (None: measure free cores again)."""
    global _fixed
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"the number of threads must be an integer >= 1, found {n!r}")
    _fixed = n


def cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one), as read
    with the last load measurement (:data:`MEASURE_EVERY` seconds ago at most)."""
    return _load().cores()


def _allowed() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return list(range(os.cpu_count() or 1))


class _Load:
    """The cores that other processes kept busy, from psutil's counters over the last interval:
    the busy time of the cores this process may run on (a job pinned to other cores takes
    nothing from it), less this process's own. The cores themselves (the affinity mask) are
    read with each measurement, so a net run pays for neither more than once a second."""

    def __init__(self):
        import psutil

        self._process = psutil.Process()
        self._psutil = psutil
        self._cpus = set(_allowed())
        self._lock = threading.Lock()
        self._at, self._busy, self._own = self._sample()
        time.sleep(FIRST_INTERVAL)  # so the first run already sees the machine
        self._others = 0.0
        self._measure(self._at + FIRST_INTERVAL)

    def _sample(self) -> tuple[float, float, float]:
        per_cpu = self._psutil.cpu_times(percpu=True)
        busy = sum(t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0)
                   + getattr(t, "softirq", 0.0)
                   for k, t in enumerate(per_cpu) if k in self._cpus)
        own = self._process.cpu_times()
        return time.monotonic(), busy, own.user + own.system

    def _measure(self, now: float) -> None:
        at, busy, own = self._sample()
        if at > self._at:
            # the counters tick in whole clock ticks: each core's busy time and our own are
            # off by up to a tick, which over a short interval is much of a core; that much
            # is not taken for another process's load, so a free core is never given up
            # for a rounding of the counters
            error = (len(self._cpus) + 1) * TICK
            taken = (busy - self._busy) - (own - self._own) - error
            self._others = max(0.0, taken) / (at - self._at)
        self._at, self._busy, self._own = at, busy, own
        allowed = set(_allowed())
        if allowed != self._cpus:  # the next interval counts the new cores from now
            self._cpus = allowed
            self._at, self._busy, self._own = self._sample()

    def others(self) -> float:
        """Cores' worth of CPU time other processes used, measured at most MEASURE_EVERY ago."""
        now = time.monotonic()
        if now - self._at >= MEASURE_EVERY and self._lock.acquire(blocking=False):
            try:
                self._measure(now)
            finally:
                self._lock.release()
        return self._others

    def cores(self) -> int:
        """The cores this process may run on, as last measured."""
        return len(self._cpus)


@functools.cache
def _load() -> _Load:
    return _Load()


def others_busy() -> float:
    """Cores' worth of CPU time that other processes used over the last interval
    (:data:`MEASURE_EVERY` seconds at most): the machine's busy time less this process's."""
    return _load().others()


#: UNROLL_NUM_THREADS as ``os.environ`` stores it: every net run reads it, and
#: ``os.environ.get`` of an unset name costs a raised and caught KeyError (~2 µs, more than
#: the rest of the run guard); the mapping under it answers in a dict lookup and sees every
#: change made through ``os.environ``
_ENV_KEY = os.environ.encodekey(ENV)
#: the last value read and its count, so a set variable is parsed once, not every run
_env_parsed: tuple = (None, None)


def num_threads() -> int:
    """The BLAS threads a net run uses now: fixed, from UNROLL_NUM_THREADS, or free cores."""
    global _env_parsed
    if _fixed is not None:
        return _fixed
    raw = os.environ._data.get(_ENV_KEY)
    if raw:
        if raw == _env_parsed[0]:
            return _env_parsed[1]
        env = os.environ.decodevalue(raw)
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{ENV} must be an integer >= 1, found {env!r}")
        _env_parsed = (raw, n)
        return n
    n = cores()
    return max(1, min(n, round(n - others_busy())))


@functools.cache
def _blas() -> tuple:
    """(get, set) of the thread count of each BLAS library loaded (NumPy's OpenBLAS, MKL),
    from threadpoolctl's controllers.

    threadpoolctl 3.8's OpenBLAS ``set_num_threads`` does nothing on any Python thread but
    the first that called it, so a net run on another thread (a server's worker, a
    training loop in a thread) ran on the pool's own count; the setter under it is called
    instead, where there is one. OpenBLAS's pool is one per process: two nets run at once
    from two threads each set it for their run, the last one's count standing."""
    import numpy  # noqa: F401  (its BLAS must be loaded to be found)
    from threadpoolctl import ThreadpoolController

    return tuple((lib.get_num_threads, getattr(lib, "_real_set_num_threads", lib.set_num_threads))
                 for lib in ThreadpoolController().select(user_api="blas").lib_controllers)


class run_threads:
    """Set every loaded BLAS to ``n`` threads (default :func:`num_threads`) for a block.

    The count is decided when this is called, so a bad ``UNROLL_NUM_THREADS`` is an
    error before the block runs; entering yields it, leaving restores each library's own
    count. Cheap when nothing changes (two reads of the pool size), so every net run
    uses it.
    """

    __slots__ = ("n", "_changed")

    def __init__(self, n: int | None = None):
        self.n = num_threads() if n is None else n

    def __enter__(self) -> int:
        n, self._changed = self.n, []
        for get, put in _blas():
            old = get()
            if old != n:  # only what changed is undone after
                put(n)
                self._changed.append((put, old))
        return n

    def __exit__(self, *exc) -> None:
        for put, old in self._changed:
            put(old)

