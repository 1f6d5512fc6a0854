"""Timing for the benchmarks: medians over rounds, after a warm-up; timers put in place."""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

_NONE = object()


def median_seconds(run, iters: int, rounds: int, warmup: int = 3) -> float:
    """Median over ``rounds`` of the mean seconds per call of ``iters`` calls of ``run``,
    after ``warmup`` calls that take first-call costs (compilation, allocation) away."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            run()
        times.append((time.perf_counter() - start) / iters)
    return statistics.median(times)


def least_us_per_call(runs: dict, clock, calls: int, rounds: int, warmup: int = 20) -> dict:
    """{name: the least over ``rounds`` of the mean µs per call of ``runs[name]``}, the
    rounds of the runs taken in turns, so a busy machine slows each alike (the least: the
    round its other work slowed down least); ``warmup`` calls of each first."""
    best = dict.fromkeys(runs, float("inf"))
    for run in runs.values():
        for _ in range(warmup):
            run()
    for _ in range(rounds):
        for name, run in runs.items():
            start = clock()
            for _ in range(calls):
                run()
            best[name] = min(best[name], (clock() - start) / calls * 1e6)
    return best


@contextmanager
def patched():
    """A ``patch(owner, name, value)`` that sets ``owner.name`` for the block: after it the
    owner's own attribute comes back, or where it had none the class's shows through."""
    saved = []

    def patch(owner, name, value):
        saved.append((owner, name, vars(owner).get(name, _NONE)))
        setattr(owner, name, value)

    try:
        yield patch
    finally:
        for owner, name, value in reversed(saved):
            if value is _NONE:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def layer_passes(nets):
    """``(layer, method name)`` of every layer's forward, backward and, where the net
    batches it, weight gradient (``param_backward``) in ``nets``: what a profile times."""
    for net in nets:
        for layer in net.layers:
            batched = getattr(layer, "param_diffs_batched", False)
            for name in ("forward", "backward") + (("param_backward",) if batched else ()):
                yield layer, name
