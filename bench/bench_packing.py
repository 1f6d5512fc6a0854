"""Padding and nets on UD English EWT train: length buckets against packed rows.

Prints, for the bucketed sampler and for ``pack=True`` (default row lengths,
the tagger's training rows, and a few fixed shortest row lengths), the padding
fraction of the processed tokens, the number of distinct T (unrolled nets),
batches per epoch and real tokens per batch, then the character LSTM's
padding: its real characters against the slots it computes. No timing: the
figures depend only on the sentence lengths (and the words' spelling).

With ``--time N`` it then trains the default tagger for N batches of each of
the training's two samplers (length buckets, ``--no-pack``; packed rows, the
default; ``--modes`` picks), each in a fresh process, every net built and a few
batches run before the clock starts, and prints training tokens/s (forward,
backward, update and averaging, as ``train`` times them) and peak RSS. A
benchmark: run it on an idle machine.

``--threads`` runs every worker at each of those BLAS thread counts
(``UNROLL_NUM_THREADS``; unset: the engine's policy); ``--twin PYTHON`` adds,
at each count, the PyTorch twin of the default tagger
(../shared/bench/torch_full_tagger.py at the default's sizes, in the
interpreter that has torch) for as many batches, warmup included, and prints
unroll's tokens/s over the twin's; ``--baseline PATH`` adds this script's
workers run on another checkout (the commit before a change), and ``--turns K``
repeats the whole round K times, so that the ratios come from runs side by side
while the machine's load changes. ``--clock cpu`` times by the process's CPU
time instead of the wall clock (the twin's too): on a busy machine the steady
measure, at one thread only.

    python -m bench.bench_packing                    (from the repository root)
    python -m bench.bench_packing --batch-size 64 --data DIR
    python -m bench.bench_packing --time 150
    python -m bench.bench_packing --time 150 --modes packed --threads 1 2 --turns 3 \
        --twin ../torchenv/bin/python --baseline ../before
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "ud_english_ewt"
TWIN = ROOT.parent / "shared" / "bench" / "torch_full_tagger.py"
#: the twin's sizes of the default tagger (``TaggerConfig()``)
TWIN_SIZES = ["--hidden", "256", "--dropout", "0.5", "--char-embed", "32", "--char-hidden", "64",
              "--char-length", "16"]


def describe(name: str, sampler, epochs: int) -> str:
    padding = max(sampler.padding_fraction(e) for e in range(epochs))
    batches = len(sampler)
    tokens = int(sampler.lengths.sum()) / batches
    lengths = list(sampler.bucket_lengths)
    shown = lengths if len(lengths) <= 6 else [*lengths[:3], "...", *lengths[-2:]]
    return (f"{name:<34} {100 * padding:8.3f}% {sampler.num_buckets:6d} {batches:9d} "
            f"{tokens:10.0f}   {shown}")


def character_slots(args) -> None:
    """The character LSTM's real characters against the slots it computes, on one epoch of
    the tagger's training rows: its (C, columns) grid, columns rounded up to 16 and grown
    to the most each (T, N) needed before (``Tagger._char_inputs``)."""
    from examples.pos_tagging.features import Featurizer
    from examples.pos_tagging.packing import join_rows, training_sampler
    from examples.pos_tagging.tagger import Tagger, TaggerConfig
    from unroll.tools.conllu import read_conllu

    forms = [f for f, _ in read_conllu(args.data / "en_ewt-ud-train.conllu")]
    tagger = Tagger(Featurizer.build(forms), TaggerConfig(), seed=0)
    encoded = tagger.encode(forms)
    sampler = training_sampler([len(f) for f in forms], args.batch_size)
    real = computed = 0
    for batch in sampler.epoch_batches(0):
        host = tagger.host_inputs(join_rows(encoded, batch), sampler.bucket_length(batch))
        # a word's first character has cont 0 and marks the word's cell in chars_at
        real += int(host["chars_cont"].sum()) + int((host["chars_at"] >= 0).sum())
        computed += host["chars_cont"].size
    print(f"character LSTM, tagger's training rows: {real} characters in {computed} computed "
          f"slots, {100 * (1 - real / computed):.1f}% of them padding")


def train_worker(args) -> dict:
    """Training tokens/s of the default tagger on ``args.worker``'s batches (this process)."""
    from examples.pos_tagging.features import Featurizer
    from examples.pos_tagging.packing import batch_inputs, training_sampler
    from examples.pos_tagging.tagger import Tagger, TaggerConfig, tag_ids
    from examples.pos_tagging.train import TrainOptions, training_solver
    from unroll.tools.conllu import read_conllu
    from unroll.train.trainer import ParamAverage

    pack = args.worker == "packed"
    sents = list(read_conllu(args.data / "en_ewt-ud-train.conllu"))
    tagger = Tagger(Featurizer.build([f for f, _ in sents]), TaggerConfig(), seed=0)
    encoded, gold = tagger.encode([f for f, _ in sents]), tag_ids([t for _, t in sents])
    sampler = training_sampler([len(f) for f, _ in sents], args.batch_size, pack=pack)
    opts = TrainOptions(data=args.data, model_dir=Path(), pack=pack)
    solver = training_solver(tagger.train_model, opts, len(sampler))
    average = ParamAverage(tagger.train_model.learnable_params)
    for length in sampler.bucket_lengths:  # every net built before the clock starts
        tagger.train_model.net(length)
    batches = sampler.epoch_batches(0)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    tokens, seconds = 0, 0.0
    for k, batch in enumerate(batches[: args.warmup + args.time]):
        inputs, n = batch_inputs(tagger, encoded, gold, batch, sampler)
        start = clock()
        solver.step(1, feed=inputs)
        average.update()
        if k >= args.warmup:
            seconds += clock() - start
            tokens += n
    return {"tokens_per_s": tokens / seconds, "nets": sampler.num_buckets,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_worker(args, mode: str, threads: str | None, root: Path = ROOT) -> dict:
    """One training worker in a fresh process, on the checkout at ``root``."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", mode,
               "--data", str(args.data), "--batch-size", str(args.batch_size),
               "--time", str(args.time), "--warmup", str(args.warmup), "--clock", args.clock]
    env = dict(os.environ, PYTHONPATH=str(root))  # root's unroll and examples
    if threads is not None:
        env["UNROLL_NUM_THREADS"] = threads
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=root,
                          env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_twin(args, threads: str | None) -> dict:
    """The PyTorch twin on one epoch's first warmup + time batches, in ``args.twin``."""
    # the twin times with perf_counter; --clock cpu makes that the process's CPU time
    clock = "import time; time.perf_counter = time.process_time; " if args.clock == "cpu" else ""
    command = [args.twin, "-c", f"{clock}import runpy, sys; sys.argv = sys.argv[1:]; "
               f"runpy.run_path(sys.argv[0], run_name='__main__')", str(TWIN),
               "--data", str(args.data), "--epochs", "1",
               "--max-batches", str(args.warmup + args.time), "--threads", threads or "2",
               *TWIN_SIZES]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    epoch = next(line for line in done.stdout.splitlines() if line.startswith("epoch 1:"))
    rss = next(line for line in done.stdout.splitlines() if line.startswith("peak RSS"))
    return {"tokens_per_s": float(epoch.split(" tokens/s")[0].split()[-1]),
            "peak_mb": float(rss.split()[2])}


def time_training(args) -> None:
    print(f"training the default tagger, {args.time} batches after {args.warmup} "
          f"(each in its own process), clock {args.clock}")
    counts = args.threads or [None]
    sides = [(f"unroll {mode}", mode, ROOT) for mode in args.modes]
    if args.baseline:
        sides += [(f"baseline {mode}", mode, Path(args.baseline).resolve())
                  for mode in args.modes]
    results: dict = {}
    for turn in range(args.turns):
        for threads in counts:
            at = f"threads {threads or 'policy'}"
            for name, mode, root in sides:
                r = run_worker(args, mode, threads, root)
                results.setdefault((at, name), []).append(r["tokens_per_s"])
                print(f"turn {turn + 1} {at:<14} {name:<18} {r['tokens_per_s']:9.0f} tokens/s"
                      f"  {r['nets']:3d} nets  peak {r['peak_mb']:.0f} MB", flush=True)
            if args.twin:
                r = run_twin(args, threads)
                results.setdefault((at, "twin"), []).append(r["tokens_per_s"])
                print(f"turn {turn + 1} {at:<14} {'twin (torch)':<18} "
                      f"{r['tokens_per_s']:9.0f} tokens/s  peak {r['peak_mb']:.0f} MB",
                      flush=True)
    print("\nmedian tokens/s, and the ratios of each turn's runs (median)")
    for (at, name), rates in results.items():
        print(f"  {at:<14} {name:<18} {statistics.median(rates):9.0f}")
    pairs = [(a, b) for a in ("packed", "bucketed") if a in args.modes
             for b in ("twin", "baseline " + a, "unroll bucketed") if b != "unroll " + a]
    for threads in counts:
        at = f"threads {threads or 'policy'}"
        for a, b in pairs:
            mine, theirs = results.get((at, f"unroll {a}")), results.get((at, b))
            if mine and theirs:
                ratios = [x / y for x, y in zip(mine, theirs)]
                print(f"  {at:<14} unroll {a} / {b}: {statistics.median(ratios):.2f} "
                      f"({', '.join(f'{r:.2f}' for r in ratios)})")


def main(argv=None) -> None:
    from examples.pos_tagging.packing import training_sampler
    from unroll.tools.conllu import read_conllu
    from unroll.train.bucketing import BucketSampler, choose_row_lengths

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--batch-size", type=int, default=32, help="sentences or rows a batch")
    parser.add_argument("--epochs", type=int, default=3, help="epochs to take the worst of")
    parser.add_argument("--time", type=int, default=0, metavar="N",
                        help="then time N training batches of the default tagger per sampler")
    parser.add_argument("--warmup", type=int, default=10, help="untimed batches first")
    parser.add_argument("--modes", nargs="+", choices=["bucketed", "packed"],
                        default=["bucketed", "packed"], help="the samplers --time trains")
    parser.add_argument("--threads", nargs="+", metavar="N",
                        help="BLAS thread counts to time at (default: the engine's policy)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--twin", metavar="PYTHON",
                        help="an interpreter with torch: time the PyTorch twin too")
    parser.add_argument("--baseline", metavar="PATH",
                        help="another checkout whose workers join the turns")
    parser.add_argument("--turns", type=int, default=1, help="rounds of every run, in turns")
    parser.add_argument("--worker", choices=["bucketed", "packed"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(train_worker(args)))
        return
    train = args.data / "en_ewt-ud-train.conllu"
    if not train.is_file():
        parser.error(f"{train} not found: pass --data DIR, the folder of UD English EWT")

    lengths = [len(forms) for forms, _ in read_conllu(train)]
    print(f"EWT train: {len(lengths)} sentences, {sum(lengths)} tokens, longest {max(lengths)}; "
          f"batch size {args.batch_size}")
    print(f"{'sampler':<34} {'padding':>9} {'nets':>6} {'batches':>9} {'tok/batch':>10}   "
          f"row / bucket lengths")
    bs = args.batch_size
    print(describe("bucketed (default boundaries)", BucketSampler(lengths, bs), args.epochs))
    print(describe("pack=True (default row lengths)",
                   BucketSampler(lengths, bs, pack=True), args.epochs))
    mean = round(sum(lengths) / len(lengths))
    print(describe(f"tagger's training (rows from {mean})",
                   training_sampler(lengths, bs), args.epochs))
    for shortest in (16, 24, 32, 64):
        rows = choose_row_lengths(lengths, shortest)
        sampler = BucketSampler(lengths, bs, boundaries=rows, pack=True)
        print(describe(f"pack=True, shortest row {shortest}", sampler, args.epochs))
    budget = bs * round(sum(lengths) / len(lengths))
    print(describe(f"pack=True, by_tokens={budget}",
                   BucketSampler(lengths, budget, by_tokens=True, pack=True), args.epochs))
    character_slots(args)
    if args.time:
        time_training(args)


if __name__ == "__main__":
    main()
