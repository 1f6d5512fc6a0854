"""The arguments several subcommands take: ``--set KEY=VALUE`` and a template to unroll."""

from __future__ import annotations

import argparse
import ast

__all__ = ["parse_assignment", "parse_value", "set_argument", "template_arguments",
           "template_dir_argument"]


def parse_value(text: str):
    """A ``--set`` value: a Python literal where it is one, else the string itself.

    >>> parse_value("4"), parse_value("0.5"), parse_value("True"), parse_value("[50, 8]")
    (4, 0.5, True, [50, 8])
    >>> parse_value("bidirectional"), parse_value("true")
    ('bidirectional', True)
    """
    lowered = {"true": True, "false": False, "none": None, "null": None}
    if text.lower() in lowered:
        return lowered[text.lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def parse_assignment(text: str) -> tuple[str, object]:
    """``key=value`` into (key, parsed value); argparse's type for ``--set``.

    >>> parse_assignment("hidden=64")
    ('hidden', 64)
    """
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected key=value with a name as key, found {text!r}")
    return key, parse_value(value)


def set_argument(parser, help: str) -> None:
    parser.add_argument("--set", action="append", type=parse_assignment, metavar="KEY=VALUE",
                        help=help)


def template_dir_argument(parser, help: str) -> None:
    parser.add_argument("--template-dir", action="append", metavar="DIR", help=help)


def template_arguments(parser) -> None:
    """TEMPLATE, --steps, --set and --template-dir: what ``expand`` and ``inspect`` unroll."""
    parser.add_argument("template", metavar="TEMPLATE",
                        help="a built-in template name (lstm, gru, ...), a name on the template "
                             "path, a path to a .prototxt.j2 file, or a .prototxt net")
    parser.add_argument("--steps", "-T", type=int, metavar="T",
                        help="number of timesteps to unroll")
    set_argument(parser, "a template variable (repeatable); VALUE is read as a Python literal "
                         "(4, 0.5, True, [50, 8], {'suffix': [50, 8]}) where it is one, else "
                         "as a string")
    template_dir_argument(parser, "a folder searched for templates by name before "
                                  "$UNROLL_TEMPLATE_PATH and the built-ins (repeatable)")
