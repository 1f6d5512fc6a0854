"""python -m examples.lemmatize {train,evaluate,lemmatize,fetch}: a character seq2seq lemmatizer.

  python -m examples.lemmatize train --model-dir runs/lemma           # the default run
  python -m examples.lemmatize train --model-dir runs/lemma --resume  # continue it
  python -m examples.lemmatize evaluate --model-dir runs/lemma --split dev
  python -m examples.lemmatize lemmatize --model-dir runs/lemma --conllu in.conllu -o out

``lemmatize`` fills column 3 (LEMMA) of every word from its form and the file's own
UPOS (the training dictionary where it knows the pair, the seq2seq for the rest),
and keeps every other byte. Without --data or $UNROLL_EWT_DATA, and without
../shared/data, train and evaluate fetch UD English EWT as the tagger does.

`lemmatize` and `evaluate` write to standard output, or with -o OUT to OUT (a
file is replaced whole; a device, a FIFO or a symlink's file is written through).

Errors print one line (--debug: the traceback); exit status 2 for bad input
or usage, 1 for a failure while running (divergence, a full disk), 130 for a
training stopped by Ctrl-C (the folder keeps its last epoch, to --resume).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from unroll.tools import app_cli
from unroll.tools.output import write_output

PROG = "python -m examples.lemmatize"
#: the LemmatizerConfig fields that train sets from options of the same names
SIZE_OPTIONS = ("embed", "hidden", "dropout", "batch", "attention")


def _on_cpu(args) -> None:
    if args.device != "cpu":
        raise ValueError(f"--device {args.device}: the lemmatizer runs on the CPU only")


def _train(args) -> int:
    from examples.lemmatize.train import LemmatizerTraining, TrainOptions, train
    from unroll.tools.ewt import fetched_data_dir

    _on_cpu(args)
    result = train(TrainOptions.from_args(
        args, data=fetched_data_dir(args.data, args.quiet),
        sizes={k: getattr(args, k) for k in SIZE_OPTIONS if getattr(args, k) is not None}))
    app_cli.report_training(args, result, LemmatizerTraining.metric)
    return 0


def _evaluate(args) -> int:
    from examples.lemmatize.model import Lemmatizer
    from examples.lemmatize.train import read_words, scores

    _on_cpu(args)
    path = app_cli.evaluated_file(args, args.file, "a CoNLL-U FILE")
    words = read_words(path)
    lemmatizer = Lemmatizer.load(args.model_dir, args.checkpoint)
    lines = []
    for beam in sorted({1, args.beam}):
        s = scores(lemmatizer, words, beam=beam)
        lines.append(
            f"{path}: {len(words)} words, {s['pairs']} distinct (form, UPOS); "
            f"{'greedy' if beam == 1 else f'beam {beam}'}: seq2seq {100 * s['seq2seq']:.2f}%  "
            f"dictionary + seq2seq {100 * s['combined']:.2f}%  with lower-casing "
            f"{100 * s['combined_lower']:.2f}%  (dictionary alone {100 * s['dictionary']:.2f}%)\n")
    write_output("".join(lines), args.output)
    return 0


def _lemmatize(args) -> int:
    from examples.lemmatize.conll import fill_lemmas, read_lemmas
    from examples.lemmatize.model import Lemmatizer

    _on_cpu(args)
    sents = read_lemmas(args.conllu, labelled=False)
    lemmatizer = Lemmatizer.load(args.model_dir, args.checkpoint)
    words = [(f, u) for forms, upos, _ in sents for f, u in zip(forms, upos)]
    found = iter(lemmatizer.lemmatize(words, beam=args.beam, lower=args.lower))
    lemmas = [[next(found) for _ in forms] for forms, _, _ in sents]
    fill_lemmas(args.conllu, lemmas, args.output or "-")  # every byte but column 3 as it came
    return 0


def build_parser() -> argparse.ArgumentParser:
    from examples.lemmatize.model import ATTENTION, LemmatizerConfig
    from examples.lemmatize.train import LR, TrainOptions

    parser, sub = app_cli.app_parser(PROG, __doc__)
    model, data = app_cli.model_options("runs/lemma"), app_cli.data_options()
    t = sub.add_parser("train", parents=[model, data, app_cli.training_options(
        TrainOptions.epochs, f"Adam's, times 0.95 after each epoch, default {LR:g}")],
                       help="train on EWT train, tune on dev")
    d = LemmatizerConfig()
    sizes = t.add_argument_group("model sizes (with --resume: only to check the folder's)")
    sizes.add_argument("--hidden", type=app_cli.positive_int,
                       help=f"each encoder direction's LSTM (the decoder's is twice it; "
                            f"default {d.hidden})")
    sizes.add_argument("--embed", type=app_cli.positive_int,
                       help=f"character embedding size (default {d.embed})")
    sizes.add_argument("--dropout", type=app_cli.ratio, help=f"default {d.dropout}")
    sizes.add_argument("--batch", type=app_cli.positive_int,
                       help=f"words per batch (default {d.batch})")
    sizes.add_argument("--attention", choices=ATTENTION,
                       help=f"the decoder's Luong attention over the encoder's outputs: its "
                            f"score, or none (default {d.attention})")
    t.set_defaults(run=_train, interrupted="resume with --resume")

    weights = app_cli.checkpoint_options()
    e = sub.add_parser("evaluate", parents=[model, data, app_cli.split_options(("dev", "test")),
                                            weights, app_cli.output_options()],
                       help="lemma accuracies on a CoNLL-U file, or a split of the data folder")
    e.add_argument("file", type=Path, nargs="?", help="a CoNLL-U file with UPOS and lemmas")
    e.add_argument("--beam", type=app_cli.positive_int, default=4,
                   help="beam width; evaluate reports greedy and this (default 4)")
    e.set_defaults(run=_evaluate)

    m = sub.add_parser("lemmatize", parents=[model, weights, app_cli.output_options()],
                       help="fill column 3 of a CoNLL-U file")
    m.add_argument("--conllu", type=Path, required=True, metavar="IN",
                   help="a CoNLL-U file with UPOS (column 3 may be '_')")
    m.add_argument("--beam", type=app_cli.positive_int, default=1,
                   help="beam width (default 1: greedy)")
    m.add_argument("--lower", action="store_true",
                   help="look the lower-cased form up in the dictionary too")
    m.set_defaults(run=_lemmatize)

    app_cli.add_fetch(sub)
    return parser


def main(argv=None) -> int:
    """Run the command; errors print one line (exit 2: bad input, 1: a failure; 130: Ctrl-C)."""
    return app_cli.run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
