"""``python -m examples.deprel train|evaluate|label``: DEPREL labelling given the gold tree.

    python -m examples.deprel train --model-dir runs/tree              # the default run
    python -m examples.deprel train --model-dir runs/seq --model baseline
    python -m examples.deprel evaluate --model-dir runs/tree           # dev label accuracy
    python -m examples.deprel label --model-dir runs/tree --conllu in.conllu -o out.conllu

``label`` fills column 8 (DEPREL) of every word from the file's own words, UPOS
and heads (column 7), and keeps every other byte.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from unroll.tools.app_cli import run as run_app

__all__ = ["build_parser", "main"]


def _train(args) -> int:
    from examples.deprel.train import TrainOptions, train
    from unroll.tools.ewt import fetched_data_dir

    log = train(TrainOptions(model_dir=Path(args.model_dir),
                             data=fetched_data_dir(args.data, args.quiet),
                             model=args.model, epochs=args.epochs, lr=args.lr,
                             hidden=args.hidden, limit=args.limit, max_minutes=args.max_minutes,
                             seed=args.seed, quiet=args.quiet, overwrite=args.overwrite))
    if log:
        best = max(e["dev_accuracy"] for e in log)
        print(f"trained {len(log)} epochs into {args.model_dir}: best dev label accuracy "
              f"{100 * best:.2f}%")
    return 0


def _evaluate(args) -> int:
    from examples.deprel.conll import read_deprel
    from examples.deprel.labeller import Labeller
    from examples.deprel.train import accuracy
    from unroll.tools.ewt import DEV_FILE, fetched_data_dir

    path = Path(args.conllu) if args.conllu else fetched_data_dir(args.data) / DEV_FILE
    sents = read_deprel(path)
    labeller = Labeller.load(Path(args.model_dir), args.checkpoint)
    acc = accuracy([s.deprels for s in sents], labeller.predict(labeller.encode(sents)))
    print(f"{path}: label accuracy {100 * acc:.2f}% over {sum(len(s.forms) for s in sents)} "
          f"words")
    return 0


def _label(args) -> int:
    from examples.deprel.conll import fill_deprel, read_deprel
    from examples.deprel.labeller import Labeller

    sents = read_deprel(args.conllu, labelled=False)
    labeller = Labeller.load(Path(args.model_dir), args.checkpoint)
    labels = labeller.predict(labeller.encode(sents))
    fill_deprel(args.conllu, labels, args.output or "-")  # -o as a shell redirect, or stdout
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m examples.deprel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    tr = sub.add_parser("train", help="train a labeller into a model folder")
    tr.add_argument("--model-dir", required=True)
    tr.add_argument("--data", help="the folder of EWT's train and dev .conllu (default: as the "
                                   "tagger finds it)")
    tr.add_argument("--model", choices=["tree", "baseline"], default="tree",
                    help="tree: a bidirectional child-sum Tree-LSTM over the gold tree; "
                         "baseline: a sequence BiLSTM (default: tree)")
    tr.add_argument("--epochs", type=int, default=20)
    tr.add_argument("--lr", type=float, default=2e-3)
    tr.add_argument("--hidden", type=int, default=100)
    tr.add_argument("--limit", type=int, default=0, help="only the first N sentences of each "
                                                         "split (a quick run)")
    tr.add_argument("--max-minutes", type=float, help="stop after the epoch that passes this")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--overwrite", action="store_true", help="replace the folder's model")
    tr.add_argument("--quiet", action="store_true")
    tr.set_defaults(run=_train)
    for name, helps, run in (("evaluate", "dev (or --conllu) label accuracy", _evaluate),
                             ("label", "fill column 8 of --conllu IN", _label)):
        p = sub.add_parser(name, help=helps)
        p.add_argument("--model-dir", required=True)
        p.add_argument("--conllu", required=name == "label", metavar="IN")
        p.add_argument("--checkpoint", choices=["best", "last"], default="best")
        if name == "evaluate":
            p.add_argument("--data")
        else:
            p.add_argument("-o", "--output", metavar="OUT", help="default: stdout")
        p.set_defaults(run=run)
    return parser


def main(argv=None) -> int:
    """Run the command; errors print one line (exit 2: bad input, 1: a failure)."""
    return run_app(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
