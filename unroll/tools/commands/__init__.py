"""The subcommands of ``unroll``, one module each.

Each module has ``add_parser(sub)``, which adds its parser to the
subparsers ``sub`` and returns it, and ``run(args)``, which runs it and
returns the exit status. ``unroll.tools.cli`` assembles them in the order
of :data:`COMMANDS`, which is the order ``unroll --help`` lists them in.
"""

from unroll.tools.commands import check, draw, expand, inspect, layers, memory

__all__ = ["COMMANDS"]

COMMANDS = (expand, inspect, draw, memory, layers, check)
