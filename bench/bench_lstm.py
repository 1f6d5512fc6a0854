"""One training step of a recurrent layer: unroll against PyTorch's fused nn.LSTM / nn.GRU.

The unroll side is ``unroll.expand("lstm")`` (or "gru") plus an EuclideanLoss on
h, trained by SGD; the PyTorch side is ``nn.LSTM`` (``nn.GRU``) with the same
loss sum((h - target)^2) / 2N and SGD. A step is forward, backward and update,
float32, time-major (T, N, D) input with T=25, N=32, D=100, H=128 unless told
otherwise. Each side runs in its own process with the same number of threads;
unroll runs twice, with its fused recurrent units and with their reference
(``UNROLL_ENGINE=reference``), so the units' share shows, and the step's GEMMs
alone run in bare NumPy, the floor of any NumPy implementation, and by
``torch.matmul`` (torch's MKL) on the same shapes: PyTorch's fused layer (oneDNN's
RNN primitive) against its own products one by one. Prints the median
milliseconds per step over several rounds and the ratios. A benchmark, not a
test: run it on an idle machine.

A busy or shared machine drifts: ``--turns K`` runs the sides in turns, K times
each (A B C A B C ...), and takes each ratio turn by turn, so the ratios hold
while the machine's speed changes; ``--baseline PATH`` adds the unroll side of
another checkout (the commit before a change) to the turns; ``--clock cpu`` times
each side by its process's CPU time, which other processes' time slices do not
inflate (meaningful with ``--threads 1``).

    python -m bench.bench_lstm                                 (from the repository root)
    python -m bench.bench_lstm --torch-python PATH/TO/venv/bin/python --steps 100
    python -m bench.bench_lstm --cell gru --hidden 512
    python -m bench.bench_lstm --threads 1 --clock cpu --turns 5 --baseline ../before

``python -m bench.profile_threads`` splits a step by phase at each thread count.

Measured on a 2-core Zen 4 shared with other work (load 10), ``--threads 1 --clock cpu
--steps 100 --hidden 512 --turns 3``: the step's GEMMs alone take 1.18x (turns 1.15-1.42)
nn.LSTM's whole step in NumPy and 1.23x (1.18-1.25) by ``torch.matmul``. So PyTorch's
lead is its fused layer (oneDNN's RNN primitive), not its GEMMs: its own products one by
one are no faster than NumPy's (``bench/bench_gemm.py --sides numpy torch`` has them
product by product).

``--onednn-python PY`` adds that fused layer alone: oneDNN's LSTM primitive driven from
NumPy buffers through its C API (``bench/onednn_lstm.py``, under a Python with the
``onednn-cpu-gomp`` wheel), the same loss and SGD, its weights kept in the plain layout
and packed at every step; its forward is checked against float64 NumPy and its
gradients against central differences before it is timed. It tells what an engine that
ran the whole unrolled chain as one primitive would take.

    python -m bench.bench_lstm --torch-python PY --onednn-python PY2 --threads 1 --turns 2

PyTorch runs under ``--torch-python`` (default: this interpreter); where it
cannot import torch, that side is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.timing import median_seconds

ROOT = Path(__file__).resolve().parents[1]


def ms_per_step(run, args) -> float:
    """Median milliseconds per step of ``run``: wall time, or with ``--clock cpu`` the
    process's CPU time, which other processes' time slices do not inflate (one thread)."""
    if args.clock == "wall":
        return median_seconds(run, args.iters, args.rounds) * 1e3
    for _ in range(3):  # first-call costs: compilation, allocation
        run()
    times = []
    for _ in range(args.rounds):
        start = time.process_time()
        for _ in range(args.iters):
            run()
        times.append((time.process_time() - start) / args.iters)
    return statistics.median(times) * 1e3


def data(args):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.steps, args.batch, args.input_dim)).astype(np.float32)
    target = rng.uniform(-1, 1, (args.steps, args.batch, args.hidden)).astype(np.float32)
    return x, target


def unroll_side(args) -> float:
    from unroll import Net, Solver, expand  # the names of every layout (--baseline)

    T, N, H = args.steps, args.batch, args.hidden
    net_param = expand(args.cell, steps=T, batch=N, input_dim=args.input_dim, hidden=H)
    target = net_param.layer.add(name="target", type="Input", top=["target"])
    target.input_param.shape.add(dim=[T, N, H])
    net_param.layer.add(name="loss", type="EuclideanLoss", bottom=["h", "target"], top=["loss"])
    solver = Solver(Net(net_param), type="SGD", base_lr=0.01)
    x, y = data(args)
    cont = np.ones((T, N), np.float32)
    cont[0] = 0
    feed = {"x": x, "cont": cont, "target": y}
    return ms_per_step(lambda: solver.step(1, feed=feed), args)


def gemm_side(args, library: str = "numpy") -> float:
    """The step's GEMMs alone in bare NumPy (``library="torch"``: by ``torch.matmul`` on
    the same arrays, torch's MKL): the floor of any NumPy implementation.

    The input projection of all steps, one recurrent GEMM per step forward and one
    per step backward, and the weight and input gradients as one GEMM each.
    """
    T, N, D, H = args.steps, args.batch, args.input_dim, args.hidden
    G = {"lstm": 4, "gru": 3}[args.cell] * H
    rng = np.random.default_rng(0)

    def array(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    x, h, dg, Wx, Wh = array(T * N, D), array(T, N, H), array(T, N, G), array(G, D), array(G, H)
    xg, g, dh = np.empty((T * N, G), np.float32), np.empty((T, N, G), np.float32), np.empty_like(h)
    dWx, dWh, dx = np.empty_like(Wx), np.empty_like(Wh), np.empty_like(x)
    flat = dg.reshape(-1, G)
    matmul = np.matmul
    if library == "torch":
        import torch

        torch.set_num_threads(args.threads)
        matmul = torch.matmul
        x, h, dg, Wx, Wh, xg, g, dh, dWx, dWh, dx, flat = map(
            torch.from_numpy, (x, h, dg, Wx, Wh, xg, g, dh, dWx, dWh, dx, flat))

    def step():
        matmul(x, Wx.T, out=xg)
        for t in range(T):
            matmul(h[t], Wh.T, out=g[t])
        for t in range(T):
            matmul(dg[t], Wh, out=dh[t])
        matmul(flat.T, h.reshape(-1, H), out=dWh)
        matmul(flat.T, x, out=dWx)
        matmul(flat, Wx, out=dx)

    return ms_per_step(step, args)


def torch_side(args) -> float:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cell = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[args.cell](args.input_dim, args.hidden)
    optimizer = torch.optim.SGD(cell.parameters(), lr=0.01)
    x, y = (torch.from_numpy(a) for a in data(args))

    def step():
        optimizer.zero_grad(set_to_none=True)
        h, _ = cell(x)
        loss = ((h - y) ** 2).sum() / (2 * args.batch)
        loss.backward()
        optimizer.step()

    return ms_per_step(step, args)


def onednn_side(args) -> float:
    """oneDNN's LSTM primitive alone (``bench/onednn_lstm.py``), its forward and (on a
    small layer) its weight gradients checked against float64 NumPy first."""
    from bench.onednn_lstm import OneDnnLstm, gradient_error, reference_h

    if args.cell != "lstm":
        raise SystemExit("the onednn side is an LSTM only")
    try:
        lstm = OneDnnLstm(args.steps, args.batch, args.input_dim, args.hidden)
    except (OSError, RuntimeError) as error:  # no libdnnl, or oneDNN refused the problem
        raise SystemExit(f"the onednn side: {error}") from None
    x, y = data(args)
    lstm.x[:] = x.ravel()
    error = float(np.abs(lstm.forward() - reference_h(lstm)).max())
    if error > 1e-4:
        raise SystemExit(f"oneDNN's LSTM forward is {error:.2g} from NumPy's")
    if (error := gradient_error()) > 1e-4:
        raise SystemExit(f"oneDNN's LSTM gradients are {error:.2g} from central differences")
    return ms_per_step(lambda: lstm.step(y, lr=0.01), args)


def run_side(side: str, python: str, args, engine: str = "fused", root: Path = ROOT
             ) -> float | None:
    """Milliseconds per step of one side, measured in a fresh process from the checkout
    ``root``; None if it failed."""
    env = {**os.environ, "UNROLL_ENGINE": engine, "PYTHONPATH": str(root)}
    # the same threads on both sides: unroll's own policy (free cores) is overridden
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "UNROLL_NUM_THREADS"):
        env[var] = str(args.threads)
    # this script, with the checkout's unroll (and its bench.timing) on the path
    command = [python, str(Path(__file__).resolve()), "--side", side, *sys.argv[1:]]
    try:
        done = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True)
    except OSError as error:
        print(f"{side}: cannot run {python}: {error.strerror}", file=sys.stderr)
        return None
    if done.returncode:
        print(f"{side} ({python}) failed:\n{done.stderr.strip()}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])["ms"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="lstm", choices=["lstm", "gru"])
    parser.add_argument("--steps", type=int, default=25, help="T (default 25)")
    parser.add_argument("--batch", type=int, default=32, help="N (default 32)")
    parser.add_argument("--input-dim", type=int, default=100, help="D (default 100)")
    parser.add_argument("--hidden", type=int, default=128, help="H (default 128)")
    parser.add_argument("--threads", type=int, default=2, help="threads per side (default 2)")
    parser.add_argument("--iters", type=int, default=20, help="steps per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--torch-python", default=sys.executable,
                        help="a Python with torch (default: this one)")
    parser.add_argument("--onednn-python",
                        help="a Python with the onednn-cpu-gomp wheel: adds oneDNN's LSTM "
                             "primitive alone (bench/onednn_lstm.py)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: time by the process's CPU time (one thread on a busy "
                             "machine)")
    parser.add_argument("--turns", type=int, default=1,
                        help="run the sides in turns this many times; ratios turn by turn")
    parser.add_argument("--baseline", help="another checkout whose unroll side joins the turns")
    parser.add_argument("--side", choices=["unroll", "torch", "gemms", "torch-gemms", "onednn"],
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        ms = {"unroll": unroll_side, "torch": torch_side, "gemms": gemm_side, "onednn": onednn_side,
              "torch-gemms": lambda args: gemm_side(args, "torch")}[args.side](args)
        print(json.dumps({"ms": ms}))
        return

    print(f"{args.cell}: T={args.steps} N={args.batch} D={args.input_dim} H={args.hidden}, "
          f"float32, {args.threads} threads, median of {args.rounds} x {args.iters} steps, "
          f"{args.turns} turn(s)")
    sides = {
        "unroll, fused units": lambda: run_side("unroll", sys.executable, args),
        "unroll, reference units": lambda: run_side("unroll", sys.executable, args,
                                                    engine="reference"),
        "its GEMMs alone, NumPy": lambda: run_side("gemms", sys.executable, args),
        "its GEMMs alone, torch": lambda: run_side("torch-gemms", args.torch_python, args),
        f"torch nn.{args.cell.upper()}": lambda: run_side("torch", args.torch_python, args),
    }
    if args.onednn_python:
        sides["oneDNN's LSTM primitive"] = lambda: run_side("onednn", args.onednn_python, args)
    if args.baseline:
        sides["baseline unroll, fused"] = lambda: run_side(
            "unroll", sys.executable, args, root=Path(args.baseline).resolve())
    turns = {name: [] for name in sides}
    for _ in range(args.turns):
        for name, run in sides.items():
            turns[name].append(run())
    for name, values in turns.items():
        ms = None if None in values else statistics.median(values)
        print(f"{name:24s} {'-' if ms is None else f'{ms:8.2f} ms/step'}")
    fused, torch = "unroll, fused units", f"torch nn.{args.cell.upper()}"
    for name, over, under in [("reference / fused units", "unroll, reference units", fused),
                              ("unroll / torch time", fused, torch),
                              ("NumPy GEMMs alone / torch time", "its GEMMs alone, NumPy", torch),
                              ("torch.matmul GEMMs alone / torch time", "its GEMMs alone, torch",
                               torch),
                              ("oneDNN's LSTM primitive / torch time",
                               "oneDNN's LSTM primitive", torch),
                              ("unroll / baseline time", fused, "baseline unroll, fused")]:
        pairs = [a / b for a, b in zip(turns.get(over, ()), turns.get(under, ())) if a and b]
        if pairs:
            spread = f" (turns {min(pairs):.2f} .. {max(pairs):.2f})" if len(pairs) > 1 else ""
            print(f"{name}: {statistics.median(pairs):.2f}x{spread}")

if __name__ == "__main__":
    main()
