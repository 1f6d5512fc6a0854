"""RunOptions (docs/design.md, 10. Training): an application's options read off its command
line by name, and the Trainer they make."""

import argparse
from dataclasses import dataclass
from pathlib import Path

from examples.deprel.train import TrainOptions as DeprelOptions
from examples.lemmatize.train import TrainOptions as LemmatizerOptions
from examples.pos_tagging.__main__ import build_parser
from examples.pos_tagging.train import TrainOptions as TaggerOptions
from unroll.train.run_options import RunOptions


@dataclass
class WidthOptions(RunOptions):
    epochs: int = 3
    width: int = 8


def test_the_fields_named_on_the_command_line_are_read_and_the_rest_keep_their_defaults():
    args = argparse.Namespace(model_dir=Path("runs/w"), epochs=5, lr=0.5, seed=7, width=16,
                              threads=2, debug=True)
    opts = WidthOptions.from_args(args, data=Path("corpus"), sizes={"hidden": 4})
    assert (opts.data, opts.model_dir, opts.epochs, opts.lr, opts.seed, opts.width) == (
        Path("corpus"), Path("runs/w"), 5, 0.5, 7, 16)
    assert (opts.resume, opts.limit, opts.device, opts.sizes) == (False, None, "cpu",
                                                                 {"hidden": 4})


def test_a_value_given_beside_the_command_line_wins():
    opts = WidthOptions.from_args(argparse.Namespace(model_dir=None, lr=0.5), lr=0.25, data=None)
    assert opts.lr == 0.25


def test_the_trainer_takes_every_shared_setting_and_records_lr_beside_the_apps_own():
    opts = WidthOptions(data=None, model_dir="runs/w", epochs=4, seed=3, resume=True,
                        max_minutes=1.5, skip_bad_batches=2, quiet=True, lr=0.1)
    trainer = opts.trainer(app=None, given={"--lr-decay": 0.9}, average=None, curve=False)
    assert (trainer.model_dir, trainer.epochs, trainer.seed, trainer.resume, trainer.max_minutes,
            trainer.skip_bad_batches, trainer.quiet, trainer.average) == (
        Path("runs/w"), 4, 3, True, 1.5, 2, True, None)
    assert trainer.given == {"--lr": 0.1, "--lr-decay": 0.9}


def test_every_application_keeps_its_own_epochs():
    assert (TaggerOptions.epochs, LemmatizerOptions.epochs, DeprelOptions.epochs) == (14, 40, 20)


def test_the_taggers_command_line_fills_its_own_fields_by_name():
    args = build_parser().parse_args(["train", "--no-pack", "--memory-budget", "1MiB",
                                      "--epochs", "2", "--model-dir", "runs/t"])
    opts = TaggerOptions.from_args(args, data=None, lr_gamma=args.lr_decay)
    assert (opts.pack, opts.memory_budget, opts.epochs, opts.model_dir) == (
        False, 1 << 20, 2, Path("runs/t"))
