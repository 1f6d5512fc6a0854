"""``unroll inspect``: the params, in-place decisions, splits and memory of a net."""

from __future__ import annotations

import json

from unroll.tools.commands.arguments import template_arguments
from unroll.tools.commands.nets import net_param
from unroll.tools.output import write_output

__all__ = ["add_parser", "run"]


def add_parser(sub):
    parser = sub.add_parser(
        "inspect", help="print each param's owner and sharers, the in-place decisions, the "
                        "splits and the memory plan of a net",
        description="Build NET (a prototxt file, or TEMPLATE unrolled to --steps) and print "
                    "its learnable params (owner layer, how many layers hold each, shape, "
                    "lr_mult, decay_mult, frozen, bytes), which layers run in place and which "
                    "were given memory of their own (and why), the splits inserted, and the "
                    "memory plan. With --steps, Caffe's LSTM and RNN layers of a prototxt are "
                    "unrolled first.",
    )
    template_arguments(parser)
    parser.add_argument("--phase", choices=["train", "test"], default="train")
    parser.add_argument("--json", action="store_true", help="print the same as JSON, for tools")
    return parser


def run(args) -> int:
    from unroll.engine.net import Net

    report = Net(net_param(args), phase=args.phase).inspect()
    write_output(f"{json.dumps(report.as_dict(), indent=2) if args.json else report}\n")
    return 0
