"""``unroll check``: the battery of a step template or of a net's layers; 1 on a failure."""

from __future__ import annotations

import argparse

from unroll.tools.commands.arguments import set_argument, template_dir_argument
from unroll.tools.commands.help_text import builtin_template_lines
from unroll.tools.commands.running import CommandError
from unroll.tools.output import write_output

__all__ = ["add_parser", "run"]

EXAMPLES = """\
examples:
  unroll check lstm --reference unroll.testing.references:lstm_step --set hidden=64 --set steps=10
  unroll check mycell.prototxt.j2 --reference mycells:peephole_step --set hidden=8
  unroll check mylayer.prototxt
"""


def _epilog() -> str:
    from unroll.testing.template_battery import LIMITS

    limits = ", ".join(f"{kind} 1 to {limit}" for kind, limit in LIMITS.items())
    return (f"{EXAMPLES}\n{builtin_template_lines(['step'])}\n\nThe battery's sizes are "
            f"bounded: {limits} (a state's size is the template variable it names, e.g. "
            f"hidden).")


def add_parser(sub):
    parser = sub.add_parser(
        "check", help="run the test battery on a step template or on a net's layers",
        description="Run unroll.testing's battery on TEMPLATE (a step template: unrolled "
                    "forward against --reference, cont gating, gradients, accumulation, "
                    "float32) or on each layer of a .prototxt net (check_layer on bottoms "
                    "drawn from [-1, 1]). Prints a table of checks; exit status 1 if any "
                    "fails, a reference that raises or exits included. A gradient check "
                    "proves backward consistent with forward; only a reference proves "
                    "forward right.",
        epilog=_epilog, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("template", metavar="TEMPLATE_OR_PROTOTXT",
                        help="a step template (name or .prototxt.j2 path) or a .prototxt net")
    parser.add_argument("--reference", metavar="MODULE:FUNCTION",
                        help="the NumPy reference, a function of an importable module (a "
                             "dotted name, looked up on the Python path and in the current "
                             "folder): for a template, reference_step(x_t, states, params) -> "
                             "(outputs, states); for a one-layer net, f(*bottoms, *blobs) -> "
                             "top(s)")
    set_argument(parser, "a template variable or battery option (hidden=64, steps=10, "
                         "batch=3, input_dim=3, directions=3, seed=0); repeatable")
    template_dir_argument(parser, "a folder searched for templates by name (repeatable)")
    return parser


def run(args) -> int:
    from unroll.testing.command import import_reference, run_battery

    try:
        reference = import_reference(args.reference) if args.reference else None
        reports = run_battery(args.template, reference, dict(args.set or []),
                              args.template_dir or ())
    except ValueError as e:  # a --reference, --set or template variable the battery refuses
        raise CommandError(str(e)) from e
    for report in reports:
        write_output(report.table() + "\n")
        if not report.passed:
            write_output(report.failure_message() + "\n")
    return 0 if all(r.passed for r in reports) else 1
