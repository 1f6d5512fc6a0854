"""A character LSTM language model on EWT's text: train, evaluate (bits per character), sample.

    python -m examples.charlm train --model-dir runs/charlm [--steps 100 --batch 32 ...]
    python -m examples.charlm evaluate --model-dir runs/charlm [--split dev]
    python -m examples.charlm sample --model-dir runs/charlm --prime "The " --temperature 0.8
"""

from __future__ import annotations

import sys
from dataclasses import asdict

import numpy as np

from examples.charlm.model import BOUNDARY, IGNORE, SOLVER, UNK, CharLM, CharLMConfig, Symbols
from unroll import carry_hidden
from unroll.core import json_files
from unroll.core.sizes import byte_size_argument
from unroll.tools import app_cli as cli
from unroll.tools.conllu import read_texts
from unroll.tools.ewt import DEV_FILE, TRAIN_FILE, fetched_data_dir, split_file
from unroll.tools.output import write_output
from unroll.train import model_folder as folder
from unroll.train.bptt_windows import bptt_windows
from unroll.train.trainer import Batches, Metric, Trainer, log_schema

SIZES = ("embed", "hidden", "batch", "steps")
CONFIG = {"type": "object", "description": "an object {embed, hidden, batch, steps, lr}",
          "required": [*SIZES, "lr"], "additionalProperties": False,
          "properties": {"lr": json_files.finite(), **{k: json_files.count(1 << 16)
                                                        for k in SIZES}}}
SYMBOLS = {"type": "array", "maxItems": 1 << 16, "uniqueItems": True, "minItems": 2,
           "description": "a list of distinct symbols: <unk>, a line end, then characters",
           "prefixItems": [{"const": UNK}, {"const": BOUNDARY}],
           "items": {"type": "string", "minLength": 1, "maxLength": 8, "description": "a symbol"}}


class App:
    """charlm for :class:`unroll.train.trainer.Trainer`: the windows in the stream's order,
    each carrying on from the one before, across epochs too."""

    files = folder.ModelFiles(log_schema({"dev_bpc": json_files.finite()}, ["dev_bpc"],
                                         carried=True), {folder.CONFIG: CONFIG,
                                                         folder.FEATURES: SYMBOLS})
    metric = Metric("dev_bpc", "dev bits/char", mode="min")
    curve_title = "character LM"

    def __init__(self, args):
        self.args, self.ran = args, False
        self.sizes = {k: getattr(args, k) for k in (*SIZES, "lr")
                      if getattr(args, k) is not None}

    def read_data(self):
        data = fetched_data_dir(self.args.data, self.args.quiet)
        self.texts = [read_texts(data / f)[:self.args.limit] for f in (TRAIN_FILE, DEV_FILE)]

    def create(self, model_dir):
        self.config, self.symbols = CharLMConfig(**self.sizes), Symbols.build(self.texts[0])
        folder.write_json(model_dir / folder.CONFIG, asdict(self.config))
        folder.write_json(model_dir / folder.FEATURES, self.symbols.itos)

    def load(self, model_dir, log):
        self.symbols, self.config = described(folder.read_declared(model_dir, App.files, log))
        folder.settings_differ(model_dir, {k: v for k, v in self.sizes.items() if k != "lr"},
                               asdict(self.config))  # --lr: the Trainer checks it

    def model(self, model_dir, seed):
        self.lm = CharLM(self.symbols, self.config, seed, self.args.memory_budget,
                         self.args.device)
        self.state = self.lm.zero_state()
        return self.lm.train_model

    def sampler(self, seed, rank, size):
        n = self.config.batch  # rank r reads rows r*n..(r+1)*n-1 of size*n
        cut = bptt_windows(self.symbols.stream(self.texts[0]), n * size, self.config.steps,
                           IGNORE)
        self.windows = [(x[:, rank * n:][:, :n], y[:, rank * n:][:, :n]) for x, y in cut]
        return Batches(len(self.windows), shuffle=False)

    def solver_fields(self, steps_per_epoch):
        return dict(SOLVER, base_lr=self.sizes.get("lr", self.config.lr))

    def batch(self, rows):
        self.carried_state()
        self.ran, (x, y) = True, self.windows[rows[0]]
        return self.lm.inputs((x, y), self.state), int(np.sum(y != IGNORE))

    def carried_state(self):
        if self.ran:  # take the state of the last window before evaluation reuses its memory
            self.state, self.ran = carry_hidden(self.lm.train_model), False
        return self.state

    def restore_carried_state(self, state):
        self.state = state

    def evaluate(self, epoch):
        return {"dev_bpc": self.lm.bits_per_char(self.texts[1])}


def described(files):
    """(symbols, config) from the values of a model folder's files (``{name: value}``)."""
    return Symbols(files[folder.FEATURES]), CharLMConfig(**files[folder.CONFIG])


def trained(args) -> CharLM:
    """The CharLM of ``--model-dir`` with its best weights, checked against log.json."""
    return folder.load_trained(args.model_dir, App.files,
                               lambda files: CharLM(*described(files), device=args.device),
                               what="character LM", module="examples.charlm")


def train(args) -> int:
    result = Trainer(App(args), args.model_dir, epochs=args.epochs, seed=args.seed,
                     resume=args.resume, overwrite=args.overwrite, max_minutes=args.max_minutes,
                     skip_bad_batches=args.skip_bad_batches, quiet=args.quiet,
                     device=args.device, given={"--lr": args.lr}).fit()
    cli.report_training(args, result, App.metric)
    return 0


def evaluate(args) -> int:
    split = cli.evaluated_split(args)
    texts = read_texts(split_file(fetched_data_dir(args.data), split))
    write_output(f"{split} bits per character: {trained(args).bits_per_char(texts):.4f}\n",
                 args.output)
    return 0


def sample(args) -> int:
    text = trained(args).sample(args.prime, args.length, args.temperature, args.seed)
    write_output(text + "\n", args.output)
    return 0


def build_parser():
    """The parser of ``python -m examples.charlm`` and its subcommands (the site's command-line
    reference is generated from it)."""
    parser, sub = cli.app_parser("python -m examples.charlm", __doc__)
    model, data = cli.model_options("runs/charlm"), cli.data_options()
    t = sub.add_parser("train", parents=[model, data, cli.training_options(
        10, f"Adam's, default {SOLVER['base_lr']}")])
    for size in SIZES:
        t.add_argument(f"--{size}", type=cli.positive_int,
                       help=f"(default {getattr(CharLMConfig, size)})")
    t.add_argument("--memory-budget", type=byte_size_argument, metavar="BYTES",
                   help="bytes a training net may plan (recomputing in backward)")
    t.set_defaults(run=train, interrupted="resume with --resume")
    splits = cli.split_options(("train", "dev", "test"))
    e = sub.add_parser("evaluate", parents=[model, data, splits, cli.output_options()])
    s = sub.add_parser("sample", parents=[model, cli.output_options()])
    s.add_argument("--prime", default="", help="the text to continue")
    s.add_argument("--length", type=cli.positive_int, default=200)
    s.add_argument("--temperature", type=cli.positive_number, default=1.0)
    s.add_argument("--seed", type=cli.seed, default=0)
    e.set_defaults(run=evaluate), s.set_defaults(run=sample)
    cli.add_fetch(sub)
    return parser


def main(argv=None) -> int:
    return cli.run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
