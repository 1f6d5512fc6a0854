"""Microseconds per layer call of the run loop, and the fixed cost of one net run.

Per layer: an unrolled LSTM (``unroll.expand("lstm")`` + EuclideanLoss) with
N = D = H = 1, so that the arithmetic is negligible and what remains is dispatch:
the run loop, each layer's Python and NumPy's call overhead. Prints the median
microseconds per layer call of forward and of backward over several rounds.

Per run (``--fixed``): what every ``Net.forward`` pays whatever its layers, at
batch 1: the run guard (the thread policy, the BLAS pool, the memory gate), a
``set_input`` of a cont and of Embed's ids, a one-layer net's forward, and a Stepper
call of a one-step LSTM. ``--against TREE`` runs the same figures with the
``unroll`` of another checkout (the main branch: before) and this one (after) in
turns, one round each at a time, each in a process of its own, and prints both and
their ratio. ``--clock cpu`` (the default there) takes CPU time, for a busy machine.
A benchmark, not a test: run it on an idle machine.

    python -m bench.bench_dispatch                (from the repository root)
    python -m bench.bench_dispatch --steps 200
    python -m bench.bench_dispatch --fixed
    python -m bench.bench_dispatch --fixed --against ../main --rounds 9
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: the checkout this file belongs to
HERE = Path(__file__).resolve().parents[1]


def per_layer(args) -> None:
    from bench.timing import median_seconds
    from unroll import Net, expand

    T = args.steps
    net_param = expand("lstm", steps=T, batch=1, input_dim=1, hidden=1)
    target = net_param.layer.add(name="target", type="Input", top=["target"])
    target.input_param.shape.add(dim=[T, 1, 1])
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"],
                        top=["loss"])
    net = Net(net_param)
    cont = np.ones((T, 1))
    cont[0] = 0
    net.forward(x=np.ones((T, 1, 1)), cont=cont, target=np.zeros((T, 1, 1)))
    calls_fwd = len(net.layers_run)
    calls_bwd = sum(net.layer_need_backward)
    forward = median_seconds(net.forward, args.iters, args.rounds)
    both = median_seconds(lambda: (net.forward(), net.backward()), args.iters, args.rounds)
    print(f"unrolled LSTM, T={T}, N=D=H=1: {calls_fwd} layer calls forward, "
          f"{calls_bwd} backward")
    print(f"forward   {forward / calls_fwd * 1e6:6.2f} us per layer call")
    print(f"backward  {(both - forward) / calls_bwd * 1e6:6.2f} us per layer call")


def fixed_runs() -> dict:
    """{what: a call of it}: the parts of one net run's fixed cost, at batch 1."""
    from unroll import Net, Stepper, expand
    from unroll.engine import executor

    tiny = Net('''layer { name: "in" type: "Input" top: "a" input_param { shape { dim: 1 } } }
                  layer { name: "p" type: "Power" bottom: "a" top: "b" }''')
    embed = Net('''
      layer { name: "in" type: "Input" top: "ids" top: "cont"
              input_param { shape { dim: 1 dim: 1 } shape { dim: 1 dim: 1 } } }
      layer { name: "e" type: "Embed" bottom: "ids" top: "v"
              embed_param { num_output: 4 input_dim: 10 } }
      layer { name: "s" type: "Scale" bottom: "v" bottom: "cont" top: "w"
              scale_param { axis: 0 } }''', phase="test")
    step = Stepper(expand("lstm", steps=1, batch=1, input_dim=4, hidden=4, expose_hidden=True))
    one, ids, x = np.ones(1, np.float32), np.ones((1, 1), np.float32), np.ones((1, 1, 4))
    step(x=x, cont=ids)

    def guard():
        with executor.running(tiny._gate, tiny.regions, tiny._fwd, "forward"):
            pass

    return {"run guard": guard,
            "set_input cont": lambda: embed.set_input("cont", ids),
            "set_input Embed ids": lambda: embed.set_input("ids", ids),
            "one-layer forward": lambda: tiny.forward(a=one),
            "Embed+Scale forward": lambda: embed.forward(ids=ids, cont=ids),
            "Stepper call, LSTM H=4": lambda: step(x=x, cont=ids)}


def fixed_round(clock, calls: int, rounds: int) -> dict:
    """{what: the least over ``rounds`` of the mean µs per call}, the parts in turns."""
    from bench.timing import least_us_per_call

    return least_us_per_call(fixed_runs(), clock, calls, rounds, warmup=100)


def in_process(tree: Path, args) -> dict:
    """One round of :func:`fixed_round` with the ``unroll`` of checkout ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(Path(__file__).resolve()), "--fixed", "--json",
               "--rounds", "1", "--calls", str(args.calls), "--clock", args.clock]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    imported = Path(found.pop("unroll"))
    if tree not in imported.parents:
        raise SystemExit(f"bench_dispatch: the run meant for {tree} imported {imported}")
    return found


def fixed(args) -> None:
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.json:
        import unroll

        print(json.dumps({**fixed_round(clock, args.calls, args.rounds),
                          "unroll": unroll.__file__}))
        return
    trees = {"after": HERE} if args.against is None else {
        "before": Path(args.against).resolve(), "after": HERE}
    best: dict = {side: {} for side in trees}
    for _ in range(args.rounds):  # in turns: a busy machine slows each side alike
        for side, tree in trees.items():
            for name, us in in_process(tree, args).items():
                best[side][name] = min(best[side].get(name, float("inf")), us)
    print(f"µs per call ({args.clock} time, least of {args.rounds} rounds of "
          f"{args.calls} calls), batch 1: " + ", ".join(f"{s} {t}" for s, t in trees.items()))
    for name, after in best["after"].items():
        if "before" in best:
            before = best["before"][name]
            print(f"  {name:24s} {before:7.2f} -> {after:7.2f}  ({after / before:.2f}x)")
        else:
            print(f"  {name:24s} {after:7.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="T (default 100)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--fixed", action="store_true",
                        help="the fixed cost of one net run, not the cost per layer")
    parser.add_argument("--against", metavar="TREE",
                        help="--fixed: also with the unroll of checkout TREE (before), in turns")
    parser.add_argument("--calls", type=int, default=2000, help="--fixed: calls per round")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="--fixed: cpu: process CPU time (a busy machine), wall: elapsed")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fixed:
        fixed(args)
    else:
        per_layer(args)


if __name__ == "__main__":
    main()
