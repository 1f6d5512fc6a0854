"""The command line every application shares: its checked options and its run entry.

docs/design.md, 10. Training: one meaning per option, a bad value refused in one line
(status 2), a failure one line (status 1), Ctrl-C one line (status 130).
"""

import errno
import math

import pytest

from tests.cli_helpers import one_line_error
from unroll.core.errors import FileFormatError
from unroll.engine import threads
from unroll.tools import app_cli
from unroll.tools.output import OutputClosed
from unroll.train.model_folder import ModelFolderError
from unroll.train.trainer import TrainingDiverged

PROG = "python -m example"


def parser_running(action):
    """An application's parser whose ``train`` runs ``action(args)``."""
    parser, sub = app_cli.app_parser(PROG, "an example")
    t = sub.add_parser("train", parents=[app_cli.model_options("runs/x"),
                                         app_cli.data_options(),
                                         app_cli.training_options(4, "default 0.1"),
                                         app_cli.output_options()])
    t.set_defaults(run=action, interrupted="resume with --resume")
    p = sub.add_parser("predict", parents=[app_cli.model_options("runs/x")])
    p.set_defaults(run=action)
    app_cli.add_fetch(sub)
    return parser


def parsed(argv):
    seen = []
    assert app_cli.run(parser_running(lambda args: seen.append(args) or 0), argv) == 0
    return seen[0]


def test_the_shared_options_and_their_defaults():
    args = parsed(["train"])
    assert (args.epochs, args.lr, args.max_minutes, args.seed, args.limit, args.resume,
            args.overwrite, args.skip_bad_batches, args.quiet, args.debug, args.output) == (
        4, None, None, None, None, False, False, 0, False, False, None)
    assert str(args.model_dir) == "runs/x" and args.device == "cpu"
    args = parsed(["train", "--epochs", "2", "--lr", "0.5", "--max-minutes", "0", "--seed", "9",
                   "--limit", "1", "--resume", "--skip-bad-batches", "3", "--quiet", "-o",
                   "out.txt"])
    assert (args.epochs, args.lr, args.max_minutes, args.seed, args.limit, args.resume,
            args.skip_bad_batches, args.quiet, str(args.output)) == (
        2, 0.5, 0.0, 9, 1, True, 3, True, "out.txt")


@pytest.mark.parametrize("argv, named", [
    (["--epochs", "0"], "--epochs"), (["--epochs", "-3"], "--epochs"),
    (["--epochs", "2.5"], "--epochs"), (["--limit", "-1"], "--limit"),
    (["--limit", "0"], "--limit"), (["--threads", "0"], "--threads"),
    (["--max-minutes", "-1"], "--max-minutes"), (["--max-minutes", "nan"], "--max-minutes"),
    (["--max-minutes", "inf"], "--max-minutes"), (["--max-minutes", "soon"], "--max-minutes"),
    (["--seed", "-1"], "--seed"), (["--seed", str(2 ** 63)], "--seed"),
    (["--skip-bad-batches", "-1"], "--skip-bad-batches"), (["--device", "tpu"], "--device"),
    (["--lr", "0"], "--lr"), (["--lr", "nan"], "--lr"),
    (["--resume", "--overwrite"], "--overwrite: not allowed with argument --resume"),
    (["--no-such-option"], "--no-such-option"),
])
def test_every_bad_value_is_refused_in_one_line_before_anything_runs(argv, named, capsys):
    ran = []
    with pytest.raises(SystemExit) as stop:
        app_cli.run(parser_running(ran.append), ["train", *argv])
    assert stop.value.code == 2 and not ran
    one_line_error(capsys, PROG, "error: ", named)


def test_threads_sets_the_engines_thread_count(monkeypatch):
    asked = []
    monkeypatch.setattr(threads, "set_num_threads", asked.append)
    parsed(["train", "--threads", "3"])
    assert asked == [3]


def raising(error):
    def action(args):
        raise error
    return action


@pytest.mark.parametrize("error, status, line", [
    (KeyboardInterrupt(), 130, f"{PROG} train: interrupted; resume with --resume"),
    (FileFormatError("data.conllu", "holds no sentences"), 2,
     f"{PROG} train: error: data.conllu: holds no sentences"),
    (ModelFolderError("runs/x already holds a model"), 2,
     f"{PROG} train: error: runs/x already holds a model"),
    (ValueError("--cell x: neither a built-in step template nor a template file"), 2,
     f"{PROG} train: error: --cell x: neither a built-in step template nor a template file"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "in.txt"), 2,
     f"{PROG} train: error: [Errno 2] No such file or directory: 'in.txt'"),
    (TrainingDiverged("training diverged at epoch 1"), 1,
     f"{PROG} train: error: training diverged at epoch 1"),
    (OSError(errno.ENOSPC, "No space left on device", "runs/x"), 1,
     f"{PROG} train: error: [Errno 28] No space left on device: 'runs/x'"),
])
def test_run_gives_one_line_and_the_status_of_each_kind_of_end(error, status, line, capsys):
    assert app_cli.run(parser_running(raising(error)), ["train"]) == status
    assert one_line_error(capsys) == line


def test_ctrl_c_in_a_command_that_cannot_be_resumed_says_only_that(capsys):
    assert app_cli.run(parser_running(raising(KeyboardInterrupt())), ["predict"]) == 130
    assert one_line_error(capsys) == f"{PROG} predict: interrupted"


def test_a_closed_standard_output_ends_quietly_with_141(capsys):
    assert app_cli.run(parser_running(raising(OutputClosed())), ["train"]) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("error", [KeyboardInterrupt(), FileFormatError("f", "bad"),
                                   TrainingDiverged("x")])
def test_debug_shows_the_traceback(error):
    with pytest.raises(type(error)):
        app_cli.run(parser_running(raising(error)), ["train", "--debug"])


def test_a_bug_keeps_its_traceback():
    with pytest.raises(ZeroDivisionError):
        app_cli.run(parser_running(lambda args: 1 / 0), ["train"])


@pytest.mark.parametrize("text", ["0", "-1", "x", "1.5"])
def test_positive_int_refuses(text):
    with pytest.raises(app_cli.argparse.ArgumentTypeError, match="an integer >= 1"):
        app_cli.positive_int(text)


@pytest.mark.parametrize("text", ["-0.5", "nan", "inf", "-inf", ""])
def test_minutes_refuses(text):
    with pytest.raises(app_cli.argparse.ArgumentTypeError, match="minutes >= 0"):
        app_cli.minutes(text)


def test_minutes_takes_zero_and_fractions():
    assert app_cli.minutes("0") == 0 and math.isclose(app_cli.minutes("0.25"), 0.25)


@pytest.mark.parametrize("text", ["0", "-1e-3", "nan", "inf", "x", ""])
def test_positive_number_refuses(text):
    with pytest.raises(app_cli.argparse.ArgumentTypeError, match="a finite number > 0"):
        app_cli.positive_number(text)


def test_device_gpu_without_one_is_refused_where_it_is_parsed(monkeypatch):
    from unroll.engine import backend

    monkeypatch.setattr(backend, "GPU_AVAILABLE", False)
    with pytest.raises(app_cli.argparse.ArgumentTypeError, match="needs CuPy and a CUDA"):
        app_cli.device("gpu")
    with pytest.raises(app_cli.argparse.ArgumentTypeError, match="expected cpu or gpu"):
        app_cli.device("tpu")
    assert app_cli.device("cpu") == "cpu"
