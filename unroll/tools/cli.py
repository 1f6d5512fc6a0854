"""The ``unroll`` command: expand templates to prototxt, draw nets as graphs.

    unroll expand lstm --steps 5 --set batch=2 --set input_dim=3 --set hidden=4 -o lstm5.prototxt
    unroll draw lstm5.prototxt -o lstm5.svg

Each subcommand is a module of :mod:`unroll.tools.commands`; this module
assembles them. How errors and output end a run (exit status 2 for the
user's input, 1 for a failure while running, one line on stderr) is
:mod:`unroll.tools.commands.running`'s, whose names are re-exported here
for commands of other programs (the examples') that end the same way.
"""

from __future__ import annotations

import argparse
import sys

from unroll.tools.commands import COMMANDS
from unroll.tools.commands.help_text import HelpParser, builtin_template_lines
from unroll.tools.commands.running import (
    FAILURES,
    USER_ERRORS,
    CommandError,
    run_command,
)

__all__ = ["CommandError", "FAILURES", "USER_ERRORS", "build_parser", "main", "run_command"]

EXAMPLES = """\
examples:
  unroll expand lstm --steps 5 --set batch=2 --set input_dim=3 --set hidden=4 -o lstm5.prototxt
  unroll draw lstm5.prototxt -o lstm5.svg
  unroll layers --json
"""


def _epilog() -> str:
    return f"{EXAMPLES}\n{builtin_template_lines()}\n\nRun 'unroll COMMAND --help' for more."


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``unroll`` command and its subcommands.

    >>> build_parser().parse_args(["layers", "--json"]).json
    True
    """
    parser = HelpParser(
        prog="unroll",
        description="Unroll recurrent step templates (Jinja2 + Caffe prototxt) into "
                    "weight-shared feed-forward nets, and draw nets.",
        epilog=_epilog, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        subparser = command.add_parser(sub)
        subparser.add_argument("--debug", action="store_true",
                               help="show the traceback of an error, not one line")
        subparser.set_defaults(run=command.run)
    return parser


def main(argv=None) -> int:
    """Run the ``unroll`` command with ``argv`` (default: sys.argv[1:]); returns the exit status.

    User errors print ``unroll <command>: error: <message>`` on one line to
    stderr and return 2 (argparse usage errors also exit with 2), failures
    return 1.
    """
    args = build_parser().parse_args(argv)
    return run_command(f"unroll {args.command}", args.run, args)


if __name__ == "__main__":
    sys.exit(main())
