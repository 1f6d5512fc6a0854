"""The command line every application shares: option groups defined once, ``fetch``, and
one ``run`` entry (docs/design.md, 10. Training).

An application's ``__main__`` builds its parser from these groups and adds only
its own options (model sizes, its commands)::

    parser, sub = app_parser("python -m examples.charlm", __doc__)
    t = sub.add_parser("train", parents=[model_options("runs/charlm"), data_options(),
                                         training_options(10, "Adam's, default 0.002")])
    t.set_defaults(run=train, interrupted="resume with --resume")
    add_fetch(sub)
    sys.exit(run(parser, argv))

Every value is checked where it is parsed, so a bad one is one line and status 2
before anything runs: ``--epochs`` and ``--limit`` are at least 1, ``--threads``
too, ``--max-minutes`` a finite number >= 0, ``--seed`` in [0, 2**63),
``--skip-bad-batches`` >= 0, ``--lr`` a finite number > 0; an application's own numbers
with :func:`positive_number` (a decay factor) and :func:`ratio` (a dropout rate).
:func:`run` maps a user's mistake to one line and status 2, a failure while running
(a full disk, a diverged training) to one line and status 1, Ctrl-C to one line and
status 130 (the model folder keeps its last epoch; every file is written atomically,
so there is nothing to undo), and a closed standard output (``| head``) to 141
(:func:`unroll.tools.cli.run_command`);
``--debug`` shows the traceback instead.

>>> parser = argparse.ArgumentParser(parents=[training_options(3, "default 0.01")])
>>> parser.parse_args([]).epochs, parser.parse_args(["--limit", "5"]).limit
(3, 5)
>>> positive_int("0")
Traceback (most recent call last):
argparse.ArgumentTypeError: expected an integer >= 1, found '0'
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from unroll.core.errors import FileFormatError
from unroll.tools.cli import FAILURES, USER_ERRORS, CommandError, run_command
from unroll.tools.conllu import CoNLLUError
from unroll.tools.ewt import DATA_ENV, DEFAULT_DATA, HOME_ENV, RELEASE, fetched_data_dir, split_file
from unroll.tools.fetch import FetchError
from unroll.train.model_folder import CHECKPOINTS, ModelFolderError
from unroll.train.trainer import TrainingDiverged

__all__ = ["DEFAULT_SPLIT", "OneLineParser", "add_fetch", "app_parser", "checkpoint_options",
           "data_options", "device", "evaluated_file", "evaluated_split", "minutes",
           "model_options", "non_negative_int", "output_options", "positive_int",
           "positive_number", "ratio", "report_training", "run", "seed", "split_options",
           "training_options"]

#: exit status of a command stopped by Ctrl-C (128 + SIGINT, what a shell reports)
INTERRUPTED = 130
#: the split of the data folder an ``evaluate`` scores where it is given neither ``--split``
#: nor a file: dev, so that test is scored only when asked for
DEFAULT_SPLIT = "dev"


def _checked(text: str, convert, valid, expected: str):
    """``convert(text)`` where it converts and is ``valid``; else argparse's one-line error,
    saying what was ``expected`` and what was found."""
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, found {text!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1.

    >>> positive_int("3")
    3
    """
    return _checked(text, int, lambda n: n >= 1, "an integer >= 1")


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number >= 0.

    >>> non_negative_int("0")
    0
    """
    return _checked(text, int, lambda n: n >= 0, "an integer >= 0")


def seed(text: str) -> int:
    """An argparse type: a seed, a whole number in [0, 2**63).

    >>> seed("7")
    7
    """
    return _checked(text, int, lambda n: 0 <= n < 1 << 63, "an integer in [0, 2**63)")


def minutes(text: str) -> float:
    """An argparse type: a finite number of minutes >= 0.

    >>> minutes("1.5")
    1.5
    """
    return _checked(text, float, lambda v: math.isfinite(v) and v >= 0,
                    "a number of minutes >= 0")


def positive_number(text: str) -> float:
    """An argparse type: a finite number > 0 (a learning rate, say).

    >>> positive_number("2e-3")
    0.002
    """
    return _checked(text, float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def ratio(text: str) -> float:
    """An argparse type: a ratio in [0, 1) (a dropout rate, say).

    >>> ratio("0.25")
    0.25
    """
    return _checked(text, float, lambda v: 0 <= v < 1, "a number in [0, 1)")  # NaN fails too


def device(text: str) -> str:
    """An argparse type: ``cpu``, or ``gpu`` where CuPy finds a CUDA device (else the
    command stops in one line before it starts, not at its first net).

    >>> device("cpu")
    'cpu'
    """
    from unroll.engine.backend import get_array_module

    if text not in ("cpu", "gpu"):
        raise argparse.ArgumentTypeError(f"expected cpu or gpu, found {text!r}")
    try:
        get_array_module(text)
    except RuntimeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr (status 2), like every
    other error of a command: the usage is for ``--help``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def app_parser(prog: str, description: str):
    """``(parser, subparsers)`` of an application's command line (a :class:`OneLineParser`);
    add its commands to the second, and :func:`add_fetch`."""
    parser = OneLineParser(prog=prog, description=description,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser, parser.add_subparsers(dest="command", required=True)


def model_options(default_dir: str) -> argparse.ArgumentParser:
    """``--model-dir`` (default ``default_dir``), ``--device``, ``--threads``, ``--debug``:
    what every command that opens a model folder takes."""
    group = argparse.ArgumentParser(add_help=False)
    group.add_argument("--model-dir", type=Path, default=Path(default_dir),
                       help=f"model folder (default: {default_dir})")
    group.add_argument("--device", type=device, choices=["cpu", "gpu"], default="cpu")
    group.add_argument("--threads", type=positive_int, metavar="N",
                       help="BLAS threads (default: $UNROLL_NUM_THREADS, else the cores other "
                            "processes leave free, measured as it runs)")
    group.add_argument("--debug", action="store_true",
                       help="show the traceback of an error, not one line")
    return group


def data_options() -> argparse.ArgumentParser:
    """``--data``: the UD English EWT folder (:mod:`unroll.tools.ewt` finds it)."""
    group = argparse.ArgumentParser(add_help=False)
    group.add_argument("--data", type=Path,
                       help=f"folder with en_ewt-ud-{{train,dev,test}}.conllu (default: "
                            f"${DATA_ENV}, else {Path('..', *DEFAULT_DATA.parts[-3:]).as_posix()} "
                            f"from the checkout if it exists, else EWT {RELEASE} fetched into "
                            f"${HOME_ENV}/ud_english_ewt/{RELEASE}, default ~/.cache/unroll)")
    return group


def training_options(epochs: int, lr: str) -> argparse.ArgumentParser:
    """What every ``train`` takes, with one meaning (the :class:`~unroll.train.trainer.Trainer`'s
    arguments): ``--epochs`` (default ``epochs``), ``--lr`` (``lr`` says whose rate it is
    and its default; unset where not given, so that a resume takes the folder's:
    :data:`~unroll.train.trainer.RECORDED_OPTIONS`), ``--max-minutes``, ``--seed``,
    ``--limit``, ``--resume`` or ``--overwrite``, ``--skip-bad-batches``, ``--quiet``."""
    group = argparse.ArgumentParser(add_help=False)
    group.add_argument("--epochs", type=positive_int, default=epochs,
                       help=f"epochs in all, those a resumed folder logged included (default "
                            f"{epochs})")
    group.add_argument("--lr", type=positive_number,
                       help=f"the learning rate: {lr} (with --resume the folder's)")
    group.add_argument("--max-minutes", type=minutes,
                       help="start no epoch once this much time has passed, the time of the "
                            "folder's earlier runs included; the last line and log.json say so "
                            "(default: no limit)")
    group.add_argument("--seed", type=seed,
                       help="of the initial weights, shuffles and dropout (default 0; with "
                            "--resume the folder's)")
    group.add_argument("--limit", type=positive_int, metavar="N",
                       help="use only the first N sentences of train and dev")
    again = group.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue from the last epoch's snapshot in --model-dir")
    again.add_argument("--overwrite", action="store_true",
                       help="replace the model already in --model-dir")
    group.add_argument("--skip-bad-batches", type=non_negative_int, default=0, metavar="N",
                       help="skip up to N batches whose loss or gradient is not finite, "
                            "instead of stopping at the first (default 0)")
    group.add_argument("--quiet", action="store_true", help="no progress bar")
    return group


def checkpoint_options() -> argparse.ArgumentParser:
    """``--checkpoint``: which of a trained folder's weights a command loads (best or last,
    :data:`unroll.train.model_folder.CHECKPOINTS`; default best).

    >>> parser = argparse.ArgumentParser(parents=[checkpoint_options()])
    >>> parser.parse_args([]).checkpoint, parser.parse_args(["--checkpoint", "last"]).checkpoint
    ('best', 'last')
    """
    group = argparse.ArgumentParser(add_help=False)
    group.add_argument("--checkpoint", choices=CHECKPOINTS, default="best",
                       help="best: the best dev epoch's weights; last: the last epoch's")
    return group


def split_options(choices: tuple[str, ...]) -> argparse.ArgumentParser:
    """``--split``, one of ``choices``: the split of the data folder an ``evaluate`` scores
    (default :data:`DEFAULT_SPLIT`, which :func:`evaluated_split` fills in: left unset by
    the parser, so that a file given beside it can be refused).

    >>> parser = argparse.ArgumentParser(parents=[split_options(("dev", "test"))])
    >>> parser.parse_args(["--split", "test"]).split, parser.parse_args([]).split
    ('test', None)
    """
    group = argparse.ArgumentParser(add_help=False)
    group.add_argument("--split", choices=choices,
                       help=f"the split of the data folder to score (default {DEFAULT_SPLIT}: "
                            f"tune on dev; score test once, for the final number)")
    return group


def evaluated_split(args) -> str:
    """The split an ``evaluate`` scores: ``--split`` (:func:`split_options`), else
    :data:`DEFAULT_SPLIT`.

    >>> evaluated_split(argparse.Namespace(split=None))
    'dev'
    """
    return args.split or DEFAULT_SPLIT


def evaluated_file(args, file: Path | None, named: str) -> Path:
    """The CoNLL-U file an ``evaluate`` scores: ``file`` where given (``named``: how its
    command line names it), else the :func:`evaluated_split` of ``--data``; a file and
    ``--split`` both given is refused.

    >>> evaluated_file(argparse.Namespace(split="test"), Path("a.conllu"), "FILE")
    Traceback (most recent call last):
    unroll.tools.commands.running.CommandError: give either FILE or --split, not both
    """
    if file is not None and args.split is not None:
        raise CommandError(f"give either {named} or --split, not both")
    return file or split_file(fetched_data_dir(args.data), evaluated_split(args))


def output_options() -> argparse.ArgumentParser:
    """``-o OUT``: where a command's output goes (default: standard output)."""
    group = argparse.ArgumentParser(add_help=False)
    group.add_argument("-o", "--output", type=Path, metavar="OUT",
                       help="write the output here (a file is replaced whole; a device, a "
                            "FIFO or a symlink is written through); default: standard output")
    return group


