"""The cost of one layout: CPU seconds per ``memory.layout`` call while ``Net()`` plans.

For ``bench_recompute``'s LSTM layer (N=32, H=256, a Euclidean loss at every step) at T
steps (``--steps``): the CPU seconds of ``Net()`` without a budget and the full plan's
layout in it, then of ``Net(memory_budget=)`` at ``--budget`` of the full plan, with its
layouts (one per attempt) and their mean, and within them ``place`` (the placement).
CPU seconds, which a busy machine disturbs less than the wall clock; the least of
``--repeat`` runs.

It measures the checkout it runs in: for a before and after, run it in both, e.g. from a
checkout of an older commit ``PYTHONPATH=. python <this checkout>/bench/bench_layout.py``.

    python -m bench.bench_layout                       (from the repository root)
    python -m bench.bench_layout --steps 2000 20000 --budget 0.02
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections import Counter

from bench.bench_recompute import lstm_net


def timed(module, name: str, seconds: Counter, calls: Counter) -> None:
    """Count the CPU seconds and calls of ``module.name`` into ``seconds`` and ``calls``."""
    fn = getattr(module, name)

    def wrapper(*args, **kwargs):
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[name] += time.process_time() - start
            calls[name] += 1

    setattr(module, name, wrapper)


def figures(T: int, budget: float) -> dict:
    from unroll import Net
    from unroll.engine import memory

    seconds, calls = Counter(), Counter()
    timed(memory, "layout", seconds, calls)
    timed(importlib.import_module("unroll.engine.memory.layout"), "place", seconds, calls)
    Net(lstm_net(70, 32, 256, per_step=True), recompute="sqrt")  # compiled kernels, imports
    seconds.clear()
    calls.clear()
    net_param = lstm_net(T, 32, 256, per_step=True)
    start = time.process_time()
    full = Net(net_param)
    out = {"full": time.process_time() - start, "full layout": seconds["layout"]}
    seconds.clear()
    calls.clear()
    start = time.process_time()
    Net(net_param, memory_budget=int(full.inspect().recompute["planned_bytes"] * budget))
    out.update(budgeted=time.process_time() - start, layouts=calls["layout"],
               layout=seconds["layout"], place=seconds["place"])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", default=[20000])
    parser.add_argument("--budget", type=float, default=0.02, help="fraction of the full plan")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    for T in args.steps:
        runs = [figures(T, args.budget) for _ in range(args.repeat)]
        best = {key: min(run[key] for run in runs) for key in runs[0]}
        n = best["layouts"]
        print(f"T={T}: Net() {best['full']:.2f} s CPU, its layout {best['full layout']:.2f} s; "
              f"budget {args.budget:g}: Net() {best['budgeted']:.2f} s CPU, {n} layouts "
              f"{best['layout']:.2f} s ({best['layout'] / n:.3f} s each, place "
              f"{best['place'] / n:.3f} s each)")


if __name__ == "__main__":
    main()
