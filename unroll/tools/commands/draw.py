"""``unroll draw``: write a net's Graphviz graph (.dot, or .svg/.png through `dot`)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from unroll.core.proto import NetParameter, parse_text, read_prototxt
from unroll.tools.commands.running import CommandError
from unroll.tools.draw import to_dot
from unroll.tools.output import write_output

__all__ = ["add_parser", "run"]

EXAMPLES = """\
examples:
  unroll draw lstm5.prototxt -o lstm5.svg     # needs Graphviz's `dot` on PATH
  unroll draw lstm5.prototxt -o lstm5.dot     # Graphviz source, no Graphviz needed
  unroll draw lstm5.prototxt --rankdir TB > lstm5.dot

Layers are boxes, blobs are ellipses, edges run bottom -> layer -> top. A
param that several layers share (the weights every timestep reuses) gets its
own colour: each layer that uses it is filled with that colour and names it,
and a note node for the param (the legend) links to those layers by dashed
edges. For .svg or .png without `dot` on PATH, the .dot file is written next
to the requested file instead, with a message saying how to render it; the
exit status is then 0, since the graph itself was produced.
"""


def add_parser(sub):
    parser = sub.add_parser(
        "draw", help="draw a net's prototxt as a Graphviz graph (.dot, .svg, .png)",
        description="Draw NET (a prototxt file) as a Graphviz graph, marking shared params.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("net", metavar="NET", help="a net prototxt file")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="FILE.dot (Graphviz source), or FILE.svg / .png / .pdf rendered "
                             "with `dot`; default: the .dot source on stdout")
    parser.add_argument("--rankdir", choices=["LR", "TB", "RL", "BT"], default="LR",
                        help="graph direction (default LR: left to right)")
    return parser


def run(args) -> int:
    net_param = parse_text(read_prototxt(args.net), NetParameter(), args.net)
    dot_text = to_dot(net_param, args.rankdir)
    if not args.output or args.output == "-":
        write_output(dot_text)
        return 0
    out = Path(args.output)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in ("dot", "gv", "svg", "png", "pdf"):
        raise CommandError(f"cannot draw to '{out}': use a .dot, .svg, .png or .pdf file name")
    if fmt in ("dot", "gv"):
        write_output(dot_text, out)
        print(f"unroll draw: wrote {out}", file=sys.stderr)
        return 0
    dot = shutil.which("dot")
    if dot is None:
        fallback = out.with_suffix(".dot")
        write_output(dot_text, fallback)
        print(f"unroll draw: Graphviz's `dot` is not on PATH, so {out} was not made; wrote "
              f"{fallback} instead (render it with: dot -T{fmt} {fallback} -o {out})",
              file=sys.stderr)
        return 0
    done = subprocess.run([dot, f"-T{fmt}", "-o", str(out)], input=dot_text.encode(),
                          capture_output=True, check=False)
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise CommandError(f"`dot -T{fmt}` failed (status {done.returncode})"
                           + (f": {message[0]}" if message else ""))
    print(f"unroll draw: wrote {out}", file=sys.stderr)
    return 0
