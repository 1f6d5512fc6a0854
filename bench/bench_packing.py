"""Padding and nets on UD English EWT train: length buckets against packed rows.

Prints, for the bucketed sampler and for ``pack=True`` (default row lengths,
the tagger's training rows, and a few fixed shortest row lengths), the padding
fraction of the processed tokens, the number of distinct T (unrolled nets),
batches per epoch and real tokens per batch. No timing: the figures depend
only on the sentence lengths.

With ``--time N`` it then trains the default tagger for N batches of each of
the training's two samplers (length buckets, ``--no-pack``; packed rows, the
default), each in a fresh process, every net built and a few batches run
before the clock starts, and prints training tokens/s (forward, backward,
update and averaging, as ``train`` times them) and peak RSS. A benchmark: run
it on an idle machine.

    python -m bench.bench_packing                    (from the repository root)
    python -m bench.bench_packing --batch-size 64 --data DIR
    python -m bench.bench_packing --time 150
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ud_english_ewt"


def describe(name: str, sampler, epochs: int) -> str:
    padding = max(sampler.padding_fraction(e) for e in range(epochs))
    batches = len(sampler)
    tokens = int(sampler.lengths.sum()) / batches
    lengths = list(sampler.bucket_lengths)
    shown = lengths if len(lengths) <= 6 else [*lengths[:3], "...", *lengths[-2:]]
    return (f"{name:<34} {100 * padding:8.3f}% {sampler.num_buckets:6d} {batches:9d} "
            f"{tokens:10.0f}   {shown}")


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
    tokens, seconds = 0, 0.0
    for k, batch in enumerate(batches[: args.warmup + args.time]):
        inputs, n = batch_inputs(tagger, encoded, gold, batch, sampler)
        start = time.perf_counter()
        solver.step(1, feed=inputs)
        average.update()
        if k >= args.warmup:
            seconds += time.perf_counter() - start
            tokens += n
    return {"tokens_per_s": tokens / seconds, "nets": sampler.num_buckets,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def time_training(args) -> None:
    print(f"training the default tagger, {args.time} batches after {args.warmup} "
          f"(each in its own process)")
    results = {}
    for mode in ("bucketed", "packed"):
        command = [sys.executable, "-m", "bench.bench_packing", "--worker", mode,
                   "--data", str(args.data), "--batch-size", str(args.batch_size),
                   "--time", str(args.time), "--warmup", str(args.warmup)]
        done = subprocess.run(command, capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parents[1])
        results[mode] = r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{mode:<10} {r['tokens_per_s']:9.0f} tokens/s  {r['nets']:3d} nets  "
              f"peak {r['peak_mb']:.0f} MB")
    print(f"packed / bucketed tokens/s: "
          f"{results['packed']['tokens_per_s'] / results['bucketed']['tokens_per_s']:.2f}")


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
    if args.time:
        time_training(args)


if __name__ == "__main__":
    main()
