"""Training an LSTM layer in a memory budget: memory and step time, beside PyTorch.

One unrolled LSTM layer (``unroll.expand("lstm")``, H hidden, N sequences, T
steps, input width H) under a Euclidean loss at every step, right after it
(``--loss whole``: one loss over the whole (T, N, H) output, which then keeps
three T-long blobs of its own), planned six ways: the full plan, Chen et al.'s
``recompute="sqrt"`` segments, BPTT-HSM in its fewest slots (``recompute="hsm"``,
the least memory), and ``memory_budget`` of 1/4, 1/10 and 1/50 of the full plan
(``--budgets``). For a BPTT-HSM plan, its segments' forward runs beside the
dynamic program's optimum for as many steps and slots. Beside it, in the same
run, PyTorch: the fused ``nn.LSTM`` (everything kept) and
``torch.utils.checkpoint.checkpoint_sequential`` with sqrt(T) segments over a
chain of per-step ``nn.LSTMCell`` modules, the same loss.

Every configuration runs in its own process (unset OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE for both sides) a small net first (compiled kernels, imports),
then: the peak RSS growth over the process's RSS before the first step (the
memory a training step adds: activations, diffs, scratch; inputs and params
are there before), and the median time of a training step (forward and
backward) after a first one. For unroll also the
bytes planned (the workspace and kept blobs but the inputs), the workspace's
high-water mark, the forward steps recomputed, how long planning took (wall
and CPU seconds of ``Net()`` on the unrolled NetParameter) and how many plans with
recomputation it laid out of those a budget weighed (and apart from them the
CPU seconds of the unroller, ``expand``, before it; ``--plan-only`` builds and plans
the nets and runs no step). A
budget no plan fits is reported with the smallest that works. Ratios are to
each side's own full run, in the same turn. A benchmark, not a test: on a
shared machine quote the ratios.

``--charlm`` times ``unroll memory --budget`` instead, the whole command in a process
of its own (parsing the prototxt, building, planning), for the character LM's net
(examples/charlm: N=32, H=256, 132 symbols, one SoftmaxWithLoss over the whole
output) at each T, within ``--charlm-budget`` of its full plan.

    python -m bench.bench_recompute --steps 1000 5000 --torch-python PATH/TO/venv/bin/python
    python -m bench.bench_recompute --steps 20000 --plan-only --configs 0.02
    python -m bench.bench_recompute --steps 2000 --charlm
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: the steps of a first, small run in each process, before anything is measured
WARM_UP = 70


def lstm_net(T: int, N: int, H: int, per_step: bool = False):
    """One LSTM layer under a Euclidean loss: over the whole (T, N, H) output, or with
    ``per_step`` one loss a step, right after it (the output is then never whole: what a
    long stream trains with, and what a budget far under the full plan needs)."""
    from unroll import expand
    from unroll.core.proto import LayerParameter

    net_param = expand("lstm", steps=T, batch=N, input_dim=H, hidden=H)
    target = LayerParameter(name="target", type="Input", top=["target"])
    target.input_param.shape.add(dim=[T, N, H])
    net_param.force_backward = True
    if not per_step:  # the target first: under a budget the loss runs by chunks of time
        layers = list(net_param.layer)
        del net_param.layer[:]
        net_param.layer.extend([target, *layers])
        net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"],
                            top=["loss"])
        return net_param
    layers = [*net_param.layer, target]
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


def data(T: int, N: int, H: int):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, N, H)).astype(np.float32)
    target = rng.uniform(-1, 1, (T, N, H)).astype(np.float32)
    return x, target


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timed_steps(step, iters: int) -> tuple[float, int]:
    """The median seconds of a step after a first one, and the peak RSS growth."""
    before = rss_bytes()
    times = []
    for _ in range(iters + 1):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:])), peak_rss_bytes() - before


def unroll_side(args) -> dict:
    from unroll import Net
    from unroll.core.errors import MemoryBudgetError

    N, H = args.batch, args.hidden
    options = {"full": {}, "sqrt": {"recompute": "sqrt"},
               "hsm": {"recompute": "hsm"}}.get(args.config)
    if options is None:
        options = {"memory_budget": int(args.full_bytes * float(args.config))}

    def fed(net, T):
        x, y = data(T, N, H)
        cont = np.ones((T, N), np.float32)
        cont[0] = 0
        feed = {"x": x, "cont": cont, "target": y}

        def step():
            net.forward(**feed)
            net.clear_param_diffs()
            net.backward()

        for name, value in feed.items():  # the inputs and their diffs: there before a step
            net.blobs[name].data[...] = value
            net.blobs[name].diff[...] = 0
        return step

    # compiled kernels, imports: not the plan's
    fed(Net(lstm_net(WARM_UP, N, H, per_step=args.loss == "per-step"), recompute="sqrt"),
        WARM_UP)()
    laid_out = count_attempts()
    start_cpu = time.process_time()  # the unroller, timed apart from the net's planning
    net_param = lstm_net(args.T, N, H, per_step=args.loss == "per-step")
    expand_cpu = time.process_time() - start_cpu
    start, start_cpu = time.perf_counter(), time.process_time()
    try:
        net = Net(net_param, **options)
    except MemoryBudgetError as e:
        return {"refused": e.smallest}
    # CPU seconds beside wall seconds: on a shared machine the wall clock waits for others
    planning, planning_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    # --plan-only: the net is built and planned; its inputs are never filled
    seconds, rss = (1.0, 1) if args.plan_only else timed_steps(fed(net, args.T), args.iters)
    plan, rc = net.inspect().recompute, net.memory.liveness.recompute
    return {"seconds": seconds, "rss": rss, "planned": plan["planned_bytes"],
            "workspace": net.workspace.nbytes, "recomputed": plan["recomputed_steps"],
            "factor": plan["factor"], "checkpoints": len(plan["checkpoints"]),
            "planning": planning, "planning_cpu": planning_cpu, "expand_cpu": expand_cpu,
            "laid_out": len(laid_out),
            "policy": plan["policy"],
            "slots": rc.slots if rc is not None else None,
            "segment_runs": (len(rc.cuts) + 1 + sum(a >= 0 for a in rc.order)
                             if rc is not None else None)}


def count_attempts() -> list:
    """The plans with recomputation that planning lays out from now on, one entry each."""
    from unroll.engine import memory

    laid_out, layout = [], memory.layout

    def counted(plan, *args, **kwargs):
        if plan.recompute is not None:
            laid_out.append(plan.recompute.cuts)
        return layout(plan, *args, **kwargs)

    memory.layout = counted
    return laid_out


def torch_side(args) -> dict:
    import torch
    from torch.utils.checkpoint import checkpoint_sequential

    torch.manual_seed(0)
    N, H = args.batch, args.hidden

    def make(T):
        x, y = (torch.from_numpy(a) for a in data(T, N, H))
        x.requires_grad_(True)  # as unroll's force_backward: the input's diff too
        x.grad = torch.zeros_like(x)  # there before a step, as unroll's
        if args.config == "full":
            lstm = torch.nn.LSTM(H, H)

            def step():
                lstm.zero_grad()
                out, _ = lstm(x)
                loss = ((out - y) ** 2).sum() / (2 * N)  # the per-step losses, summed
                loss.backward()

            return step
        cell = torch.nn.LSTMCell(H, H)  # sqrt(T) segments over one LSTMCell a step
        # each step's input its own leaf: the gradient of a slice of one (T, N, H) leaf
        # would be a (T, N, H) array a step, T times
        xs = [x[t].detach().requires_grad_(True) for t in range(T)]
        for x_t in xs:
            x_t.grad = torch.zeros_like(x_t)

        class Step(torch.nn.Module):
            def __init__(self, t):
                super().__init__()
                self.t = t

            def forward(self, z):  # z = [h, c, the loss so far]
                h, c = cell(xs[self.t], (z[:, :H], z[:, H : 2 * H]))
                loss = ((h - y[self.t]) ** 2).sum(dim=1, keepdim=True) / (2 * N)
                return torch.cat([h, c, z[:, 2 * H :] + loss], dim=1)

        chain = torch.nn.Sequential(*(Step(t) for t in range(T)))
        segments = max(1, round(T ** 0.5))

        def step():
            cell.zero_grad()
            z = torch.zeros(N, 2 * H + 1)
            out = checkpoint_sequential(chain, segments, z, use_reentrant=False)
            out[:, 2 * H :].sum().backward()

        return step

    make(WARM_UP)()
    seconds, rss = timed_steps(make(args.T), args.iters)
    return {"seconds": seconds, "rss": rss}


def charlm_figures(args, T: int) -> None:
    """The seconds of ``unroll memory --budget`` for the character LM at ``T`` steps."""
    import tempfile

    from examples.charlm.model import IGNORE, TEMPLATE
    from unroll import Net, expand
    from unroll.core.proto import to_text

    net_param = expand(TEMPLATE, steps=T, batch=args.batch, symbols=132, part="train",
                       embed=64, hidden=args.hidden, ignore_label=IGNORE)
    full = Net(net_param).inspect().recompute["planned_bytes"]
    budget = int(full * args.charlm_budget)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "charlm.prototxt"
        path.write_text(to_text(net_param))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "unroll.tools.cli", "memory", str(path),
                               "--budget", str(budget)], cwd=ROOT, capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        print(f"charlm T={T} failed:\n{done.stderr.strip()[-2000:]}", file=sys.stderr)
        return
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"T={T} char LM (full plan {mib(full)}): unroll memory --budget "
          f"{args.charlm_budget:g} of it in {wall:.1f} s ({cpu:.1f} s of CPU)")


def run_side(side: str, python: str, args, T: int, config: str, full_bytes=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env["PYTHONPATH"] = str(ROOT)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "UNROLL_NUM_THREADS"):
        env[var] = str(args.threads)
    command = [python, str(Path(__file__).resolve()), "--side", side, "--T", str(T),
               "--config", config, "--batch", str(args.batch), "--hidden", str(args.hidden),
               "--iters", str(args.iters), "--loss", args.loss, "--threads", str(args.threads)]
    if args.plan_only:
        command.append("--plan-only")
    if full_bytes is not None:
        command += ["--full-bytes", str(full_bytes)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        print(f"{side} {config} T={T} failed:\n{done.stderr.strip()[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def mib(n) -> str:
    return f"{n / 2**20:8.1f} MiB"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", default=[1000], help="T values")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--iters", type=int, default=2, help="timed steps after a first")
    parser.add_argument("--threads", type=int, default=1, help="threads per side")
    parser.add_argument("--loss", choices=["per-step", "whole"], default="per-step")
    parser.add_argument("--budgets", type=float, nargs="+", default=[1 / 4, 1 / 10, 1 / 50],
                        metavar="FRACTION", help="budgets, as fractions of the full plan")
    parser.add_argument("--torch-python", default=None, help="a Python with torch")
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--configs", nargs="+", help="only these of sqrt and the budgets "
                        "(as given to --budgets), e.g. 0.02; default all")
    parser.add_argument("--torch-only", action="store_true", help="only the PyTorch side")
    parser.add_argument("--plan-only", action="store_true",
                        help="only build and plan each net (planned bytes and planning "
                             "seconds; no step is run, so RSS and step time are not measured)")
    parser.add_argument("--charlm", action="store_true",
                        help="time `unroll memory --budget` for the character LM instead")
    parser.add_argument("--charlm-budget", type=float, default=0.5, metavar="FRACTION",
                        help="its budget, as a fraction of its full plan (default 0.5)")
    parser.add_argument("--side", choices=["unroll", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--T", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--full-bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps({"unroll": unroll_side, "torch": torch_side}[args.side](args)))
        return
    if args.charlm:
        for T in args.steps:
            for _ in range(args.turns):
                charlm_figures(args, T)
        return
    from unroll.engine.memory import bptt_hsm

    print(f"LSTM layer H={args.hidden} N={args.batch}, float32, {args.threads} thread(s), "
          f"loss {args.loss}, median of {args.iters} step(s) after a first, "
          f"{args.turns} turn(s); each configuration in its own process")
    for T in args.steps:
        for turn in range(args.turns):
            full = None if args.torch_only else run_side("unroll", sys.executable, args, T,
                                                         "full")
            if full is None:
                if args.torch_python:
                    torch_figures(args, T, None)
                continue
            ran = ("" if args.plan_only else f", workspace {mib(full['workspace'])}, "
                   f"RSS +{mib(full['rss'])}, {full['seconds']:.2f} s/step")
            print(f"T={T} (turn {turn + 1}) unroll full plan: planned {mib(full['planned'])}"
                  f"{ran}; planned in {full['planning']:.1f} s ({full['planning_cpu']:.1f} s "
                  f"of CPU; the unroller before it {full['expand_cpu']:.1f} s of CPU)")
            for config in args.configs or ["sqrt", "hsm", *map(str, args.budgets)]:
                got = run_side("unroll", sys.executable, args, T, config, full["planned"])
                if got is None:
                    continue
                label = config if config in ("sqrt", "hsm") else f"1/{1 / float(config):g}"
                if "refused" in got:
                    print(f"  {label:>6}: refused, the smallest plan needs "
                          f"{mib(got['refused'])} ({got['refused'] / full['planned']:.3f} of "
                          f"the full plan)")
                    continue
                ran = ("" if args.plan_only else
                       f", workspace {got['workspace'] / full['workspace']:.3f}, "
                       f"RSS +{got['rss'] / full['rss']:.3f}")
                step_time = ("" if args.plan_only else
                             f", step time x {got['seconds'] / full['seconds']:.2f}")
                print(f"  {label:>6}: planned {got['planned'] / full['planned']:.3f}{ran} of "
                      f"full; forward x {got['factor']:.2f} ({got['recomputed']} steps again, "
                      f"{got['checkpoints']} checkpoints, {got['policy']}){step_time}; "
                      f"planned in {got['planning']:.1f} s ({got['planning_cpu']:.1f} s of CPU, "
                      f"{got['laid_out']} plans laid out; the unroller before it "
                      f"{got['expand_cpu']:.1f} s)")
                if got["slots"]:  # its segments' forward runs against the dynamic program's
                    n = got["checkpoints"] + 1
                    print(f"          segments run forward {got['segment_runs'] / n:.3f} times "
                          f"each; BPTT-HSM's optimum for {n} steps in {got['slots']} slots: "
                          f"{bptt_hsm(n, got['slots']) / n:.3f}")
            if args.torch_python:
                torch_figures(args, T, full)


def torch_figures(args, T: int, full) -> None:
    tf = run_side("torch", args.torch_python, args, T, "full")
    tc = run_side("torch", args.torch_python, args, T, "checkpoint")
    if tf and tc:
        versus = f" (x {tf['seconds'] / full['seconds']:.2f} unroll's full)" if full else ""
        print(f"  torch nn.LSTM full: RSS +{mib(tf['rss'])}, {tf['seconds']:.2f} s/step{versus}; "
              f"checkpoint_sequential sqrt(T) segments: RSS +{tc['rss'] / tf['rss']:.3f} of "
              f"torch full, step time x {tc['seconds'] / tf['seconds']:.2f}")

if __name__ == "__main__":
    main()
