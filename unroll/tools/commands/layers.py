"""``unroll layers``: every registered layer type and the contract it declares."""

from __future__ import annotations

from unroll.tools.output import write_output

__all__ = ["add_parser", "run"]


def add_parser(sub):
    parser = sub.add_parser(
        "layers", help="list every registered layer type and the contract it declares",
        description="List every registered layer type: whether BVLC Caffe has it, its bottom "
                    "and top counts, learnable blobs, in-place support, what its backward "
                    "reads and its parameter messages (unroll.tools.catalogue).",
    )
    parser.add_argument("--json", action="store_true", help="print the same as JSON, for tools")
    return parser


def run(args) -> int:
    from unroll.tools import catalogue

    write_output(catalogue.as_json() + "\n" if args.json else catalogue.text())
    return 0
