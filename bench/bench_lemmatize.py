"""The lemmatizer against its PyTorch twin: training words/s, decoding words/s, dev accuracy.

Both sides train the model of ``examples/lemmatize`` (UPOS symbol + characters ->
Embed 64 -> BiLSTM 128 -> LSTM decoder 256 started from the encoder's final
states, with Luong attention over the encoder's outputs (``--attention``: dot,
general or none; the lemmatizer's default), teacher forcing, an edit classifier
beside it; Adam 3e-3, gradients clipped at norm 5, dropout 0.2) on the SAME
batches, for ``--epochs`` epochs, each side in its own process, one after the
other. Then each decodes the distinct dev (form, UPOS) pairs greedily, twice (the
first pass, printed apart, also builds unroll's encoder net of each source length),
and with a beam of ``--beam`` (the same search on both sides: unroll.train.decoding's, and
its twin written in the PyTorch script, which steps every row of the beam), and the
dev accuracies of greedy decoding, seq2seq alone and dictionary + seq2seq, are
computed here, alike for both. The PyTorch side needs only numpy and torch
(``--torch-python`` names its interpreter); it uses fused ``nn.LSTM`` and
``einsum`` attention. A benchmark, not a test: run it on an idle machine.

    python -m bench.bench_lemmatize --epochs 3 --torch-python PATH/TO/venv/bin/python
    python -m bench.bench_lemmatize --epochs 1 --clock cpu --torch-python ...  # busy machine
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
clock = time.process_time if sys.argv[4] == "cpu" else time.perf_counter
with open(sys.argv[1], "rb") as f:
    job = pickle.load(f)
torch.manual_seed(0)
V, E, H, K = job["chars"], job["embed"], job["hidden"], 3
ATTENTION = job["attention"]


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
        if ATTENTION != "none":  # Luong: tanh(W_c [context; h]), no biases
            self.combine = nn.Linear(4 * H, 2 * H, bias=False)
        if ATTENTION == "general":
            self.key = nn.Linear(2 * H, 2 * H, bias=False)

    def encode(self, src):
        memory, (h, c) = self.enc(self.drop(self.src(src)))
        h0 = torch.cat([h[0], h[1]], dim=-1)[None]
        c0 = torch.cat([c[0], torch.zeros_like(c[1])], dim=-1)[None]
        return memory, h0, c0

    def attend(self, memory, y):
        """The attentional vector of each decoder output y (T, N, 2H) over memory (S, N, 2H)."""
        if ATTENTION == "none":
            return y
        query = self.key(y) if ATTENTION == "general" else y
        scores = torch.einsum("snh,tnh->tns", memory, query)
        context = torch.einsum("tns,snh->tnh", scores.softmax(-1), memory)
        return torch.tanh(self.combine(torch.cat([context, y], -1)))

    def forward(self, src, tgt_in):
        memory, h0, c0 = self.encode(src)
        y, _ = self.dec(self.tgt(tgt_in), (h0, c0))
        return self.out(self.drop(self.attend(memory, y))), self.edit(h0[0])

    def step(self, tokens, memory, state):
        """log p(next token) (M, V) after each hypothesis' last token, and the new state."""
        y, state = self.dec(self.tgt(tokens[None]), state)
        return self.out(self.attend(memory, y))[0].log_softmax(-1), state


def greedy(memory, state, n, max_len):
    tokens = torch.full((n,), job["bos"], dtype=torch.long)
    out, alive = [[] for _ in range(n)], [True] * n
    for _ in range(max_len):
        logp, state = model.step(tokens, memory, state)
        tokens = logp.argmax(-1)
        for j, t in enumerate(tokens.tolist()):
            if alive[j]:
                if t == job["eos"]:
                    alive[j] = False
                else:
                    out[j].append(t)
        if not any(alive):
            break
    return out


