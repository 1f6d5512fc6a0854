"""Training an LSTM layer in a memory budget: planned bytes, workspace and step time.

One unrolled LSTM layer (``unroll.expand("lstm")``, H hidden, N sequences, T
steps) under a Euclidean loss, planned four ways: the full plan, Chen et al.'s
``recompute="sqrt"`` segments, and ``memory_budget`` of 1/4 and 1/10 of the
full plan (``--budgets``). For each: the bytes planned (workspace and kept blobs), the
workspace's high-water mark after a training step, the recomputed forward
steps, and the median time of a training step (forward and backward) as a ratio
to the full plan's. A budget no plan fits is reported with the smallest that
works. Beside them, Gruslys et al.'s BPTT-HSM optimum for T steps and as many
kept states as the sqrt plan has segments. A benchmark, not a test: ratios only
on a shared machine.

    python -m bench.bench_recompute --steps 1000 --hidden 256 --batch 32
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from unroll import Net, expand
from unroll.core.errors import MemoryBudgetError
from unroll.core.proto import LayerParameter
from unroll.engine.memory_plan import bptt_hsm


def lstm_net(T: int, N: int, H: int, per_step: bool = False):
    """One LSTM layer under a Euclidean loss: over the whole (T, N, H) output, or with
    ``per_step`` one loss a step, right after it (the output is then never whole: what a
    long stream trains with, and what a budget far under the full plan needs)."""
    net_param = expand("lstm", steps=T, batch=N, input_dim=H, hidden=H)
    target = net_param.layer.add(name="target", type="Input", top=["target"])
    target.input_param.shape.add(dim=[T, N, H])
    net_param.force_backward = True
    if not per_step:
        net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"],
                            top=["loss"])
        return net_param
    layers = list(net_param.layer)
    concat = next(lp for lp in layers if list(lp.top) == ["h"])
    step_of = {h: t for t, h in enumerate(concat.bottom)}
    cut = LayerParameter(name="target_slice", type="Slice", bottom=["target"],
                         top=[f"target_t{t}" for t in range(T)])
    cut.slice_param.axis = 0
    del net_param.layer[:]
    net_param.layer.extend([layers[-1], cut])  # the target's Input, then its steps
    for lp in layers[:-1]:
        if lp is concat:
            continue
        net_param.layer.append(lp)
        for top in lp.top:
            if top in step_of:
                t = step_of[top]
                net_param.layer.add(name=f"loss_t{t}", type="EuclideanLoss",
                                    bottom=[top, f"target_t{t}"], top=[f"loss_t{t}"])
    return net_param


def step_seconds(net, feed, iters: int) -> float:
    times = []
    for _ in range(iters + 1):  # the first binds the workspace
        start = time.perf_counter()
        net.forward(**feed)
        net.clear_param_diffs()
        net.backward()
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="T (default 1000)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--iters", type=int, default=1)
    parser.add_argument("--budgets", type=float, nargs="+", default=[1 / 4, 1 / 10],
                        metavar="FRACTION", help="budgets, as fractions of the full plan "
                        "(default 0.25 0.1)")
    args = parser.parse_args(argv)
    T, N, H = args.steps, args.batch, args.hidden
    net_param = lstm_net(T, N, H)
    rng = np.random.default_rng(0)
    cont = np.ones((T, N))
    cont[0] = 0
    feed = dict(x=rng.normal(size=(T, N, H)), cont=cont, target=rng.normal(size=(T, N, H)))
    full = Net(net_param)
    base = step_seconds(full, feed, args.iters)
    need = full.inspect().recompute["planned_bytes"]
    print(f"LSTM layer T={T} N={N} H={H}: full plan {need / 2**20:.1f} MiB planned, "
          f"workspace {full.workspace.nbytes / 2**20:.1f} MiB")
    del full
    segments = None
    for label, options in (("sqrt", {"recompute": "sqrt"}),
                           *((f"{f:g}", {"memory_budget": int(need * f)}) for f in args.budgets)):
        start = time.perf_counter()
        try:
            net = Net(net_param, **options)
        except MemoryBudgetError as e:
            print(f"{label:>5}: refused, the smallest plan needs {e.smallest / 2**20:.1f} MiB "
                  f"({e.smallest / need:.2f} of the full plan)")
            continue
        planning = time.perf_counter() - start
        seconds = step_seconds(net, feed, args.iters)
        plan = net.inspect().recompute
        if label == "sqrt":
            segments = len(plan["checkpoints"]) + 1
        print(f"{label:>5}: planned {plan['planned_bytes'] / need:.2f} of the full plan, "
              f"workspace {net.workspace.nbytes / 2**20:.1f} MiB, "
              f"{plan['recomputed_steps']} steps recomputed (forward x {plan['factor']:.2f}), "
              f"step time x {seconds / base:.2f}, planned in {planning:.1f} s")
        del net
    if segments:
        print(f"BPTT-HSM optimum for {T} steps and {segments} kept states: "
              f"{bptt_hsm(T, segments) / T:.2f} forward steps per step")


if __name__ == "__main__":
    main()
