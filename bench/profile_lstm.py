"""Where an LSTM layer's training step spends its time, phase by phase.

The step of ``bench/bench_lstm.py`` (``unroll.expand("lstm")`` + EuclideanLoss, SGD,
float32), with every layer's forward, backward and batched weight gradient timed
by the process's CPU time and summed into phases:

- input projection: the one InnerProduct over all T steps (forward);
- recurrent GEMMs: each step's h_{t-1} W_hc^T (forward);
- cells: LSTMUnit, the cont Scale and the gate Eltwise, forward and backward;
- data-gradient GEMMs: each step's d gates W_hc (backward);
- weight-gradient GEMMs: W_hc's (all steps in one) and W_xc's;
- loss, update, and dispatch (the rest: the net's loops, fills, inputs).

Run one thread (``OPENBLAS_NUM_THREADS=1``) on a busy machine: CPU time is then
what other processes' time slices do not inflate.

    OPENBLAS_NUM_THREADS=1 python -m bench.profile_lstm --hidden 512
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np

PHASES = ("input projection", "recurrent GEMMs", "cells", "data-gradient GEMMs",
          "weight-gradient GEMMs", "loss", "update", "dispatch")


def phase_of(layer, method: str) -> str:
    """The phase a layer's ``method`` (forward, backward, param_backward) belongs to."""
    if layer.type == "InnerProduct":
        recurrent = not layer.name.startswith("x_proj")
        if method == "param_backward":
            return "weight-gradient GEMMs"
        if method == "forward":
            return "recurrent GEMMs" if recurrent else "input projection"
        # a backward: the data gradient; the input projection's holds its weight gradient
        return "data-gradient GEMMs" if recurrent else "weight-gradient GEMMs"
    if layer.type in ("LSTMUnit", "Scale", "Eltwise"):
        return "cells"
    if layer.type.endswith("Loss"):
        return "loss"
    return "dispatch"


def profile(T: int, N: int, D: int, H: int, steps: int) -> tuple[float, dict[str, float]]:
    """(ms per step, ms per step of each phase) over ``steps`` steps after a warm-up."""
    from unroll import Net, Solver, expand  # the names of every layout (--baseline)

    net_param = expand("lstm", steps=T, batch=N, input_dim=D, hidden=H)
    target = net_param.layer.add(name="target", type="Input", top=["target"])
    target.input_param.shape.add(dim=[T, N, H])
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"],
                        top=["loss"])
    net = Net(net_param)
    solver = Solver(net, type="SGD", base_lr=0.01)
    rng = np.random.default_rng(0)
    cont = np.ones((T, N), np.float32)
    cont[0] = 0
    feed = {"x": rng.standard_normal((T, N, D)).astype(np.float32), "cont": cont,
            "target": rng.uniform(-1, 1, (T, N, H)).astype(np.float32)}
    solver.step(3, feed=feed)
    spent = collections.defaultdict(float)

    def timed(method, phase):
        def run(*args):
            start = time.process_time()
            method(*args)
            spent[phase] += time.process_time() - start
        return run

    for layer in net.layers:
        # a batched weight gradient runs in the net's backward loop, apart from the layer's
        # backward; an unbatched one inside it, timed there
        batched = getattr(layer, "param_diffs_batched", False)
        for name in ("forward", "backward") + (("param_backward",) if batched else ()):
            setattr(layer, name, timed(getattr(layer, name), phase_of(layer, name)))
    update = timed(solver.update, "update")
    start = time.process_time()
    for _ in range(steps):
        net.clear_param_diffs()
        net.forward(**feed)
        net.backward()
        update()
    total = time.process_time() - start
    spent["dispatch"] += total - sum(spent.values())
    return 1e3 * total / steps, {phase: 1e3 * spent[phase] / steps for phase in PHASES}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25, help="T (default 25)")
    parser.add_argument("--batch", type=int, default=32, help="N (default 32)")
    parser.add_argument("--input-dim", type=int, default=100, help="D (default 100)")
    parser.add_argument("--hidden", type=int, default=128, help="H (default 128)")
    parser.add_argument("--iters", type=int, default=20, help="steps timed")
    args = parser.parse_args(argv)
    ms, phases = profile(args.steps, args.batch, args.input_dim, args.hidden, args.iters)
    print(f"lstm T={args.steps} N={args.batch} D={args.input_dim} H={args.hidden}: "
          f"{ms:.2f} ms per step (CPU time)")
    for phase, value in phases.items():
        print(f"  {phase:22s} {value:7.2f} ms  {100 * value / ms:4.0f}%")


if __name__ == "__main__":
    main()
