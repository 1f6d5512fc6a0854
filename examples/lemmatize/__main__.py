"""``python -m examples.lemmatize train|evaluate|lemmatize``: a character seq2seq lemmatizer.

    python -m examples.lemmatize train --model-dir runs/lemma          # the default run
    python -m examples.lemmatize train --model-dir runs/lemma --resume # continue it
    python -m examples.lemmatize evaluate --model-dir runs/lemma       # dev accuracies
    python -m examples.lemmatize lemmatize --model-dir runs/lemma --conllu in.conllu -o out

``lemmatize`` fills column 3 (LEMMA) of every word from its form and the file's own
UPOS (the training dictionary where it knows the pair, the seq2seq for the rest),
and keeps every other byte.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from unroll.tools.app_cli import positive_int
from unroll.tools.app_cli import run as run_app

__all__ = ["build_parser", "main"]


def _train(args) -> int:
    from examples.lemmatize.train import TrainOptions, train
    from unroll.tools.ewt import fetched_data_dir

    log = train(TrainOptions(
        model_dir=Path(args.model_dir), data=fetched_data_dir(args.data, args.quiet),
        epochs=args.epochs,
        lr=args.lr, hidden=args.hidden, embed=args.embed, dropout=args.dropout,
        batch=args.batch, limit=args.limit, max_minutes=args.max_minutes or None,
        seed=args.seed, quiet=args.quiet, resume=args.resume, overwrite=args.overwrite))
    if log:
        best = max(log, key=lambda e: e["dev_combined"])
        print(f"done: {len(log)} epochs into {args.model_dir}: best dev combined "
              f"{100 * best['dev_combined']:.2f}% (epoch {best['epoch']}; seq2seq alone "
              f"{100 * best['dev_accuracy']:.2f}%, with lower-casing "
              f"{100 * best['dev_combined_lower']:.2f}%)")
    return 0


def _evaluate(args) -> int:
    from examples.lemmatize.conll import read_lemmas
    from examples.lemmatize.model import Lemmatizer
    from examples.lemmatize.train import scores, words_of
    from unroll.tools.ewt import DEV_FILE, fetched_data_dir

    path = Path(args.conllu) if args.conllu else fetched_data_dir(args.data) / DEV_FILE
    words = words_of(read_lemmas(path))
    lemmatizer = Lemmatizer.load(Path(args.model_dir), args.checkpoint)
    for beam in sorted({1, args.beam}):
        s = scores(lemmatizer, words, beam=beam)
        print(f"{path}: {len(words)} words, {s['pairs']} distinct (form, UPOS); "
              f"{'greedy' if beam == 1 else f'beam {beam}'}: seq2seq {100 * s['seq2seq']:.2f}%  "
              f"dictionary + seq2seq {100 * s['combined']:.2f}%  with lower-casing "
              f"{100 * s['combined_lower']:.2f}%  (dictionary alone {100 * s['dictionary']:.2f}%)"
              f"  {s['words_per_s']:.0f} words/s")
    return 0


def _lemmatize(args) -> int:
    from examples.lemmatize.conll import fill_lemmas, read_lemmas
    from examples.lemmatize.model import Lemmatizer

    sents = read_lemmas(args.conllu, labelled=False)
    lemmatizer = Lemmatizer.load(Path(args.model_dir), args.checkpoint)
    words = [(f, u) for forms, upos, _ in sents for f, u in zip(forms, upos)]
    found = iter(lemmatizer.lemmatize(words, beam=args.beam, lower=args.lower))
    lemmas = [[next(found) for _ in forms] for forms, _, _ in sents]
    fill_lemmas(args.conllu, lemmas, args.output or "-")  # -o as a shell redirect, or stdout
    return 0


def build_parser() -> argparse.ArgumentParser:
    from examples.lemmatize.model import LemmatizerConfig

    parser = argparse.ArgumentParser(prog="python -m examples.lemmatize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    d = LemmatizerConfig()
    tr = sub.add_parser("train", help="train a lemmatizer into a model folder")
    tr.add_argument("--model-dir", required=True)
    tr.add_argument("--data", help="the folder of EWT's train and dev .conllu (default: as the "
                                   "tagger finds it)")
    tr.add_argument("--epochs", type=positive_int, default=40,
                    help="in all, with --resume the folder's included (default 40)")
    tr.add_argument("--lr", type=float, default=3e-3)
    sizes = tr.add_argument_group("model sizes (with --resume: only to check the folder's)")
    sizes.add_argument("--hidden", type=positive_int,
                       help=f"each encoder direction's LSTM (the decoder's is twice it; "
                            f"default {d.hidden})")
    sizes.add_argument("--embed", type=positive_int,
                       help=f"character embedding size (default {d.embed})")
    sizes.add_argument("--dropout", type=float, help=f"default {d.dropout}")
    sizes.add_argument("--batch", type=positive_int, help=f"default {d.batch}")
    tr.add_argument("--limit", type=int, default=0, help="only the first N sentences of each "
                                                         "split (a quick run)")
    tr.add_argument("--max-minutes", type=float, default=20.0,
                    help="start no epoch that would end after M minutes (default 20; 0: none)")
    tr.add_argument("--seed", type=int, help="of the initial weights, shuffles and dropout "
                                             "(default 0; with --resume the folder's)")
    again = tr.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue from the last epoch's snapshot in --model-dir")
    again.add_argument("--overwrite", action="store_true", help="replace the folder's model")
    tr.add_argument("--quiet", action="store_true")
    tr.set_defaults(run=_train)
    for name, helps, run in (("evaluate", "dev (or --conllu) lemma accuracies", _evaluate),
                             ("lemmatize", "fill column 3 of --conllu IN", _lemmatize)):
        p = sub.add_parser(name, help=helps)
        p.add_argument("--model-dir", required=True)
        p.add_argument("--conllu", required=name == "lemmatize", metavar="IN")
        p.add_argument("--checkpoint", choices=["best", "last"], default="best")
        p.add_argument("--beam", type=positive_int, default=4 if name == "evaluate" else 1,
                       help="beam width (1: greedy)" + (
                           "; evaluate reports greedy and this" if name == "evaluate" else ""))
        if name == "evaluate":
            p.add_argument("--data")
        else:
            p.add_argument("-o", "--output", metavar="OUT", help="default: stdout")
            p.add_argument("--lower", action="store_true",
                           help="look the lower-cased form up in the dictionary too")
        p.set_defaults(run=run)
    return parser


def main(argv=None) -> int:
    """Run the command; errors print one line (exit 2: bad input, 1: a failure)."""
    return run_app(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
