"""``unroll memory``: what a net's memory costs, planned against unplanned."""

from __future__ import annotations

from unroll.core.proto import NetParameter, parse_text, read_prototxt
from unroll.core.sizes import byte_size_argument
from unroll.tools.output import write_output

__all__ = ["add_parser", "run"]


def add_parser(sub):
    parser = sub.add_parser(
        "memory", help="print what a net's memory costs, planned against unplanned",
        description="Build NET (a prototxt file) and print the bytes of its params, solver "
                    "history, activations, diffs and layer scratch, with and without the "
                    "memory plan, and its largest blobs.",
    )
    parser.add_argument("net", metavar="NET", help="a net prototxt file")
    parser.add_argument("--phase", choices=["train", "test"], default="train")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--solver", metavar="TYPE",
                        help="count this solver's history too (SGD, Adam, ...)")
    parser.add_argument("--largest", type=int, default=10, metavar="K",
                        help="list the K largest blobs (default 10)")
    parser.add_argument("--budget", type=byte_size_argument, metavar="BYTES",
                        help="plan within this memory (bytes, or e.g. 500MB, 1.5GiB, 2e9): "
                             "backward recomputes segments of the forward; prints the "
                             "checkpoints, the recompute factor and the planned peak")
    return parser


def run(args) -> int:
    from unroll.engine.inspection import recomputation, recompute_line
    from unroll.engine.net import Net

    net_param = parse_text(read_prototxt(args.net), NetParameter(), args.net)
    net = Net(net_param, phase=args.phase, dtype=args.dtype, memory_budget=args.budget)
    solver = None
    if args.solver:  # the solver's modules only where its history is counted
        from unroll.train.solver import Solver, usual_fields

        solver = Solver(net, type=args.solver, base_lr=0.01, **usual_fields(args.solver))
    write_output(f"{net.memory_report(solver=solver, largest=args.largest)}\n")
    if args.budget is not None:  # the recomputation the budget asks for
        write_output(f"{recompute_line(recomputation(net))}\n")
    return 0
