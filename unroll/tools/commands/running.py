"""What every subcommand shares: its errors, its output, and how a run ends.

Errors print one line to stderr (``--debug`` shows the traceback instead):
exit status 2 for the user's input (a bad argument, template, net, prototxt
or file, a file that is missing), 1 for a failure while running (a disk that
is full or read-only, a permission refused). Output is complete or an error:
a file is written atomically, standard output is flushed and checked, and a
failed write names the file or "standard output" (a reader that closed the
pipe early, as ``| head`` does, ends the command quietly, with status 141).
"""

from __future__ import annotations

import sys

from unroll.core.errors import FileFormatError, NetError, TemplateError
from unroll.core.proto import PrototxtError
from unroll.tools.output import OutputClosed

__all__ = ["CommandError", "FAILURES", "USER_ERRORS", "run_command"]


class CommandError(Exception):
    """A user error detected by the command itself (printed, exit status 2)."""


#: the user's input is wrong: exit status 2
USER_ERRORS = (CommandError, TemplateError, NetError, PrototxtError, FileFormatError,
               FileNotFoundError, IsADirectoryError, NotADirectoryError)
#: the command failed while running (disk full, read-only, no permission): exit status 1
FAILURES = (OSError,)


def run_command(prog: str, run, args, user_errors=USER_ERRORS, failures=FAILURES) -> int:
    """``run(args)``'s exit status; a known error prints one line and gives 2 or 1.

    With ``args.debug`` the error propagates, traceback and all. Anything
    else is a bug in unroll and keeps its traceback. A closed standard output
    (:class:`~unroll.tools.output.OutputClosed`) prints nothing and gives 141, the
    status a shell reports for a tool that a closed pipe stopped (128 + SIGPIPE).

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
        return 141
    except (*user_errors, *failures) as e:
        if getattr(args, "debug", False):
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2 if isinstance(e, user_errors) else 1
