"""One training step of a recurrent layer: unroll against PyTorch's fused nn.LSTM / nn.GRU.

The unroll side is ``unroll.expand("lstm")`` (or "gru") plus an EuclideanLoss on
h, trained by SGD; the PyTorch side is ``nn.LSTM`` (``nn.GRU``) with the same
loss sum((h - target)^2) / 2N and SGD. A step is forward, backward and update,
float32, time-major (T, N, D) input with T=25, N=32, D=100, H=128 unless told
otherwise. Each side runs in its own process with the same number of threads;
unroll runs twice, with its fused recurrent units and with their reference
(``UNROLL_ENGINE=reference``), so the units' share shows, and the step's GEMMs
alone run in bare NumPy, the floor of any NumPy implementation. Prints the median
milliseconds per step over several rounds and the ratios. A benchmark, not a
test: run it on an idle machine.

    python -m bench.bench_lstm                                 (from the repository root)
    python -m bench.bench_lstm --torch-python PATH/TO/venv/bin/python --steps 100
    python -m bench.bench_lstm --cell gru --hidden 512

PyTorch runs under ``--torch-python`` (default: this interpreter); without it
that side is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from bench.timing import median_seconds

ROOT = Path(__file__).resolve().parents[1]


def data(args):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.steps, args.batch, args.input_dim)).astype(np.float32)
    target = rng.uniform(-1, 1, (args.steps, args.batch, args.hidden)).astype(np.float32)
    return x, target


def unroll_side(args) -> float:
    from unroll.engine.net import Net
    from unroll.frontend.unroller import expand
    from unroll.train.solver import Solver

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
    return median_seconds(lambda: solver.step(1, feed=feed), args.iters, args.rounds) * 1e3


def gemm_side(args) -> float:
    """The step's GEMMs alone in bare NumPy: the floor of any NumPy implementation.

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

    def step():
        np.matmul(x, Wx.T, out=xg)
        for t in range(T):
            np.matmul(h[t], Wh.T, out=g[t])
        for t in range(T):
            np.matmul(dg[t], Wh, out=dh[t])
        np.matmul(flat.T, h.reshape(-1, H), out=dWh)
        np.matmul(flat.T, x, out=dWx)
        np.matmul(flat, Wx, out=dx)

    return median_seconds(step, args.iters, args.rounds) * 1e3


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

    return median_seconds(step, args.iters, args.rounds) * 1e3


def run_side(side: str, python: str, args, engine: str = "fused") -> float | None:
    """Milliseconds per step of one side, measured in a fresh process; None if it failed."""
    env = {**os.environ, "UNROLL_ENGINE": engine, "PYTHONPATH": str(ROOT)}
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(args.threads)
    command = [python, str(Path(__file__).resolve()), "--side", side, *sys.argv[1:]]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
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
    parser.add_argument("--side", choices=["unroll", "torch", "gemms"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        ms = {"unroll": unroll_side, "torch": torch_side, "gemms": gemm_side}[args.side](args)
        print(json.dumps({"ms": ms}))
        return

    print(f"{args.cell}: T={args.steps} N={args.batch} D={args.input_dim} H={args.hidden}, "
          f"float32, {args.threads} threads, median of {args.rounds} x {args.iters} steps")
    fused = run_side("unroll", sys.executable, args)
    reference = run_side("unroll", sys.executable, args, engine="reference")
    gemms = run_side("gemms", sys.executable, args)
    torch = run_side("torch", args.torch_python, args)
    for name, ms in [("unroll, fused units", fused), ("unroll, reference units", reference),
                     ("its GEMMs alone, NumPy", gemms), (f"torch nn.{args.cell.upper()}", torch)]:
        print(f"{name:24s} {'-' if ms is None else f'{ms:8.2f} ms/step'}")
    if fused and reference:
        print(f"reference / fused units: {reference / fused:.2f}x")
    if fused and torch:
        print(f"unroll / torch time: {fused / torch:.2f}x")
    if gemms and torch:
        print(f"NumPy GEMMs alone / torch time: {gemms / torch:.2f}x")


if __name__ == "__main__":
    main()
