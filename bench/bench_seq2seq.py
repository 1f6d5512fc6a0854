"""A seq2seq training step, unroll against PyTorch: the reverser, at 1 and 2 threads.

The model a new user writes from the public API: token ids -> Embed -> LSTM
encoder; an LSTM decoder started from the encoder's final states
(``recurrent(..., initial_state={"h": "enc_h_T", "c": "enc_c_T"})``, in
``bench/seq2seq.prototxt.j2``) reads the target shifted right (teacher forcing);
a softmax loss over the vocabulary; Adam. The task reverses random token
sequences (source S tokens, target the same reversed, BOS first on the input
side). PyTorch trains the same model: ``nn.Embedding``, an ``nn.LSTM`` encoder,
an ``nn.LSTM`` decoder given ``(h0, c0)`` from it, ``nn.Linear``,
``CrossEntropyLoss``, Adam. Its second LSTM bias (``bias_hh``, which Caffe's
LSTM has not) is held at zero, so both models have the same function and the
same number of learned values, which the run checks.

A step is forward, backward and the Adam update, float32, on one of a few fixed
batches (the same on both sides). Each side runs in its own process, with the
same threads (unroll: ``UNROLL_NUM_THREADS`` and the BLAS/numba variables;
PyTorch: ``torch.set_num_threads``), in turns (unroll, torch, unroll, torch,
...) so that a ratio is taken turn by turn while a shared machine's speed
drifts. Prints the median milliseconds per step of each side, and the ratio;
``--clock cpu`` times by each process's CPU time instead of the wall clock (for
one thread on a busy machine). A benchmark, not a test: run it on an idle machine.

    python -m bench.bench_seq2seq --torch-python PATH/TO/venv/bin/python
    python -m bench.bench_seq2seq --threads 1 --turns 3 --hidden 512
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from bench.bench_lstm import ms_per_step

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = Path(__file__).with_name("seq2seq.prototxt.j2")
BOS = 0


def batches(args) -> list[dict]:
    """``args.batches`` reverser batches: ``src`` (S, N) ids in [1, vocab), ``tgt_out`` the
    same reversed in time, ``tgt_in`` BOS then ``tgt_out`` shifted right."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(args.batches):
        src = rng.integers(1, args.vocab, (args.steps, args.batch))
        tgt_out = src[::-1].copy()
        tgt_in = np.concatenate([np.full((1, args.batch), BOS), tgt_out[:-1]])
        out.append({"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out})
    return out


def unroll_model(args):
    """The unroll side's net, its Adam solver and the feeds of its fixed batches."""
    from unroll import Net, Solver, expand

    S = T = args.steps
    N, H = args.batch, args.hidden
    net = Net(expand(TEMPLATE, steps=T, batch=N, src_steps=S, vocab=args.vocab,
                     embed=args.embed, hidden=H))
    solver = Solver(net, type="Adam", base_lr=args.lr, momentum=0.9, momentum2=0.999,
                    delta=1e-8)
    cont = np.ones((S, N), np.float32)
    cont[0] = 0
    zeros = np.zeros((1, N, H), np.float32)
    feeds = [{"src": b["src"].astype(np.float32), "src_cont": cont,
              "tgt_in": b["tgt_in"].astype(np.float32), "tgt_cont": np.ones((T, N), np.float32),
              "tgt_out": b["tgt_out"].astype(np.float32), "enc_h_0": zeros, "enc_c_0": zeros}
             for b in batches(args)]
    return net, solver, feeds


def unroll_side(args) -> dict:
    net, solver, feeds = unroll_model(args)
    losses = []

    def step():
        losses.append(solver.step(1, feed=feeds[len(losses) % len(feeds)]))

    ms = ms_per_step(step, args)
    values = sum(p.blob.count for p in net.learnable_params if p.lr_mult)
    return {"ms": ms, "params": int(values), "first_loss": losses[0], "last_loss": losses[-1]}


def torch_side(args) -> dict:
    import torch
    from torch import nn

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    V, E, H = args.vocab, args.embed, args.hidden

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.src, self.tgt = nn.Embedding(V, E), nn.Embedding(V, E)
            self.enc, self.dec = nn.LSTM(E, H), nn.LSTM(E, H)
            self.out = nn.Linear(H, V)
            for lstm in (self.enc, self.dec):  # Caffe's LSTM has one bias, not two
                lstm.bias_hh_l0.requires_grad_(False).zero_()

        def forward(self, src, tgt_in):
            _, state = self.enc(self.src(src))
            y, _ = self.dec(self.tgt(tgt_in), state)
            return self.out(y)

    model = Seq2Seq()
    learned = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(learned, lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = nn.CrossEntropyLoss()
    data = [{k: torch.from_numpy(v.astype(np.int64)) for k, v in b.items()}
            for b in batches(args)]
    losses = []

    def step():
        b = data[len(losses) % len(data)]
        optimizer.zero_grad(set_to_none=True)
        scores = model(b["src"], b["tgt_in"])
        loss = loss_fn(scores.reshape(-1, V), b["tgt_out"].reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    ms = ms_per_step(step, args)
    return {"ms": ms, "params": sum(p.numel() for p in learned), "first_loss": losses[0],
            "last_loss": losses[-1]}


def run_side(side: str, python: str, argv: list, threads: int) -> dict | None:
    """One side's figures, measured in a fresh process; None if it failed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # the machine's own, both sides
        env.pop(var, None)
    # the same threads on both sides: unroll's own policy (free cores) is overridden
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS", "UNROLL_NUM_THREADS"):
        env[var] = str(threads)
    command = [python, str(Path(__file__).resolve()), *argv, "--side", side,
               "--threads", str(threads)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        print(f"{side} ({python}) failed:\n{done.stderr.strip()}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=40, help="tokens, BOS included (default 40)")
    parser.add_argument("--steps", type=int, default=20, help="S = T (default 20)")
    parser.add_argument("--batch", type=int, default=32, help="N (default 32)")
    parser.add_argument("--embed", type=int, default=64, help="default 64")
    parser.add_argument("--hidden", type=int, default=256, help="H (default 256)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batches", type=int, default=8, help="distinct batches, cycled")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="thread counts, each for both sides (default 1 2)")
    parser.add_argument("--iters", type=int, default=10, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: time by the process's CPU time, which other processes' "
                             "time slices do not inflate (meaningful with --threads 1)")
    parser.add_argument("--turns", type=int, default=2,
                        help="run the sides in turns this many times; ratios turn by turn")
    parser.add_argument("--torch-python", default=sys.executable,
                        help="a Python with torch (default: this one)")
    parser.add_argument("--side", choices=["unroll", "torch"], help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.side:
        args.threads = args.threads[-1]
        print(json.dumps({"unroll": unroll_side, "torch": torch_side}[args.side](args)))
        return 0

    print(f"seq2seq reverser: V={args.vocab} S=T={args.steps} N={args.batch} E={args.embed} "
          f"H={args.hidden}, LSTM encoder -> LSTM decoder from its final states, teacher "
          f"forcing, softmax loss, Adam; float32; median of {args.rounds} x {args.iters} "
          f"steps, {args.clock} clock, {args.turns} turn(s)")
    for threads in args.threads:
        turns = []
        for _ in range(args.turns):
            turns.append({side: run_side(side, python, argv, threads) for side, python in
                          (("unroll", sys.executable), ("torch", args.torch_python))})
        if any(None in t.values() for t in turns):
            return 1
        counts = {side: turns[0][side]["params"] for side in ("unroll", "torch")}
        if counts["unroll"] != counts["torch"]:
            print(f"the two models differ: {counts['unroll']:,} learned values in unroll, "
                  f"{counts['torch']:,} in PyTorch", file=sys.stderr)
            return 1
        ms = {side: statistics.median(t[side]["ms"] for t in turns) for side in counts}
        ratio = statistics.median(t["unroll"]["ms"] / t["torch"]["ms"] for t in turns)
        loss = {side: f"{turns[-1][side]['first_loss']:.2f} -> {turns[-1][side]['last_loss']:.2f}"
                for side in counts}
        print(f"{threads} thread(s), {counts['unroll']:,} learned values each: unroll "
              f"{ms['unroll']:.2f} ms/step, PyTorch {ms['torch']:.2f} ms/step; unroll / "
              f"PyTorch {ratio:.2f}x (median of the turns' ratios); loss over the timed steps "
              f"unroll {loss['unroll']}, PyTorch {loss['torch']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
