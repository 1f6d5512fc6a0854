"""python -m examples.deprel {train,evaluate,label,fetch}: DEPREL labelling given the gold tree.

  python -m examples.deprel train --model-dir runs/tree              # the default run
  python -m examples.deprel train --model-dir runs/seq --model baseline
  python -m examples.deprel evaluate --model-dir runs/tree           # dev label accuracy
  python -m examples.deprel label --model-dir runs/tree --conllu in.conllu -o out.conllu
  python -m examples.deprel fetch

``label`` fills column 8 (DEPREL) of every word from the file's own words, UPOS
and heads (column 7), and keeps every other byte. Without --data or
$UNROLL_EWT_DATA, and without ../shared/data, train and evaluate fetch UD
English EWT (verified by SHA-256), as the tagger does.

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

__all__ = ["build_parser", "main"]

PROG = "python -m examples.deprel"
#: DeprelConfig fields that train options set
SIZE_OPTIONS = ("model", "hidden")


def _train(args) -> int:
    from examples.deprel.train import DeprelTraining, TrainOptions, train
    from unroll.tools.ewt import fetched_data_dir

    result = train(TrainOptions.from_args(
        args, data=fetched_data_dir(args.data, args.quiet),
        sizes={k: getattr(args, k) for k in SIZE_OPTIONS if getattr(args, k) is not None}))
    app_cli.report_training(args, result, DeprelTraining.metric)
    return 0


def _evaluate(args) -> int:
    from examples.deprel.labeller import Labeller
    from examples.deprel.train import accuracy, read_trees

    path = app_cli.evaluated_file(args, args.conllu, "--conllu FILE")
    sentences = read_trees(path)
    labeller = Labeller.load(args.model_dir, args.checkpoint, device=args.device)
    score = accuracy([s.deprels for s in sentences],
                     labeller.predict(labeller.encode(sentences)))
    write_output(f"{path}: label accuracy {100 * score:.2f}% over "
                 f"{sum(len(s.forms) for s in sentences)} words\n", args.output)
    return 0


def _label(args) -> int:
    from examples.deprel.conll import fill_deprel
    from examples.deprel.labeller import Labeller
    from examples.deprel.train import read_trees

    sentences = read_trees(args.conllu, labelled=False)
    labeller = Labeller.load(args.model_dir, args.checkpoint, device=args.device)
    labels = labeller.predict(labeller.encode(sentences))
    fill_deprel(args.conllu, labels, args.output or "-")  # every byte but column 8 as it came
    return 0


def build_parser() -> argparse.ArgumentParser:
    from examples.deprel.labeller import MODELS, DeprelConfig
    from examples.deprel.train import LR, TrainOptions

    parser, sub = app_cli.app_parser(PROG, __doc__)
    model, data = app_cli.model_options("runs/deprel"), app_cli.data_options()
    t = sub.add_parser("train", parents=[model, data, app_cli.training_options(
        TrainOptions.epochs, f"Adam's, default {LR:g}")],
                       help="train a labeller on EWT train, tune on dev")
    d = DeprelConfig()
    sizes = t.add_argument_group("model (with --resume: only to check the folder's)")
    sizes.add_argument("--model", choices=MODELS,
                       help="tree: a bidirectional child-sum Tree-LSTM over the gold tree; "
                            f"baseline: a sequence BiLSTM (default: {d.model})")
    sizes.add_argument("--hidden", type=app_cli.positive_int,
                       help=f"LSTM size per direction (default {d.hidden})")
    t.set_defaults(run=_train, interrupted="resume with --resume")

    weights = app_cli.checkpoint_options()
    e = sub.add_parser("evaluate", parents=[model, data, app_cli.split_options(("dev", "test")),
                                            weights, app_cli.output_options()],
                       help="label accuracy on a split of the data folder (default: dev) or "
                            "on --conllu FILE")
    e.add_argument("--conllu", type=Path, metavar="FILE", help="a CoNLL-U file with DEPREL")
    g = sub.add_parser("label", parents=[model, weights, app_cli.output_options()],
                       help="fill column 8 of --conllu IN")
    g.add_argument("--conllu", type=Path, required=True, metavar="IN",
                   help="a CoNLL-U file with words, UPOS and heads (DEPREL may be '_')")
    e.set_defaults(run=_evaluate)
    g.set_defaults(run=_label)

    app_cli.add_fetch(sub)
    return parser


def main(argv=None) -> int:
    """Run the command; errors print one line (exit 2: bad input, 1: a failure; 130: Ctrl-C)."""
    return app_cli.run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
