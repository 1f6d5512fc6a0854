"""The lemmatizer against its PyTorch twin: training words/s, decoding words/s, dev accuracy.

Both sides train the model of ``examples/lemmatize`` (UPOS symbol + characters ->
Embed 64 -> BiLSTM 128 -> LSTM decoder 256 started from the encoder's final
states, teacher forcing, an edit classifier beside it; Adam 3e-3, gradients
clipped at norm 5, dropout 0.2) on the SAME batches, for ``--epochs`` epochs, each
side in its own process, one after the other. Then each decodes the distinct dev
(form, UPOS) pairs greedily, and the dev accuracies of the seq2seq alone and of
the dictionary + seq2seq are computed here, alike for both. The PyTorch side
needs only numpy and torch (``--torch-python`` names its interpreter); it
uses fused ``nn.LSTM``. A benchmark, not a test: run it on an idle machine.

    python -m bench.bench_lemmatize --epochs 3 --torch-python PATH/TO/venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TORCH_SIDE = r'''
import pickle, sys, time, json
import numpy as np
import torch
from torch import nn

torch.set_num_threads(int(sys.argv[3]))
with open(sys.argv[1], "rb") as f:
    job = pickle.load(f)
torch.manual_seed(0)
V, E, H, K = job["chars"], job["embed"], job["hidden"], 3


class Lemmatizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.src = nn.Embedding(V, E)
        self.tgt = nn.Embedding(V, E)
        self.enc = nn.LSTM(E, H, bidirectional=True)
        self.dec = nn.LSTM(E, 2 * H)
        self.out = nn.Linear(2 * H, V)
        self.edit = nn.Linear(2 * H, K)
        self.drop = nn.Dropout(job["dropout"])

    def encode(self, src):
        _, (h, c) = self.enc(self.drop(self.src(src)))
        h0 = torch.cat([h[0], h[1]], dim=-1)[None]
        c0 = torch.cat([c[0], torch.zeros_like(c[1])], dim=-1)[None]
        return h0, c0

    def forward(self, src, tgt_in):
        h0, c0 = self.encode(src)
        y, _ = self.dec(self.tgt(tgt_in), (h0, c0))
        return self.out(self.drop(y)), self.edit(h0[0])


model = Lemmatizer()
opt = torch.optim.Adam(model.parameters(), lr=job["lr"], betas=(0.9, 0.999), eps=1e-8)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.95)
loss_fn = nn.CrossEntropyLoss(ignore_index=-1)
epochs = []
for batches in job["epochs"]:
    model.train()
    words, start = 0, time.perf_counter()
    for src, tgt_in, tgt_out, edit in batches:
        src, tgt_in = torch.from_numpy(src), torch.from_numpy(tgt_in)
        tgt_out, edit = torch.from_numpy(tgt_out), torch.from_numpy(edit)
        opt.zero_grad()
        scores, edit_scores = model(src, tgt_in)
        loss = loss_fn(scores.reshape(-1, V), tgt_out.reshape(-1)) + loss_fn(edit_scores, edit)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        words += src.shape[1]
    sched.step()
    epochs.append({"seconds": time.perf_counter() - start,
                   "words_per_s": words / (time.perf_counter() - start)})
model.eval()
found = {}
start, n = time.perf_counter(), 0
with torch.no_grad():
    for index, src in job["dev"]:
        src = torch.from_numpy(src)
        h, c = model.encode(src)
        said = model.edit(h[0]).argmax(-1).tolist()
        tokens = torch.full((1, src.shape[1]), job["bos"], dtype=torch.long)
        out = [[] for _ in index]
        alive = [True] * len(index)
        for _ in range(src.shape[0] + 10):
            y, (h, c) = model.dec(model.tgt(tokens), (h, c))
            tokens = model.out(y).argmax(-1)
            for j, t in enumerate(tokens[0].tolist()):
                if alive[j]:
                    if t == job["eos"]:
                        alive[j] = False
                    else:
                        out[j].append(t)
            if not any(alive):
                break
        for i, ids, e in zip(index, out, said):
            found[i] = (ids, e)
        n += len(index)
json.dump({"epochs": epochs, "decode_words_per_s": n / (time.perf_counter() - start),
           "found": {str(i): v for i, v in found.items()}}, open(sys.argv[2], "w"))
'''


def _batches(lemmatizer, examples, epochs: int, seed: int):
    rng = np.random.default_rng(seed)
    return [lemmatizer.batches(examples, rng) for _ in range(epochs)]


def _unroll_side(job_path: str, out_path: str) -> None:
    """Train and decode in unroll; writes the same JSON as the PyTorch side."""
    from unroll import Solver

    with open(job_path, "rb") as f:
        job = pickle.load(f)
    lemmatizer = job["make"]()
    solver = Solver(lemmatizer.train_model, type="Adam", base_lr=job["lr"], momentum=0.9,
                    momentum2=0.999, delta=1e-8, lr_policy="step", gamma=0.95,
                    stepsize=len(job["unroll_epochs"][0]), clip_gradients=5.0)
    epochs = []
    for batches in job["unroll_epochs"]:
        words, start = 0, time.perf_counter()
        for key, inputs in batches:  # the step the Trainer takes
            solver.step(1, feed=dict(widths=key, **inputs))
            words += inputs["src"].shape[1]
        epochs.append({"seconds": time.perf_counter() - start,
                       "words_per_s": words / (time.perf_counter() - start)})
    pairs = job["pairs"]
    start = time.perf_counter()
    lemmas = lemmatizer.predict(pairs)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    lemmatizer.predict(pairs, beam=4)
    beam_seconds = time.perf_counter() - start
    with open(out_path, "w") as f:
        json.dump({"epochs": epochs, "decode_words_per_s": len(pairs) / seconds,
                   "beam_words_per_s": len(pairs) / beam_seconds, "lemmas": lemmas}, f)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="the folder of EWT's .conllu (default: as the tagger)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--torch-python", default=sys.executable)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from examples.lemmatize.conll import read_lemmas
    from examples.lemmatize.model import EDITS, Lemmatizer, LemmatizerConfig
    from examples.lemmatize.train import words_of
    from unroll.tools.ewt import DEV_FILE, TRAIN_FILE, data_dir

    data = data_dir(args.data)
    train_words = words_of(read_lemmas(data / TRAIN_FILE))
    dev_words = words_of(read_lemmas(data / DEV_FILE))
    config = LemmatizerConfig()
    lemmatizer = Lemmatizer.build(train_words, config, seed=args.seed)
    examples = sorted(set(train_words))
    epochs = _batches(lemmatizer, examples, args.epochs, args.seed)
    pairs = sorted({(f, u) for f, u, _ in dev_words if lemmatizer.fits(f)})

    def torch_batch(inputs):
        return (inputs["src"].astype(np.int64), inputs["tgt_in"].astype(np.int64),
                inputs["tgt_out"].astype(np.int64), inputs["edit"][0].astype(np.int64))

    by_length: dict = {}
    for i, (f, _) in enumerate(pairs):
        by_length.setdefault(len(f) + 1, []).append(i)
    dev = [(index[k:k + 256], np.array([lemmatizer.source(*pairs[i]) for i in index[k:k + 256]],
                                        np.int64).T)
           for _, index in sorted(by_length.items()) for k in range(0, len(index), 256)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads),
               OMP_NUM_THREADS=str(args.threads), NUMBA_NUM_THREADS=str(args.threads))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        job = {"chars": len(lemmatizer.chars), "embed": config.embed, "hidden": config.hidden,
               "dropout": config.dropout, "lr": 3e-3, "bos": lemmatizer.bos,
               "eos": lemmatizer.eos, "dev": dev,
               "epochs": [[torch_batch(inputs) for _, inputs in batches] for batches in epochs]}
        with open(f"{tmp}/torch.pkl", "wb") as f:
            pickle.dump(job, f)
        Path(f"{tmp}/torch_side.py").write_text(TORCH_SIDE)
        with open(f"{tmp}/unroll.pkl", "wb") as f:
            pickle.dump({"make": _Make(train_words, config, args.seed), "lr": 3e-3,
                         "unroll_epochs": epochs, "pairs": pairs}, f)
        for side, command in (
                ("unroll", [sys.executable, "-m", "bench.bench_lemmatize", "--side",
                            f"{tmp}/unroll.pkl", f"{tmp}/unroll.json"]),
                ("torch", [args.torch_python, f"{tmp}/torch_side.py", f"{tmp}/torch.pkl",
                           f"{tmp}/torch.json", str(args.threads)])):
            subprocess.run(command, check=True, env=env)
            results[side] = json.loads(Path(f"{tmp}/{side}.json").read_text())

    gold = [lemma for _, _, lemma in dev_words]
    for side, result in results.items():
        if side == "torch":
            decoded = {}
            for i, (ids, e) in result["found"].items():
                form = pairs[int(i)][0]
                lemma = "".join(lemmatizer.chars.itos[t] for t in ids)
                decoded[pairs[int(i)]] = form if EDITS[e] == "identity" else (
                    form.lower() if EDITS[e] == "lower" else lemma)
        else:
            decoded = dict(zip(pairs, result["lemmas"]))
        seq2seq = [decoded.get((f, u), f) for f, u, _ in dev_words]
        combined = [lemmatizer.dictionary.get(f, u) or s
                    for (f, u, _), s in zip(dev_words, seq2seq)]
        acc = [np.mean([g == p for g, p in zip(gold, ps)]) for ps in (seq2seq, combined)]
        speeds = ", ".join(f"{e['words_per_s']:.0f}" for e in result["epochs"])
        print(f"{side:6s}: training words/s by epoch {speeds}; greedy decoding "
              f"{result['decode_words_per_s']:.0f} words/s"
              + (f", beam 4 {result['beam_words_per_s']:.0f}" if "beam_words_per_s" in result
                 else "")
              + f"; after {args.epochs} epochs dev seq2seq {100 * acc[0]:.2f}%, dictionary + "
              f"seq2seq {100 * acc[1]:.2f}%")
    return 0


class _Make:
    """Builds the unroll side's lemmatizer in its own process (the nets are not pickled)."""

    def __init__(self, train_words, config, seed):
        self.train_words, self.config, self.seed = train_words, config, seed

    def __call__(self):
        from examples.lemmatize.model import Lemmatizer

        return Lemmatizer.build(self.train_words, self.config, seed=self.seed)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--side"]:
        _unroll_side(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.exit(main())
