"""``unroll expand``: write the unrolled prototxt of a template."""

from __future__ import annotations

import argparse
import sys

from unroll.core.proto import NetParameter, parse_text
from unroll.tools.commands.arguments import template_arguments
from unroll.tools.commands.help_text import builtin_template_lines
from unroll.tools.commands.nets import net_param
from unroll.tools.output import write_output

__all__ = ["add_parser", "run", "summarize"]

EXAMPLES = """\
examples:
  unroll expand lstm --steps 5 --set batch=2 --set input_dim=3 --set hidden=4 -o lstm5.prototxt
  unroll expand gru --steps 20 --set batch=8 --set input_dim=50 --set hidden=64 \\
      --set direction=bidirectional --set layers=2 > gru20.prototxt
  unroll expand tagger --steps 30 --set batch=16 --set vocab=20000 --set tags=17 \\
      --set 'features={"suffix": [500, 16]}' -o tagger30.prototxt
  unroll expand mycell --template-dir ./cells --steps 10 --set input_dim=8 --set hidden=8
  unroll expand gru --steps 20 --set input_dim=50 --set hidden=64 --caffe -o gru20.prototxt
"""

NOTES = """\
TEMPLATE may also be a path to a .prototxt.j2 file, or the name of one in a
--template-dir folder or in $UNROLL_TEMPLATE_PATH (os.pathsep-separated).
Step templates take batch (N, default 1), input_dim, their hyper-parameters
(e.g. hidden), direction (forward, reverse, bidirectional), layers and
expose_hidden. The net is built once to check it; a summary goes to stderr.
A comment on top of the prototxt names any layer types of unroll's own it
holds; --caffe writes only layer types BVLC Caffe has instead (`unroll layers`
lists which are which).
"""


def _size(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    if nbytes < 1024**2:
        return f"{nbytes / 1024:.1f} KiB"
    return f"{nbytes / 1024**2:.1f} MiB"


def summarize(net_param: NetParameter, text: str) -> str:
    """One line: layers, blobs, learnable params and their total size, text size.

    Builds the net (float32) to learn the param shapes, so a net that cannot be
    built raises its NetError here.
    """
    from unroll.engine.net import Net

    net = Net(net_param, phase="train", dtype="float32")
    blobs = {top for lp in net_param.layer for top in lp.top}
    values = sum(p.blob.count for p in net.learnable_params)
    return (
        f"{len(net_param.layer)} layers, {len(blobs)} blobs, "
        f"{len(net.learnable_params)} learnable params ({values:,} values), "
        f"{_size(len(text.encode()))} of prototxt"
    )


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "expand", help="unroll a template to T steps and write the net's prototxt",
        description="Unroll TEMPLATE to --steps timesteps and write the unrolled net as "
                    "prototxt (to stdout without -o).",
        epilog=lambda: f"{EXAMPLES}\n{builtin_template_lines()}\n\n{NOTES}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    template_arguments(parser)
    parser.add_argument("--tree", metavar="WIDTHS",
                        help="a tree_step template: unroll it over level widths (nodes per "
                             "level, e.g. 4,2,1; bidirectional: up widths/down widths, "
                             "4,2,1/1,2,4), with --set direction=up|down|bidirectional and, "
                             "for Caffe, --set fixed_arity=A")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write the prototxt to FILE (default: stdout)")
    parser.add_argument("--caffe", action="store_true",
                        help="write only layer types BVLC Caffe has: lower unroll's own "
                             "(GRUUnit, the sequence ends) to Caffe's layers, or refuse the "
                             "net naming each layer Caffe cannot express (Scatter)")
    return parser


def run(args) -> int:
    from unroll.frontend.unroller import to_prototxt

    net = net_param(args)
    text = to_prototxt(net, caffe=args.caffe)
    if args.caffe:  # summarize what was written: the lowered net
        net = parse_text(text, NetParameter(), "the exported net")
    summary = summarize(net, text)
    write_output(text, args.output)
    where = (f"written to {args.output}" if args.output and args.output != "-"
             else "written to stdout")
    print(f"unroll expand {args.template}, T={args.steps}: {summary} {where}", file=sys.stderr)
    return 0
