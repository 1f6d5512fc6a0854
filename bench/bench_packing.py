"""Padding and nets on UD English EWT train: length buckets against packed rows.

Prints, for the bucketed sampler and for ``pack=True`` (default row lengths,
the tagger's training rows, and a few fixed shortest row lengths), the padding
fraction of the processed tokens, the number of distinct T (unrolled nets),
batches per epoch and real tokens per batch. No timing: the figures depend
only on the sentence lengths.

    python -m bench.bench_packing                    (from the repository root)
    python -m bench.bench_packing --batch-size 64 --data DIR
"""

from __future__ import annotations

import argparse
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


def main(argv=None) -> None:
    from examples.pos_tagging.conll import read_conllu
    from examples.pos_tagging.packing import training_sampler
    from unroll.bucketing import BucketSampler, choose_row_lengths

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--batch-size", type=int, default=32, help="sentences or rows a batch")
    parser.add_argument("--epochs", type=int, default=3, help="epochs to take the worst of")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    main()
