"""python -m examples.pos_tagging {train,evaluate,tag,fetch}: the UD English EWT UPOS tagger.

  python -m examples.pos_tagging train --model-dir runs/ewt
  python -m examples.pos_tagging evaluate --model-dir runs/ewt --split dev
  python -m examples.pos_tagging evaluate --model-dir runs/ewt FILE.conllu
  echo "I saw her duck ." | python -m examples.pos_tagging tag --model-dir runs/ewt
  python -m examples.pos_tagging fetch

Without --data or $UNROLL_EWT_DATA, and without ../shared/data, train and
evaluate fetch UD English EWT r2.16 (verified by SHA-256) into
$UNROLL_DATA_HOME/ud_english_ewt/r2.16 (default ~/.cache/unroll).

`tag` and `evaluate` write to standard output, or with -o OUT to OUT (a file
is replaced whole; a device, a FIFO or a symlink's file is written through).

Errors print one line (--debug: the traceback); exit status 2 for bad input
or usage, 1 for a failure while running (divergence, a full disk, output that
could not be written), 130 for a training stopped by Ctrl-C (the folder keeps
its last epoch, to --resume).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from unroll.core.sizes import byte_size_argument
from unroll.tools import app_cli
from unroll.tools.output import write_output

PROG = "python -m examples.pos_tagging"
#: TaggerConfig fields and the train options that set them
SIZE_OPTIONS = ("embed", "hidden", "layers", "cell", "dropout", "word_dropout", "batch_size")
CHAR_OPTIONS = ("char_embed", "char_hidden", "char_length")


def _sizes(args) -> dict:
    """The TaggerConfig fields given on the command line (the rest keep their defaults)."""
    from examples.pos_tagging.tagger import DEFAULT_CHARS

    sizes = {("batch" if k == "batch_size" else k): getattr(args, k) for k in SIZE_OPTIONS
             if getattr(args, k) is not None}
    chars = {k[5:]: getattr(args, k) for k in CHAR_OPTIONS if getattr(args, k) is not None}
    if chars:
        sizes["chars"] = {} if chars.get("hidden") == 0 else {**DEFAULT_CHARS, **chars}
    return sizes


def _train(args) -> int:
    from examples.pos_tagging.train import TaggerTraining, TrainOptions, train
    from unroll.tools.ewt import fetched_data_dir

    result = train(TrainOptions.from_args(
        args, data=fetched_data_dir(args.data, args.quiet), lr_gamma=args.lr_decay,
        sizes=_sizes(args)))
    app_cli.report_training(args, result, TaggerTraining.metric)
    return 0


def _read_tagged(path: Path, upos: bool):
    from unroll.core.errors import FileFormatError
    from unroll.tools.conllu import read_conllu

    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; expected a CoNLL-U file")
    sentences = list(read_conllu(path, upos=upos))
    if not sentences:
        raise FileFormatError(path, "holds no sentences")
    return sentences


def _evaluate(args) -> int:
    from examples.pos_tagging.evaluate import report, score
    from examples.pos_tagging.tagger import Tagger, tag_ids

    path = app_cli.evaluated_file(args, args.file, "a CoNLL-U FILE")
    sentences = _read_tagged(path, upos=True)
    tagger = Tagger.load(args.model_dir, args.checkpoint, device=args.device)
    predicted = tagger.predict([forms for forms, _ in sentences])
    write_output(report(score(tag_ids([tags for _, tags in sentences]), predicted)) + "\n",
                 args.output)
    return 0


def _tag(args) -> int:
    from examples.pos_tagging.tagger import Tagger
    from unroll.core.errors import FileFormatError
    from unroll.tools.conllu import UPOS_TAGS, fill_upos

    if args.conllu:
        sentences = [forms for forms, _ in _read_tagged(args.conllu, upos=False)]
    elif args.input:
        try:
            text = Path(args.input).read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            problem = f"not UTF-8 text ({e.reason} at byte {e.start})"
            raise FileFormatError(args.input, problem) from None
        sentences = [line.split() for line in text.splitlines() if line.strip()]
    else:
        sentences = [line.split() for line in sys.stdin if line.strip()]
    tagger = Tagger.load(args.model_dir, args.checkpoint, device=args.device)
    tags = [[UPOS_TAGS[i] for i in ids] for ids in tagger.predict(sentences)]
    if args.conllu:  # every byte but column 4 as it came
        fill_upos(args.conllu, tags, args.output or "-")
    else:
        write_output("".join(" ".join(f"{w}/{t}" for w, t in zip(forms, upos)) + "\n"
                             for forms, upos in zip(sentences, tags)), args.output)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from examples.pos_tagging.tagger import TaggerConfig
    from examples.pos_tagging.train import BUCKETED_LR, LR_GAMMA, PACKED_LR, TrainOptions

    parser, sub = app_cli.app_parser(PROG, __doc__)
    model, data = app_cli.model_options("runs/ewt"), app_cli.data_options()
    t = sub.add_parser("train", parents=[model, data, app_cli.training_options(
        TrainOptions.epochs, f"Adam's, default {PACKED_LR:g}, with --no-pack {BUCKETED_LR:g}")],
                       help="train on EWT train, tune on dev")
    t.add_argument("--lr-decay", type=app_cli.positive_number,
                   help=f"learning rate factor after each epoch (Caffe lr_policy step; default "
                        f"{LR_GAMMA:g}; with --resume the folder's)")
    d = TaggerConfig()
    sizes = t.add_argument_group("model sizes (with --resume: only to check the folder's)")
    sizes.add_argument("--embed", type=int, help=f"word embedding size (default {d.embed})")
    sizes.add_argument("--hidden", type=int, help=f"LSTM size per direction (default {d.hidden})")
    sizes.add_argument("--layers", type=int, help=f"stacked BiLSTM layers (default {d.layers})")
    sizes.add_argument("--cell", help=f"step template of the recurrent layers: lstm, gru, rnn, "
                                      f"or a path (default {d.cell})")
    sizes.add_argument("--dropout", type=app_cli.ratio, help=f"default {d.dropout}")
    sizes.add_argument("--word-dropout", type=app_cli.ratio,
                       help=f"chance that a word seen once in training becomes <unk> "
                            f"(default {d.word_dropout})")
    sizes.add_argument("--batch-size", type=int,
                       help=f"rows per batch, with --no-pack sentences (default {d.batch})")
    sizes.add_argument("--char-embed", type=int, help=f"default {d.chars['embed']}")
    sizes.add_argument("--char-hidden", type=int,
                       help=f"character LSTM size per direction, 0: no character model "
                            f"(default {d.chars['hidden']})")
    sizes.add_argument("--char-length", type=int,
                       help=f"characters read per word, long words keep their start and end "
                            f"(default {d.chars['length']})")
    t.add_argument("--pack", action=argparse.BooleanOptionalAction, default=TrainOptions.pack,
                   help="batches of --batch-size rows of whole sentences back to back "
                        "(default); --no-pack: --batch-size sentences of one length bucket")
    t.add_argument("--memory-budget", type=byte_size_argument, metavar="BYTES",
                   help="memory each training net may plan (e.g. 500MB): backward recomputes "
                        "forward segments, with the same results")
    t.set_defaults(run=_train, interrupted="resume with --resume")

    weights = app_cli.checkpoint_options()
    e = sub.add_parser("evaluate", parents=[model, data, app_cli.split_options(("dev", "test")),
                                            weights, app_cli.output_options()],
                       help="score a CoNLL-U file, or a split of the data folder")
    e.add_argument("file", type=Path, nargs="?", help="a CoNLL-U file with UPOS")
    e.set_defaults(run=_evaluate)

    g = sub.add_parser("tag", parents=[model, weights, app_cli.output_options()],
                       help="tag raw text (one sentence a line) or a CoNLL-U file")
    g.add_argument("input", nargs="?", help="text file (default: standard input)")
    g.add_argument("--conllu", type=Path,
                   help="tag this CoNLL-U file (UPOS may be '_'); print it with column 4 filled")
    g.set_defaults(run=_tag)

    app_cli.add_fetch(sub)
    return parser


def main(argv=None) -> int:
    """Run the command; errors print one line (exit 2: bad input, 1: a failure; 130: Ctrl-C)."""
    return app_cli.run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
