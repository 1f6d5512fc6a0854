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
