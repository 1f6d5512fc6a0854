"""Tagger training throughput: unroll bucketed, unbucketed and packed; PyTorch on the same batches.

Trains the word-level BiLSTM tagger (Embed 100 -> BiLSTM 128 -> InnerProduct
17, the architecture of ../shared/bench/torch_tagger.py) for a fixed number of
batches and prints real tokens per second (padding excluded), peak memory and
the padding fraction. "packed" is the tagger's training default: 32 rows of
whole sentences back to back, which only unroll runs (cont restarts each
sentence inside a row; ``nn.LSTM`` cannot), so it has no PyTorch twin here.
Each configuration runs in a fresh process so that its peak RSS is its own.
Where PyTorch is installed (in this interpreter or the one ``--torch-python``
names), the same model trains on the same batches in PyTorch (fused nn.LSTM on
packed sequences) and the ratios of throughput and peak RSS are printed. A
benchmark, not a test: run it on an idle machine.

    python -m bench.bench_tagger --batches 200      (from the repository root)
    python -m bench.bench_tagger --torch-python ../torchenv/bin/python
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def batches_for(mode: str, lengths, batch_size: int, seed: int):
    """Index batches and their padded length: bucketed by unroll's sampler, or random."""
    from unroll.train.bucketing import BucketSampler

    if mode == "bucketed":
        sampler = BucketSampler(lengths, batch_size=batch_size, seed=seed)
        return [(b, sampler.bucket_length(b)) for b in sampler.epoch_batches(0)]
    order = np.random.default_rng(seed).permutation(len(lengths)).tolist()
    out = []
    for i in range(0, len(order), batch_size):
        b = order[i : i + batch_size]
        out.append((b, max(lengths[j] for j in b)))
    return out


def load(data: Path):
    from examples.pos_tagging.features import Featurizer
    from examples.pos_tagging.tagger import tag_ids
    from unroll.tools.conllu import read_conllu

    sents = list(read_conllu(data / "en_ewt-ud-train.conllu"))
    featurizer = Featurizer.build([f for f, _ in sents], min_count={"word": 2})
    return sents, featurizer, tag_ids([t for _, t in sents])


def run_unroll(mode: str, args, queue) -> None:
    from examples.pos_tagging.packing import packed_inputs, training_sampler
    from examples.pos_tagging.tagger import Tagger, TaggerConfig
    from unroll.train.solver import Solver

    sents, featurizer, gold = load(args.data)
    config = TaggerConfig(embed=100, hidden=128, dropout=0.0, word_dropout=0.0,
                          batch=args.batch_size, feature_dims={}, chars={})
    tagger = Tagger(featurizer, config, seed=args.seed)
    encoded = tagger.encode([f for f, _ in sents])
    lengths = [len(f) for f, _ in sents]
    if mode == "packed":
        sampler = training_sampler(lengths, args.batch_size, args.seed)
        plan = [(rows, sampler.bucket_length(rows))
                for rows in sampler.epoch_batches(0)[: args.batches]]
    else:
        plan = batches_for(mode, lengths, args.batch_size, args.seed)[: args.batches]
    solver = Solver(tagger.train_model, type="Adam", base_lr=1e-3, momentum=0.9, momentum2=0.999)
    t0 = time.perf_counter()
    for T in dict.fromkeys(T for _b, T in plan):  # every net, built before the timing
        tagger.train_model.net(T)
    build = time.perf_counter() - t0
    if mode == "packed":
        feeds = [packed_inputs(tagger, encoded, rows, T, gold)[0] for rows, T in plan]
    else:
        feeds = [tagger.inputs([encoded[i] for i in b], T, [gold[i] for i in b])
                 for b, T in plan]
    for inputs in feeds[: args.warmup]:  # untimed steps: first-call costs out of the way
        solver.step(1, feed=lambda _, inputs=inputs: inputs)
    timed = plan[args.warmup :]
    start = time.perf_counter()
    for inputs in feeds[args.warmup :]:
        solver.step(1, feed=lambda _, inputs=inputs: inputs)
    seconds = time.perf_counter() - start
    sentences = ([i for row in b for i in row] if mode == "packed" else b for b, _ in timed)
    tokens = sum(lengths[i] for b in sentences for i in b)
    padded = sum(T * len(b) for b, T in timed)  # rows, when packed
    queue.put({
        "name": f"unroll {mode}", "tokens_per_s": tokens / seconds,
        "padding": 1 - tokens / padded, "peak_mb": resource.getrusage(
            resource.RUSAGE_SELF).ru_maxrss / 1024, "build_s": build,
        "nets": len(tagger.train_model.nets),
        "param_mb": tagger.train_model.param_nbytes / 2**20,
    })


