"""What the example commands (tagger, lemmatizer, deprel labeller) share: an argparse type
and the one-line error handling of a subcommand run.

>>> positive_int("3")
3
"""

from __future__ import annotations

import argparse

__all__ = ["positive_int", "run_example"]


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, found {text!r}")
    return n


def run_example(prog: str, args, user_errors: tuple = ()) -> int:
    """Run ``args.run(args)`` for ``prog``: a user's mistake (bad input, a bad folder, a bad
    value; plus ``user_errors``) is one line and exit 2, a failure (the disk, a diverged
    training) one line and exit 1."""
    from examples.pos_tagging.train import TrainingDiverged
    from unroll.tools.cli import FAILURES, USER_ERRORS, run_command
    from unroll.tools.conllu import CoNLLUError
    from unroll.train.model_folder import ModelFolderError

    # ValueError: a bad size or option value, which the commands name
    return run_command(f"{prog} {args.command}", args.run, args,
                       (*USER_ERRORS, CoNLLUError, ModelFolderError, ValueError, *user_errors),
                       (*FAILURES, TrainingDiverged))
