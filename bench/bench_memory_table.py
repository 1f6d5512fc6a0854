"""The memory-budget figure table: an LSTM layer under a loss at each step and under one loss
over its whole (T, N, H) output, at T steps, planned in the full plan, budgets of 1/4, 1/10
and 1/50 of it and BPTT-HSM; PyTorch's ``checkpoint_sequential`` beside them; and the
smallest budget a character LM's training net (the shape of ``examples/charlm`` at
``--charlm-steps``) can be planned in, over its full plan, with its whole-output loss
left whole and run by chunks of time (docs/design.md, 6. Memory).

Each row is one process of :mod:`bench.bench_recompute` (its nets, its measurements: bytes
planned over the full plan's, peak RSS growth over the full run's, the median step time
over the full run's, planning seconds of wall and of CPU); a budget no plan fits gives the
smallest plan found, over the full plan. The torch rows are ``nn.LSTM`` (everything kept)
and ``checkpoint_sequential`` in sqrt(T) segments over a chain of ``nn.LSTMCell`` steps
with the same loss summed over the steps, as ratios to torch's own full run. Ratios are
from the same turn; on a shared machine quote only them. ``--plan-only`` builds and plans
the nets and runs no step (no RSS, no step time).

    python -m bench.bench_memory_table --steps 1000 5000 20000 --torch-python PATH/TO/python
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.bench_recompute import run_side

LOSSES = ("per-step", "whole")


def side_args(args, loss: str) -> argparse.Namespace:
    """What :func:`bench.bench_recompute.run_side` reads, for one loss."""
    return argparse.Namespace(batch=args.batch, hidden=args.hidden, iters=args.iters,
                              loss=loss, threads=args.threads, plan_only=args.plan_only)


def ratio(got: dict, full: dict, key: str) -> str:
    if key not in got or not full.get(key):
        return "-"
    return f"{got[key] / full[key]:.3f}"


def unroll_rows(args, T: int, loss: str) -> None:
    sides = side_args(args, loss)
    full = run_side("unroll", sys.executable, sides, T, "full")
    if full is None:
        print(f"| {T} | {loss} | full | failed (see stderr) | | | |")
        return
    ran = ("- | -" if args.plan_only else
           f"1 ({full['rss'] / 2**20:.1f} MiB) | 1 ({full['seconds']:.2f} s)")
    print(f"| {T} | {loss} | full | 1 ({full['planned'] / 2**20:.1f} MiB) | {ran} | "
          f"{full['planning']:.1f} ({full['planning_cpu']:.1f} CPU) |")
    for config in [*map(str, args.budgets), "hsm"]:
        got = run_side("unroll", sys.executable, sides, T, config, full["planned"])
        label = config if config == "hsm" else f"1/{1 / float(config):g}"
        if got is None:
            print(f"| {T} | {loss} | {label} | failed (see stderr) | | | |")
        elif "refused" in got:
            print(f"| {T} | {loss} | {label} | refused: smallest "
                  f"{got['refused'] / full['planned']:.3f} | | | |")
        else:
            step = "-" if args.plan_only else f"{got['seconds'] / full['seconds']:.2f}"
            print(f"| {T} | {loss} | {label} | {ratio(got, full, 'planned')} | "
                  f"{'-' if args.plan_only else ratio(got, full, 'rss')} | {step} | "
                  f"{got['planning']:.1f} ({got['planning_cpu']:.1f} CPU) |")


def torch_rows(args, T: int) -> None:
    sides = side_args(args, "per-step")
    tf = run_side("torch", args.torch_python, sides, T, "full")
    tc = run_side("torch", args.torch_python, sides, T, "checkpoint")
    if tf is None or tc is None:
        print(f"| {T} | torch | | failed (see stderr) | | | |")
        return
    print(f"| {T} | torch | nn.LSTM | - | 1 ({tf['rss'] / 2**20:.1f} MiB) | 1 "
          f"({tf['seconds']:.2f} s) | - |")
    print(f"| {T} | torch | checkpoint_sequential sqrt(T) | - | {tc['rss'] / tf['rss']:.3f} | "
          f"{tc['seconds'] / tf['seconds']:.2f} | - |")


def charlm_floor(T: int, batch: int, symbols: int) -> None:
    """The smallest plan of the char LM's training net at ``T`` steps, over its full plan:
    with its loss over the whole output left whole (before) and run by chunks of time
    (after, :mod:`unroll.engine.memory.separable`)."""
    from examples.charlm.model import IGNORE, TEMPLATE
    from unroll import Net, expand
    from unroll.core.errors import MemoryBudgetError
    from unroll.engine.memory import separable

    def net_param():
        return expand(TEMPLATE, steps=T, batch=batch, symbols=symbols, part="train",
                      embed=64, hidden=256, ignore_label=IGNORE)

    start = time.perf_counter()
    full = Net(net_param()).inspect().recompute["planned_bytes"]
    planned_full = time.perf_counter() - start
    print(f"char LM T={T} N={batch} H=256 symbols={symbols}: full plan "
          f"{full / 2**20:.1f} MiB (planned in {planned_full:.1f} s)")
    for separate, label in ((False, "the loss whole (before)"),
                            (True, "the loss by chunks of time (after)")):
        separable.SEPARATE = separate
        start = time.perf_counter()
        try:
            Net(net_param(), memory_budget=1)
        except MemoryBudgetError as e:
            smallest = e.smallest
        finally:
            separable.SEPARATE = True
        print(f"  {label}: smallest plan found {smallest / 2**20:.1f} MiB = "
              f"{smallest / full:.3f} of the full plan (searched in "
              f"{time.perf_counter() - start:.1f} s)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="*", default=[1000, 5000, 20000],
                        help="T of the LSTM table (none: skip it)")
    parser.add_argument("--losses", nargs="+", choices=LOSSES, default=list(LOSSES))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--iters", type=int, default=2, help="timed steps after a first")
    parser.add_argument("--threads", type=int, default=1, help="threads per side")
    parser.add_argument("--budgets", type=float, nargs="+", default=[1 / 4, 1 / 10, 1 / 50],
                        metavar="FRACTION", help="budgets, as fractions of the full plan")
    parser.add_argument("--torch-python", default=None, help="a Python with torch")
    parser.add_argument("--plan-only", action="store_true",
                        help="only build and plan each net: no RSS, no step time")
    parser.add_argument("--charlm-steps", type=int, nargs="*", default=[2000],
                        help="T of the char LM's smallest budget (none: skip it)")
    parser.add_argument("--charlm-symbols", type=int, default=132)
    args = parser.parse_args(argv)
    if args.steps:
        table(args)
    for T in args.charlm_steps:
        charlm_floor(T, args.batch, args.charlm_symbols)


def table(args) -> None:
    print(f"LSTM layer H={args.hidden} N={args.batch}, float32, {args.threads} thread(s), "
          f"median of {args.iters} step(s) after a first; each row its own process; "
          f"ratios to the full run of the same T and loss")
    print("| T | loss | plan | planned / full | RSS growth / full | step time / full | "
          "planning s |")
    print("|---|---|---|---|---|---|---|")
    for T in args.steps:
        for loss in args.losses:
            unroll_rows(args, T, loss)
        if args.torch_python and not args.plan_only:
            torch_rows(args, T)


if __name__ == "__main__":
    main()
