"""python -m examples.pos_tagging {train,evaluate,tag}: the UD English EWT UPOS tagger.

  python -m examples.pos_tagging train --model-dir runs/ewt
  python -m examples.pos_tagging evaluate --model-dir runs/ewt FILE.conllu
  echo "I saw her duck ." | python -m examples.pos_tagging tag --model-dir runs/ewt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from unroll import distributed

DEFAULT_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "ud_english_ewt"


def _train(args) -> int:
    from examples.pos_tagging.tagger import TaggerConfig
    from examples.pos_tagging.train import TrainOptions, train

    config = TaggerConfig(
        embed=args.embed, hidden=args.hidden, layers=args.layers, cell=args.cell,
        dropout=args.dropout, word_dropout=args.word_dropout, batch=args.batch_size,
        chars={"embed": args.char_embed, "hidden": args.char_hidden, "length": args.char_length}
        if args.char_hidden else {},
    )
    opts = TrainOptions(
        data=args.data, model_dir=args.model_dir, epochs=args.epochs,
        max_minutes=args.max_minutes, lr=args.lr, lr_gamma=args.lr_decay, seed=args.seed,
        limit=args.limit, resume=args.resume, device=args.device, quiet=args.quiet, config=config,
        pack=args.pack,
    )
    with distributed.init(args.device) as comm:  # a failing rank ends every rank
        result = train(opts)
    if comm.rank:
        return 0
    print(f"done: {result.get('epoch', 0)} epochs, last dev UPOS "
          f"{100 * result.get('dev_accuracy', 0):.2f}%; model in {args.model_dir}")
    return 0


def _evaluate(args) -> int:
    from examples.pos_tagging.conll import read_conllu
    from examples.pos_tagging.evaluate import report, score
    from examples.pos_tagging.tagger import Tagger, tag_ids

    tagger = Tagger.load(args.model_dir, args.checkpoint, device=args.device)
    sentences = list(read_conllu(args.file))
    predicted = tagger.predict([forms for forms, _ in sentences])
    print(report(score(tag_ids([tags for _, tags in sentences]), predicted)))
    return 0


def _tag(args) -> int:
    from examples.pos_tagging.conll import UPOS_TAGS, read_conllu, write_conllu
    from examples.pos_tagging.tagger import Tagger

    tagger = Tagger.load(args.model_dir, args.checkpoint, device=args.device)
    if args.conllu:
        sentences = [forms for forms, _ in read_conllu(args.conllu)]
    else:
        source = open(args.input, encoding="utf-8") if args.input else sys.stdin
        sentences = [line.split() for line in source if line.strip()]
    predicted = tagger.predict(sentences)
    tags = [[UPOS_TAGS[i] for i in ids] for ids in predicted]
    if args.conllu:
        write_conllu(sentences, tags, sys.stdout)
    else:
        for forms, upos in zip(sentences, tags):
            print(" ".join(f"{w}/{t}" for w, t in zip(forms, upos)))
    return 0


def main(argv=None) -> int:
    from examples.pos_tagging.tagger import TaggerConfig

    parser = argparse.ArgumentParser(
        prog="python -m examples.pos_tagging", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model-dir", type=Path, default=Path("runs/ewt"),
                        help="model folder (default: runs/ewt)")
    common.add_argument("--device", choices=["cpu", "gpu"], default="cpu")

    t = sub.add_parser("train", parents=[common], help="train on EWT train, tune on dev")
    t.add_argument("--data", type=Path, default=DEFAULT_DATA,
                   help=f"folder with en_ewt-ud-train/dev.conllu (default: {DEFAULT_DATA})")
    t.add_argument("--epochs", type=int, default=12)
    t.add_argument("--max-minutes", type=float, default=19.0,
                   help="stop starting new epochs after this much training time")
    t.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    t.add_argument("--lr-decay", type=float, default=0.85,
                   help="learning rate factor after each epoch (Caffe lr_policy step)")
    defaults = TaggerConfig()
    t.add_argument("--embed", type=int, default=defaults.embed, help="word embedding size")
    t.add_argument("--hidden", type=int, default=defaults.hidden, help="LSTM size per direction")
    t.add_argument("--layers", type=int, default=defaults.layers, help="stacked BiLSTM layers")
    t.add_argument("--cell", default=defaults.cell,
                   help="step template of the recurrent layers: lstm, gru, rnn, or a path")
    t.add_argument("--dropout", type=float, default=defaults.dropout)
    t.add_argument("--word-dropout", type=float, default=defaults.word_dropout,
                   help="chance that a word seen once in training becomes <unk>")
    t.add_argument("--batch-size", type=int, default=defaults.batch, help="sentences per batch")
    t.add_argument("--char-embed", type=int, default=defaults.chars["embed"])
    t.add_argument("--char-hidden", type=int, default=defaults.chars["hidden"],
                   help="character LSTM size per direction (0: no character model)")
    t.add_argument("--char-length", type=int, default=defaults.chars["length"],
                   help="characters read per word (long words keep their start and end)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--limit", type=int, default=0, help="use only the first N sentences")
    t.add_argument("--resume", action="store_true",
                   help="continue from the last epoch's snapshot in --model-dir")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--pack", action="store_true",
                   help="batches of --batch-size rows, each of whole sentences back to back")
    t.set_defaults(run=_train)

    e = sub.add_parser("evaluate", parents=[common], help="score a CoNLL-U file")
    e.add_argument("file", type=Path)
    e.add_argument("--checkpoint", default="best", help="best or last (default: best)")
    e.set_defaults(run=_evaluate)

    g = sub.add_parser("tag", parents=[common],
                       help="tag raw text (one sentence a line) or a CoNLL-U file")
    g.add_argument("input", nargs="?", help="text file (default: standard input)")
    g.add_argument("--conllu", type=Path, help="tag this CoNLL-U file, print CoNLL-U")
    g.add_argument("--checkpoint", default="best")
    g.set_defaults(run=_tag)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
