"""The character LM against its PyTorch twin: training tokens/s and dev bits per character.

Both sides train the model of ``examples/charlm`` (Embed 64 -> LSTM 256 -> InnerProduct
to the symbols, softmax cross-entropy) on EWT's train text cut into the SAME windows
(N=32 rows, T=100 steps), the state carried from window to window (truncated BPTT),
from the SAME initial weights (unroll's, copied into ``nn.LSTM`` with the gate rows
permuted from Caffe's i, f, o, g to torch's i, f, g, o; torch's second bias
``bias_hh`` held at 0, so each gate has one trained bias as in Caffe), with the SAME
updates: the application's solver (Adam, ``examples.charlm.model.SOLVER``) with Caffe's
epsilon placement (torch's eps set to delta / sqrt(1 - beta2^t) before update t, which
makes ``torch.optim.Adam`` Caffe's Adam up to rounding) and Caffe's clipping (scale by
clip / norm where the global norm exceeds clip). Then each scores the dev text, its
state carried the same way, in bits per character (mean nats / ln 2). Neither side
averages weights (the Trainer evaluates an average; here both evaluate the weights).

Each side runs in its own process, one after the other, at each ``--threads``, for
``--turns`` rounds (each round's ratio is from runs next to each other); tokens/s
counts the scored characters over the time of forward + backward + update alone. The
PyTorch side needs only numpy and torch (``--torch-python`` names its interpreter; a
separate virtual environment with torch==2.13.0). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
are unset for both. A benchmark, not a test: run it on an idle machine.

    python -m bench.bench_charlm --windows 100 --threads 1 2 --torch-python PATH/TO/python
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TORCH_SIDE = r'''
import json, math, pickle, sys, time
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(int(sys.argv[3]))
with open(sys.argv[1], "rb") as f:
    job = pickle.load(f)
V, E, H, N = job["symbols"], job["embed"], job["hidden"], job["batch"]
p, solver = job["params"], job["solver"]
embed, lstm, out = nn.Embedding(V, E), nn.LSTM(E, H), nn.Linear(H, V)
gates = np.r_[0:2 * H, 3 * H:4 * H, 2 * H:3 * H]  # Caffe's i f o g -> torch's i f g o
with torch.no_grad():
    embed.weight.copy_(torch.from_numpy(p["E"]))
    lstm.weight_ih_l0.copy_(torch.from_numpy(p["W_xc"][gates]))
    lstm.weight_hh_l0.copy_(torch.from_numpy(p["W_hc"][gates]))
    lstm.bias_ih_l0.copy_(torch.from_numpy(p["b_c"][gates]))
    lstm.bias_hh_l0.zero_()
    out.weight.copy_(torch.from_numpy(p["W_out"]))
    out.bias.copy_(torch.from_numpy(p["b_out"]))
lstm.bias_hh_l0.requires_grad_(False)
params = [embed.weight, lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, out.weight,
          out.bias]
b1, b2 = solver["momentum"], solver["momentum2"]
opt = torch.optim.Adam(params, lr=solver["base_lr"], betas=(b1, b2), eps=solver["delta"])


def run(x, y, state):
    h, state = lstm(embed(torch.from_numpy(x)), state)
    scores = out(h)
    return F.cross_entropy(scores.reshape(-1, V), torch.from_numpy(y).reshape(-1),
                           ignore_index=-1), state


zeros = (torch.zeros(1, N, H), torch.zeros(1, N, H))
state, t, tokens, seconds = zeros, 0, 0, 0.0
for epoch in range(job["epochs"]):
    for x, y in job["train"]:
        start = time.perf_counter()
        t += 1
        for group in opt.param_groups:
            group["eps"] = solver["delta"] / math.sqrt(1 - b2 ** t)
        opt.zero_grad()
        loss, state = run(x, y, state)
        loss.backward()
        norm = torch.sqrt(sum((q.grad.double() ** 2).sum() for q in params))
        if norm > solver["clip_gradients"]:
            for q in params:
                q.grad.mul_(float(solver["clip_gradients"] / norm))
        opt.step()
        state = tuple(s.detach() for s in state)
        seconds += time.perf_counter() - start
        tokens += int((y != -1).sum())
nats, count, state = 0.0, 0, zeros
with torch.no_grad():
    for x, y in job["dev"]:
        loss, state = run(x, y, state)
        valid = int((y != -1).sum())
        nats, count = nats + float(loss) * valid, count + valid
json.dump({"tokens_per_s": tokens / seconds, "dev_bpc": nats / count / math.log(2),
           "last_loss": float(loss)}, open(sys.argv[2], "w"))
'''


def _unroll_side(job_path: str, out_path: str) -> None:
    """Train and score in unroll; writes the same JSON as the PyTorch side."""
    from examples.charlm.model import IGNORE, CharLM, CharLMConfig, Symbols
    from unroll import Solver, carry_hidden

    with open(job_path, "rb") as f:
        job = pickle.load(f)
    lm = CharLM(Symbols(job["itos"]), CharLMConfig(**job["config"]))
    for p in lm.train_model.learnable_params:
        p.blob.data[...] = job["params"][p.name]
    solver = Solver(lm.train_model, **job["solver"])
    state, tokens, seconds = lm.zero_state(), 0, 0.0
    for _ in range(job["epochs"]):
        for window in job["train"]:
            start = time.perf_counter()
            solver.step(feed=lm.inputs(window, state))
            state = carry_hidden(lm.train_model)
            seconds += time.perf_counter() - start
            tokens += int(np.count_nonzero(window[1] != IGNORE))
    nats, count, state = 0.0, 0, lm.zero_state()
    for window in job["dev"]:
        loss = float(lm.test_model.forward(**lm.inputs(window, state))["loss"])
        valid = int(np.count_nonzero(window[1] != IGNORE))
        nats, count = nats + loss * valid, count + valid
        state = carry_hidden(lm.test_model)
    with open(out_path, "w") as f:
        json.dump({"tokens_per_s": tokens / seconds, "dev_bpc": nats / count / math.log(2),
                   "last_loss": loss}, f)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="the folder of EWT's .conllu (default: as the tagger)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--windows", type=int, default=0,
                        help="train on the first N windows of each epoch (0: all)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--turns", type=int, default=1,
                        help="run the sides in turns this many times (a ratio per turn)")
    parser.add_argument("--torch-python", default=sys.executable)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from examples.charlm.model import SOLVER, CharLM, CharLMConfig, Symbols
    from unroll.tools.conllu import read_texts
    from unroll.tools.ewt import DEV_FILE, TRAIN_FILE, data_dir

    data = data_dir(args.data)
    train, dev = read_texts(data / TRAIN_FILE), read_texts(data / DEV_FILE)
    config = CharLMConfig()
    lm = CharLM(Symbols.build(train), config, seed=args.seed)
    windows = lm.windows(train)[:args.windows or None]
    job = {"symbols": len(lm.symbols.itos), "embed": config.embed, "hidden": config.hidden,
           "batch": config.batch, "itos": lm.symbols.itos, "config": vars(config),
           "params": {p.name: p.blob.data.copy() for p in lm.train_model.learnable_params},
           "solver": SOLVER, "epochs": args.epochs, "train": windows, "dev": lm.windows(dev)}
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    tokens = sum(int((y != -1).sum()) for _, y in windows) * args.epochs
    print(f"{len(lm.symbols.itos)} symbols; {args.epochs} epoch(s) of {len(windows)} windows "
          f"({config.batch} x {config.steps}), {tokens} training characters; dev "
          f"{sum(int((y != -1).sum()) for _, y in job['dev'])} characters", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/job.pkl", "wb") as f:
            pickle.dump(job, f)
        Path(f"{tmp}/torch_side.py").write_text(TORCH_SIDE)
        for turn in range(args.turns):
            for threads in args.threads:
                n = str(threads)
                side_env = dict(env, UNROLL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n,
                                OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, NUMBA_NUM_THREADS=n)
                speeds = {}
                for side, command in (
                        ("unroll", [sys.executable, "-m", "bench.bench_charlm", "--side",
                                    f"{tmp}/job.pkl", f"{tmp}/unroll.json"]),
                        ("torch", [args.torch_python, f"{tmp}/torch_side.py",
                                   f"{tmp}/job.pkl", f"{tmp}/torch.json", n])):
                    subprocess.run(command, check=True, env=side_env)
                    r = json.loads(Path(f"{tmp}/{side}.json").read_text())
                    speeds[side] = r["tokens_per_s"]
                    print(f"turn {turn + 1}, {threads} thread(s), {side:6s}: "
                          f"{r['tokens_per_s']:8.0f} training tokens/s  dev {r['dev_bpc']:.4f} "
                          f"bits/char", flush=True)
                print(f"turn {turn + 1}, {threads} thread(s), unroll / torch tokens/s: "
                      f"{speeds['unroll'] / speeds['torch']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--side"]:
        _unroll_side(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.exit(main())
