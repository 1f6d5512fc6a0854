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

``--torch-python PATH`` profiles PyTorch's ``nn.LSTM`` doing the same step (the step of
``bench/bench_lstm.py``) in a process of its own, with ``torch.profiler``: the operators
it runs and each one's self CPU time per step. On CPU, float32, it runs oneDNN's fused
RNN primitive (``aten::mkldnn_rnn_layer`` and its backward): the whole layer's GEMMs and
gates in one call each way, not one GEMM a step through ``torch.mm``.

    OPENBLAS_NUM_THREADS=1 python -m bench.profile_lstm --hidden 512
    python -m bench.profile_lstm --hidden 512 --torch-python PATH/TO/venv/bin/python --threads 1
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

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


def torch_profile(T: int, N: int, D: int, H: int, steps: int, threads: int) -> dict:
    """{operator: self CPU ms per step} of PyTorch's nn.LSTM doing the step, by
    ``torch.profiler`` over ``steps`` steps after a warm-up (in this process)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cell = torch.nn.LSTM(D, H)
    optimizer = torch.optim.SGD(cell.parameters(), lr=0.01)
    x, y = torch.randn(T, N, D), torch.rand(T, N, H) * 2 - 1

    def step():
        optimizer.zero_grad(set_to_none=True)
        h, _ = cell(x)
        (((h - y) ** 2).sum() / (2 * N)).backward()
        optimizer.step()

    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25, help="T (default 25)")
    parser.add_argument("--batch", type=int, default=32, help="N (default 32)")
    parser.add_argument("--input-dim", type=int, default=100, help="D (default 100)")
    parser.add_argument("--hidden", type=int, default=128, help="H (default 128)")
    parser.add_argument("--iters", type=int, default=20, help="steps timed")
    parser.add_argument("--torch-python", help="a Python with torch: profile nn.LSTM too")
    parser.add_argument("--threads", type=int, default=1, help="torch's threads (default 1)")
    parser.add_argument("--side", choices=["torch"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = (args.steps, args.batch, args.input_dim, args.hidden, args.iters)
    if args.side:
        print(json.dumps(torch_profile(*sizes, args.threads)))
        return
    ms, phases = profile(*sizes)
    print(f"lstm T={args.steps} N={args.batch} D={args.input_dim} H={args.hidden}: "
          f"{ms:.2f} ms per step (CPU time)")
    for phase, value in phases.items():
        print(f"  {phase:22s} {value:7.2f} ms  {100 * value / ms:4.0f}%")
    if args.torch_python:
        command = [args.torch_python, "-m", "bench.profile_lstm", "--side", "torch",
                   *(sys.argv[1:] if argv is None else argv)]
        out = subprocess.run(command, capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parents[1]).stdout
        ops = json.loads(out.strip().splitlines()[-1])
        total = sum(ops.values())
        print(f"torch nn.LSTM, {args.threads} thread(s): {total:.2f} ms per step (operators"
              "' self time, torch.profiler: wall time, which a busy machine inflates)")
        for op, value in sorted(ops.items(), key=lambda kv: -kv[1])[:8]:
            print(f"  {op:40s} {value:7.2f} ms  {100 * value / total:4.0f}%")


if __name__ == "__main__":
    main()