def beam_search(memory, state, n, max_len, k):
    """unroll.train.decoding's search: per sequence, an end among the k best extensions is
    finished, the k best that do not end make the next beam; a sequence stops once its best
    finished score is at least its best live one. Every row of every sequence steps."""
    rows = torch.arange(n).repeat_interleave(k)
    memory, state = memory[:, rows], tuple(x[:, rows] for x in state)
    tokens = torch.full((n * k,), job["bos"], dtype=torch.long)
    scores = torch.tensor([0.0] + [-float("inf")] * (k - 1)).repeat(n)
    prefixes = [[] for _ in range(n * k)]
    best, done = [None] * n, [False] * n
    for _ in range(max_len):
        logp, state = model.step(tokens, memory, state)
        vocab = logp.shape[1]
        total = (scores[:, None] + logp).reshape(n, k * vocab)
        top_values, top_index = total.topk(2 * k, dim=1)
        rows, new_tokens, new_scores, new_prefixes = [], [], [], []
        for b in range(n):
            kept = []
            for rank, (value, flat) in enumerate(zip(top_values[b].tolist(),
                                                     top_index[b].tolist())):
                if done[b] or value == -float("inf"):
                    break
                row, token = b * k + flat // vocab, flat % vocab
                if token == job["eos"]:
                    if rank < k and (best[b] is None or value > best[b][1]):
                        best[b] = (prefixes[row], value)
                elif len(kept) < k:
                    kept.append((row, token, value))
            kept += [(b * k, job["eos"], -float("inf"))] * (k - len(kept))
            if best[b] is not None and best[b][1] >= max(v for _, _, v in kept):
                done[b] = True
            for row, token, value in kept:
                rows.append(row)
                new_tokens.append(token)
                new_scores.append(value)
                new_prefixes.append([*prefixes[row], token])
        if all(done):
            break
        rows = torch.tensor(rows)
        state = tuple(x[:, rows] for x in state)
        tokens, scores = torch.tensor(new_tokens), torch.tensor(new_scores)
        prefixes = new_prefixes
    for b in range(n):
        if best[b] is None:
            top = b * k + int(scores[b * k:(b + 1) * k].argmax())
            best[b] = (prefixes[top], float(scores[top]))
    return [tokens for tokens, _ in best]


model = Lemmatizer()
opt = torch.optim.Adam(model.parameters(), lr=job["lr"], betas=(0.9, 0.999), eps=1e-8)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.95)
loss_fn = nn.CrossEntropyLoss(ignore_index=-1)
epochs = []
for batches in job["epochs"]:
    model.train()
    words, start = 0, clock()
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
    epochs.append({"seconds": clock() - start,
                   "words_per_s": words / (clock() - start)})
model.eval()
found, timed = {}, {}
words = sum(len(index) for index, _ in job["dev"])
with torch.no_grad():
    for run, beam in (("first", 1), (1, 1), (job["beam"], job["beam"])):
        start = clock()
        for index, src in job["dev"]:
            src = torch.from_numpy(src)
            memory, h, c = model.encode(src)
            said = model.edit(h[0]).argmax(-1).tolist()
            max_len = src.shape[0] + 10
            out = (greedy(memory, (h, c), len(index), max_len) if beam == 1 else
                   beam_search(memory, (h, c), len(index), max_len, beam))
            if beam == 1:
                for i, ids, e in zip(index, out, said):
                    found[i] = (ids, e)
        timed[run] = words / (clock() - start)
