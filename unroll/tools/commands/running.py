"""What every subcommand shares: its errors, its output, and how a run ends.

Errors print one line to stderr (``--debug`` shows the traceback instead):
exit status 2 for the user's input (a bad argument, template, net, prototxt
or file, a file that is missing), 1 for a failure while running (a disk that
is full or read-only, a permission refused). Output is complete or an error:
a file is written atomically, standard output is flushed and checked, and a
failed write names the file or "standard output" (a reader that closed the
pipe early, as ``| head`` does, ends the command quietly, with status 1).
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

from unroll.core.atomic import named_os_error, write_atomic
from unroll.core.errors import FileFormatError, NetError, TemplateError
from unroll.core.proto import PrototxtError

__all__ = ["CommandError", "FAILURES", "OutputClosed", "USER_ERRORS", "run_command",
           "write_output"]


class CommandError(Exception):
    """A user error detected by the command itself (printed, exit status 2)."""


#: the user's input is wrong: exit status 2
USER_ERRORS = (CommandError, TemplateError, NetError, PrototxtError, FileFormatError,
               FileNotFoundError, IsADirectoryError, NotADirectoryError)
#: the command failed while running (disk full, read-only, no permission): exit status 1
FAILURES = (OSError,)


class OutputClosed(Exception):
    """Standard output's reader went away (a closed pipe): the command ends quietly."""


def write_output(text: str, path=None) -> None:
    """Write ``text`` to file ``path`` (atomically), or to standard output (without a path,
    or for "-"); all of it, or an OSError that names the file or "standard output".

    A reader that closed standard output early raises :class:`OutputClosed`;
    :func:`run_command` ends the command quietly then.

    >>> write_output("layer {}\\n")
    layer {}
    """
    if path is not None and str(path) != "-":
        path = Path(path)
        if path.exists() and not path.is_file():  # a device or a pipe: written through,
            try:  # not replaced by a file of the same name
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            except OSError as e:
                raise named_os_error(e, path) from None
            return
        if not path.parent.is_dir():  # a typo in the folder, not a folder to make
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        write_atomic(path, text.encode("utf-8"))
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        # what is still buffered would fail again, with a traceback, when Python exits
        _discard_stdout()
        if isinstance(e, BrokenPipeError):
            raise OutputClosed() from None
        raise named_os_error(e, "standard output") from None


def _discard_stdout() -> None:
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def run_command(prog: str, run, args, user_errors=USER_ERRORS, failures=FAILURES) -> int:
    """``run(args)``'s exit status; a known error prints one line and gives 2 or 1.

    With ``args.debug`` the error propagates, traceback and all. Anything
    else is a bug in unroll and keeps its traceback. A closed standard output
    (:class:`OutputClosed`) gives 1 and prints nothing.

    >>> def fails(args):
    ...     raise CommandError("--steps 0: expected a number of steps >= 1")
    >>> import contextlib, io, types
    >>> with contextlib.redirect_stderr(io.StringIO()) as err:
    ...     status = run_command("unroll expand", fails, types.SimpleNamespace(debug=False))
    >>> status, err.getvalue()
    (2, 'unroll expand: error: --steps 0: expected a number of steps >= 1\\n')
    """
    try:
        return run(args)
    except OutputClosed:
        return 1
    except (*user_errors, *failures) as e:
        if getattr(args, "debug", False):
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2 if isinstance(e, user_errors) else 1
