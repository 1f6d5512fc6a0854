"""Timing for the benchmarks: medians over rounds, after a warm-up."""

from __future__ import annotations

import statistics
import time


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