json.dump({"epochs": epochs, "first_words_per_s": timed["first"],
           "decode_words_per_s": timed[1],
           "beam_words_per_s": timed[job["beam"]],
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
    clock = time.process_time if job["clock"] == "cpu" else time.perf_counter
    solver = Solver(lemmatizer.train_model, type="Adam", base_lr=job["lr"], momentum=0.9,
                    momentum2=0.999, delta=1e-8, lr_policy="step", gamma=0.95,
                    stepsize=len(job["unroll_epochs"][0]), clip_gradients=5.0)
    epochs = []
    for batches in job["unroll_epochs"]:
        words, start = 0, clock()
        for key, inputs in batches:  # the step the Trainer takes
            solver.step(1, feed=dict(widths=key, **inputs))
            words += inputs["src"].shape[1]
        epochs.append({"seconds": clock() - start,
                       "words_per_s": words / (clock() - start)})
    pairs = job["pairs"]
    start = clock()
    lemmatizer.predict(pairs)  # the first pass builds the encoder net of every length
    first = clock() - start
    start = clock()
    lemmas = lemmatizer.predict(pairs)
    seconds = clock() - start
    start = clock()
    lemmatizer.predict(pairs, beam=job["beam"])
    beam_seconds = clock() - start
    with open(out_path, "w") as f:
        json.dump({"epochs": epochs, "first_words_per_s": len(pairs) / first,
                   "decode_words_per_s": len(pairs) / seconds,
                   "beam_words_per_s": len(pairs) / beam_seconds, "lemmas": lemmas}, f)


def main(argv=None) -> int:
    from examples.lemmatize.model import ATTENTION, EDITS, Lemmatizer, LemmatizerConfig

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="the folder of EWT's .conllu (default: as the tagger)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--torch-python", default=sys.executable)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attention", choices=ATTENTION, default=LemmatizerConfig.attention,
                        help="the decoder's attention, on both sides (default: the "
                             "lemmatizer's, %(default)s)")
    parser.add_argument("--beam", type=int, default=4, help="beam width timed (default 4)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: each process's CPU time (all its threads), for one thread "
                             "on a busy machine")
    args = parser.parse_args(argv)

    from examples.lemmatize.conll import read_lemmas
    from examples.lemmatize.train import words_of
    from unroll.tools.ewt import DEV_FILE, TRAIN_FILE, data_dir

    data = data_dir(args.data)
    train_words = words_of(read_lemmas(data / TRAIN_FILE))
    dev_words = words_of(read_lemmas(data / DEV_FILE))
    config = LemmatizerConfig(attention=args.attention)
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
    # UNROLL_NUM_THREADS too: a net run sets the BLAS pool to the engine's count, whatever
    # OPENBLAS_NUM_THREADS started it at, so without it "one thread" ran its nets on two
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads),
               OMP_NUM_THREADS=str(args.threads), NUMBA_NUM_THREADS=str(args.threads),
               UNROLL_NUM_THREADS=str(args.threads))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        job = {"chars": len(lemmatizer.chars), "embed": config.embed, "hidden": config.hidden,
               "dropout": config.dropout, "attention": config.attention, "beam": args.beam,
               "lr": 3e-3, "bos": lemmatizer.bos,
               "eos": lemmatizer.eos, "dev": dev,
               "epochs": [[torch_batch(inputs) for _, inputs in batches] for batches in epochs]}
        with open(f"{tmp}/torch.pkl", "wb") as f:
            pickle.dump(job, f)
        Path(f"{tmp}/torch_side.py").write_text(TORCH_SIDE)
        with open(f"{tmp}/unroll.pkl", "wb") as f:
            pickle.dump({"make": _Make(train_words, config, args.seed), "lr": 3e-3,
                         "unroll_epochs": epochs, "pairs": pairs,
                         "beam": args.beam, "clock": args.clock}, f)
        for side, command in (
                ("unroll", [sys.executable, "-m", "bench.bench_lemmatize", "--side",
                            f"{tmp}/unroll.pkl", f"{tmp}/unroll.json"]),
                ("torch", [args.torch_python, f"{tmp}/torch_side.py", f"{tmp}/torch.pkl",
                           f"{tmp}/torch.json", str(args.threads), args.clock])):
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
        print(f"{side:6s} ({args.threads} thread(s), {args.clock} clock): training words/s "
              f"by epoch {speeds}; greedy decoding "
              f"{result['decode_words_per_s']:.0f} words/s (its first pass "
              f"{result['first_words_per_s']:.0f})"
              + f", beam {args.beam} {result['beam_words_per_s']:.0f}"
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