def torch_batches(mode: str, args, path: Path) -> None:
    """Write the batches of ``mode`` for the PyTorch run as arrays (NumPy only to read)."""
    sents, featurizer, gold = load(args.data)
    encoded = [featurizer.encode(f)["word"] for f, _ in sents]
    lengths = [len(f) for f, _ in sents]
    arrays = {"vocab": np.array(len(featurizer.vocabs["word"]))}
    for k, (b, T) in enumerate(batches_for(mode, lengths, args.batch_size, args.seed)
                               [: args.batches]):
        words = np.zeros((len(b), T), np.int64)
        tags = np.full((len(b), T), -1, np.int64)
        for row, i in enumerate(b):
            words[row, : lengths[i]] = encoded[i]
            tags[row, : lengths[i]] = gold[i]
        arrays[f"words{k}"], arrays[f"tags{k}"] = words, tags
        arrays[f"lens{k}"] = np.array([lengths[i] for i in b])
    np.savez(path, **arrays)


def torch_worker(path: Path, warmup: int, seed: int) -> dict:
    """Train the PyTorch twin on the batches in ``path``; runs in PyTorch's interpreter."""
    import torch
    from torch import nn
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.manual_seed(seed)
    data = np.load(path)
    n = sum(1 for k in data.files if k.startswith("words"))
    feeds = [tuple(torch.as_tensor(data[f"{what}{k}"]) for what in ("words", "tags", "lens"))
             for k in range(n)]

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(int(data["vocab"]), 100)
            self.lstm = nn.LSTM(100, 128, bidirectional=True, batch_first=True)
            self.out = nn.Linear(256, 17)

        def forward(self, words, lens):
            x = pack_padded_sequence(self.embed(words), lens, batch_first=True,
                                     enforce_sorted=False)
            h, _ = pad_packed_sequence(self.lstm(x)[0], batch_first=True,
                                       total_length=words.shape[1])
            return self.out(h)

    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss(ignore_index=-1)
    start = None
    for k, (words, tags, lens) in enumerate(feeds):
        if k == warmup:
            start = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(words, lens).reshape(-1, 17), tags.reshape(-1))
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - start
    tokens = sum(int(lens.sum()) for _, _, lens in feeds[warmup:])
    padded = sum(words.numel() for words, _, _ in feeds[warmup:])
    return {"tokens_per_s": tokens / seconds, "padding": 1 - tokens / padded,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "threads": torch.get_num_threads()}


def run_torch(mode: str, args) -> dict:
    """The PyTorch twin on the same batches, in a fresh ``args.torch_python`` process."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batches.npz"
        torch_batches(mode, args, path)
        done = subprocess.run(
            [args.torch_python, "-m", "bench.bench_tagger", "--torch-worker", str(path),
             "--warmup", str(args.warmup), "--seed", str(args.seed)],
            capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    return {"name": f"torch {mode}", **json.loads(done.stdout.strip().splitlines()[-1])}


def in_process(target, mode, args) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(mode, args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None,
                        help="the EWT folder (default: the one unroll.tools.ewt finds)")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--torch-python", default=sys.executable, metavar="PYTHON",
                        help="the interpreter that has PyTorch (default: this one)")
    parser.add_argument("--modes", nargs="+", choices=["bucketed", "unbucketed", "packed"],
                        default=["bucketed", "unbucketed", "packed"])
    parser.add_argument("--torch-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_worker:
        print(json.dumps(torch_worker(args.torch_worker, args.warmup, args.seed)))
        return 0
    if args.data is None:
        from unroll.tools.ewt import data_dir  # not in the PyTorch worker: its interpreter
        args.data = data_dir()                 # may have no CoNLL-U reader
    have_torch = not args.no_torch and subprocess.run(
        [args.torch_python, "-c", "import torch"], capture_output=True, check=False
    ).returncode == 0
    results = []
    for mode in args.modes:
        results.append(in_process(run_unroll, mode, args))
        if have_torch and mode != "packed":
            results.append(run_torch(mode, args))
    print(f"{'run':<20} {'tokens/s':>9} {'padding':>8} {'peak MB':>8}  notes")
    for r in results:
        notes = (f"{r['nets']} nets built in {r['build_s']:.1f} s (excluded), params "
                 f"{r['param_mb']:.1f} MB" if "nets" in r else f"{r['threads']} threads")
        print(f"{r['name']:<20} {r['tokens_per_s']:9.0f} {100 * r['padding']:7.1f}% "
              f"{r['peak_mb']:8.0f}  {notes}")
    by = {r["name"]: r for r in results}
    for mode in args.modes:
        if f"torch {mode}" in by:
            mine, theirs = by[f"unroll {mode}"], by[f"torch {mode}"]
            print(f"unroll / torch, {mode}: tokens/s "
                  f"{mine['tokens_per_s'] / theirs['tokens_per_s']:.2f}, peak RSS "
                  f"{mine['peak_mb'] / theirs['peak_mb']:.2f}")
    for other in ("unbucketed", "packed"):
        if "bucketed" in args.modes and other in args.modes:
            ratio = by[f"unroll {other}"]["tokens_per_s"] / by["unroll bucketed"]["tokens_per_s"]
            print(f"unroll {other} / bucketed tokens/s: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