def report_training(args, result: dict, metric) -> None:
    """The last line of a ``train``: how far it got (or why it stopped), the last epoch's
    ``metric`` (a :class:`~unroll.train.trainer.Metric`) and where the model is; printed by
    rank 0 alone.

    >>> from unroll.train.trainer import Metric
    >>> args = argparse.Namespace(device="cpu", model_dir="runs/m")
    >>> report_training(args, {"epoch": 2, "dev_bpc": 1.5}, Metric("dev_bpc", "dev bpc", "min"))
    done: 2 epochs, last dev bpc 1.5000; model in runs/m
    """
    from unroll.train import distributed

    if distributed.init(args.device).rank:
        return
    done = result.get("stopped") or f"{result.get('epoch', 0)} epochs"
    last = metric.format(result[metric.key]) if metric.key in result else f"no {metric.label}"
    print(f"done: {done}, last {last}; model in {args.model_dir}")


def _fetch(args) -> int:
    from unroll.tools.fetch import fetch_ewt

    print(fetch_ewt(quiet=args.quiet))
    return 0


def add_fetch(sub) -> None:
    """The ``fetch`` command: download UD English EWT into the cache, verify it, print where."""
    f = sub.add_parser("fetch", help=f"download UD English EWT {RELEASE} into the cache, "
                                     f"verify it, and print its folder")
    f.add_argument("--quiet", action="store_true", help="no progress bar")
    f.add_argument("--debug", action="store_true",
                   help="show the traceback of an error, not one line")
    f.set_defaults(run=_fetch)


def run(parser: argparse.ArgumentParser, argv=None) -> int:
    """Parse ``argv`` and run the command's ``run(args)``; its exit status (see the module):
    the library's exceptions for a user's mistake (bad input, a bad folder, a bad value:
    ValueError) are one line and status 2."""
    from unroll.engine.threads import set_num_threads

    args = parser.parse_args(argv)
    prog = f"{parser.prog} {args.command}"
    if getattr(args, "threads", None):
        set_num_threads(args.threads)
    try:
        # a diverging model's nets overflow: the one-line error, or the scores and labels,
        # say so, where NumPy's RuntimeWarnings would come before them
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return run_command(prog, args.run, args,
                               (*USER_ERRORS, CoNLLUError, FileFormatError,
                                ModelFolderError, FetchError, ValueError),
                               (*FAILURES, TrainingDiverged))
    except KeyboardInterrupt:
        if getattr(args, "debug", False):
            raise
        hint = getattr(args, "interrupted", None)
        print(f"{prog}: interrupted{'; ' + hint if hint else ''}", file=sys.stderr)
        return INTERRUPTED
