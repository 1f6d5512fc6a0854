"""The ``unroll`` command: expand templates to prototxt, draw nets as graphs.

    unroll expand lstm --steps 5 --set batch=2 --set input_dim=3 --set hidden=4 -o lstm5.prototxt
    unroll draw lstm5.prototxt -o lstm5.svg

Errors print one line to stderr (``--debug`` shows the traceback instead):
exit status 2 for the user's input (a bad argument, template, net, prototxt
or file, a file that is missing), 1 for a failure while running (a disk that
is full or read-only, a permission refused). Output is complete or an error:
a file is written atomically, standard output is flushed and checked, and a
failed write names the file or "standard output" (a reader that closed the
pipe early, as ``| head`` does, ends the command quietly, with status 1).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import json
import shutil
import subprocess
import sys
from pathlib import Path

from unroll.core.errors import FileFormatError, NetError, TemplateError
from unroll.core.proto import NetParameter, PrototxtError, parse_text, read_prototxt
from unroll.tools.draw import to_dot
from unroll.tools.output import OutputClosed, write_output

__all__ = ["CommandError", "FAILURES", "USER_ERRORS", "build_parser", "main", "run_command"]

EXPAND_EXAMPLES = """\
examples:
  unroll expand lstm --steps 5 --set batch=2 --set input_dim=3 --set hidden=4 -o lstm5.prototxt
  unroll expand gru --steps 20 --set batch=8 --set input_dim=50 --set hidden=64 \\
      --set direction=bidirectional --set layers=2 > gru20.prototxt
  unroll expand tagger --steps 30 --set batch=16 --set vocab=20000 --set tags=17 \\
      --set 'features={"suffix": [500, 16]}' -o tagger30.prototxt
  unroll expand mycell --template-dir ./cells --steps 10 --set input_dim=8 --set hidden=8
  unroll expand gru --steps 20 --set input_dim=50 --set hidden=64 --caffe -o gru20.prototxt

Built-in templates: rnn, lstm, lstm_primitive, gru (step templates) and tagger
(a whole net). TEMPLATE may also be a path to a .prototxt.j2 file, or the name
of one in a --template-dir folder or in $UNROLL_TEMPLATE_PATH (os.pathsep-separated).
Step templates take batch (N, default 1), input_dim, their hyper-parameters
(e.g. hidden), direction (forward, reverse, bidirectional), layers and
expose_hidden. The net is built once to check it; a summary goes to stderr.
A comment on top of the prototxt names any layer types of unroll's own it
holds; --caffe writes only layer types BVLC Caffe has instead (`unroll layers`
lists which are which).
"""

DRAW_EXAMPLES = """\
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


# -- expand -------------------------------------------------------------------------


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
    """``key=value`` into (key, parsed value); argparse's type for ``--set``."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected key=value with a name as key, found {text!r}")
    return key, parse_value(value)


def _size(nbytes: int) -> str:
    if nbytes < 1024:
        return f"{nbytes} B"
    if nbytes < 1024**2:
        return f"{nbytes / 1024:.1f} KiB"
    return f"{nbytes / 1024**2:.1f} MiB"


def _byte_size(text: str) -> int:
    from unroll.engine.memory_limit import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _check_variables(template: str, variables: dict, search_path) -> None:
    """Refuse a --set key the template does not take (a typo would be silently ignored)."""
    from unroll.frontend.unroller import NetBuilder, load_template

    loaded = load_template(template, search_path)
    known = {"batch", *loaded.interface.get("defaults", {})}
    if loaded.kind == "step":
        options = inspect.signature(NetBuilder.recurrent).parameters.values()
        known |= {"input_dim"} | {p.name for p in options if p.default is not p.empty}
    for key in variables:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise CommandError(f"--set {key}: template '{template}' has no variable '{key}'"
                               f"{hint}; it takes {', '.join(sorted(known))}")


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


def _net_param(args) -> NetParameter:
    """What ``expand`` and ``inspect`` work on: TEMPLATE unrolled to --steps, or a prototxt
    file (with --steps, its Caffe LSTM and RNN layers unrolled to that many steps)."""
    from unroll.frontend.unroller import expand
    from unroll.tools.caffe_prototxt import expand_net_file

    variables = dict(args.set or [])
    if "steps" in variables:
        raise CommandError("give the number of steps with --steps, not --set steps=...")
    for folder in args.template_dir or ():
        if not Path(folder).is_dir():
            raise CommandError(f"--template-dir {folder}: no such folder")
    if getattr(args, "tree", None) is not None:  # a tree-step template over level widths
        from unroll.frontend.tree_unroller import expand_tree_command_net

        return expand_tree_command_net(args, variables)
    caffe_net = args.template.endswith(".prototxt")  # a net, maybe with Caffe's LSTM/RNN
    if caffe_net and args.steps is None:
        return parse_text(read_prototxt(args.template), NetParameter(), args.template)
    if not caffe_net:
        if args.steps is None:
            raise CommandError(f"template '{args.template}' needs --steps T")
        _check_variables(args.template, variables, args.template_dir or ())
    try:
        if caffe_net:
            return expand_net_file(args.template, args.steps, variables)
        return expand(args.template, steps=args.steps, search_path=args.template_dir or (),
                      **variables)
    except (TemplateError, NetError):
        raise
    except (TypeError, ValueError) as e:  # a --set value of the wrong kind, e.g. layers=two
        raise CommandError(f"cannot expand {args.template!r} with {variables}: {e}") from e


def expand_command(args) -> int:
    """``unroll expand``: write the unrolled prototxt of a template."""
    from unroll.frontend.unroller import to_prototxt

    net_param = _net_param(args)
    text = to_prototxt(net_param, caffe=args.caffe)
    if args.caffe:  # summarize what was written: the lowered net
        net_param = parse_text(text, NetParameter(), "the exported net")
    summary = summarize(net_param, text)
    write_output(text, args.output)
    where = (f"written to {args.output}" if args.output and args.output != "-"
             else "written to stdout")
    print(f"unroll expand {args.template}, T={args.steps}: {summary} {where}", file=sys.stderr)
    return 0


def inspect_command(args) -> int:
    """``unroll inspect``: the params, in-place decisions, splits and memory of a net."""
    from unroll.engine.net import Net

    report = Net(_net_param(args), phase=args.phase).inspect()
    write_output(f"{json.dumps(report.as_dict(), indent=2) if args.json else report}\n")
    return 0


# -- draw ---------------------------------------------------------------------------


def draw_command(args) -> int:
    """``unroll draw``: write a net's Graphviz graph (.dot, or .svg/.png through `dot`)."""
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


def layers_command(args) -> int:
    """``unroll layers``: every registered layer type and the contract it declares."""
    from unroll.tools import catalogue

    print(catalogue.as_json() if args.json else catalogue.text(), end="\n" if args.json else "")
    return 0


def memory_command(args) -> int:
    """``unroll memory``: what a net's memory costs, planned against unplanned."""
    from unroll.engine.net import Net
    from unroll.train.solver import Solver, usual_fields

    net_param = parse_text(read_prototxt(args.net), NetParameter(), args.net)
    net = Net(net_param, phase=args.phase, dtype=args.dtype, memory_budget=args.budget)
    solver = (Solver(net, type=args.solver, base_lr=0.01, **usual_fields(args.solver))
              if args.solver else None)
    write_output(f"{net.memory_report(solver=solver, largest=args.largest)}\n")
    if args.budget is not None:  # the recomputation the budget asks for
        write_output(next(line for line in str(net.inspect()).splitlines()
                          if line.startswith("recomputed in backward")) + "\n")
    return 0


# -- check --------------------------------------------------------------------------


def check_command(args) -> int:
    """``unroll check``: the battery of a step template or of a net's layers; 1 on a failure."""
    from unroll.testing.command import import_reference, run_battery

    try:
        reference = import_reference(args.reference) if args.reference else None
        reports = run_battery(args.template, reference, dict(args.set or []),
                              args.template_dir or ())
    except ValueError as e:  # a --reference, --set or template variable the battery refuses
        raise CommandError(str(e)) from e
    for report in reports:
        print(report.table())
        if not report.passed:
            print(report.failure_message())
    return 0 if all(r.passed for r in reports) else 1


# -- the command ---------------------------------------------------------------------


def _template_arguments(parser, steps_required: bool) -> None:
    parser.add_argument("template", metavar="TEMPLATE",
                        help="a built-in template name (lstm, gru, ...), a name on the template "
                             "path, a path to a .prototxt.j2 file, or a .prototxt net")
    parser.add_argument("--steps", "-T", type=int, required=steps_required, metavar="T",
                        help="number of timesteps to unroll")
    parser.add_argument("--set", action="append", type=parse_assignment, metavar="KEY=VALUE",
                        help="a template variable (repeatable); VALUE is read as a Python "
                             "literal (4, 0.5, True, [50, 8], {'suffix': [50, 8]}) where it "
                             "is one, else as a string")
    parser.add_argument("--template-dir", action="append", metavar="DIR",
                        help="a folder searched for templates by name before "
                             "$UNROLL_TEMPLATE_PATH and the built-ins (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``unroll`` command and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="unroll",
        description="Unroll recurrent step templates (Jinja2 + Caffe prototxt) into "
                    "weight-shared feed-forward nets, and draw nets.",
        epilog="examples:\n"
               "  unroll expand lstm --steps 5 --set batch=2 --set input_dim=3 --set hidden=4 "
               "-o lstm5.prototxt\n"
               "  unroll draw lstm5.prototxt -o lstm5.svg\n"
               "  unroll layers --json\n\n"
               "Run 'unroll expand --help' or 'unroll draw --help' for more.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    ex = sub.add_parser(
        "expand", help="unroll a template to T steps and write the net's prototxt",
        description="Unroll TEMPLATE to --steps timesteps and write the unrolled net as "
                    "prototxt (to stdout without -o).",
        epilog=EXPAND_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _template_arguments(ex, steps_required=False)
    ex.add_argument("--tree", metavar="WIDTHS",
                    help="a tree_step template: unroll it over level widths (nodes per level, "
                         "e.g. 4,2,1; bidirectional: up widths/down widths, 4,2,1/1,2,4), "
                         "with --set direction=up|down|bidirectional and, for Caffe, "
                         "--set fixed_arity=A")
    ex.add_argument("-o", "--output", metavar="FILE",
                    help="write the prototxt to FILE (default: stdout)")
    ex.add_argument("--caffe", action="store_true",
                    help="write only layer types BVLC Caffe has: lower unroll's own (GRUUnit, "
                         "the sequence ends) to Caffe's layers, or refuse the net naming each "
                         "layer Caffe cannot express (Scatter)")
    ex.set_defaults(run=expand_command)

    ins = sub.add_parser(
        "inspect", help="print each param's owner and sharers, the in-place decisions, the "
                        "splits and the memory plan of a net",
        description="Build NET (a prototxt file, or TEMPLATE unrolled to --steps) and print "
                    "its learnable params (owner layer, how many layers hold each, shape, "
                    "lr_mult, decay_mult, frozen, bytes), which layers run in place and which "
                    "were given memory of their own (and why), the splits inserted, and the "
                    "memory plan. With --steps, Caffe's LSTM and RNN layers of a prototxt are "
                    "unrolled first.",
    )
    _template_arguments(ins, steps_required=False)
    ins.add_argument("--phase", choices=["train", "test"], default="train")
    ins.add_argument("--json", action="store_true", help="print the same as JSON, for tools")
    ins.set_defaults(run=inspect_command)

    dr = sub.add_parser(
        "draw", help="draw a net's prototxt as a Graphviz graph (.dot, .svg, .png)",
        description="Draw NET (a prototxt file) as a Graphviz graph, marking shared params.",
        epilog=DRAW_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dr.add_argument("net", metavar="NET", help="a net prototxt file")
    dr.add_argument("-o", "--output", metavar="FILE",
                    help="FILE.dot (Graphviz source), or FILE.svg / .png / .pdf rendered with "
                         "`dot`; default: the .dot source on stdout")
    dr.add_argument("--rankdir", choices=["LR", "TB", "RL", "BT"], default="LR",
                    help="graph direction (default LR: left to right)")
    dr.set_defaults(run=draw_command)

    me = sub.add_parser(
        "memory", help="print what a net's memory costs, planned against unplanned",
        description="Build NET (a prototxt file) and print the bytes of its params, solver "
                    "history, activations, diffs and layer scratch, with and without the "
                    "memory plan, and its largest blobs.",
    )
    me.add_argument("net", metavar="NET", help="a net prototxt file")
    me.add_argument("--phase", choices=["train", "test"], default="train")
    me.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    me.add_argument("--solver", metavar="TYPE",
                    help="count this solver's history too (SGD, Adam, ...)")
    me.add_argument("--largest", type=int, default=10, metavar="K",
                    help="list the K largest blobs (default 10)")
    me.add_argument("--budget", type=_byte_size, metavar="BYTES",
                    help="plan within this memory (e.g. 500MB): backward recomputes "
                         "segments of the forward; prints the checkpoints, the recompute "
                         "factor and the planned peak")
    me.set_defaults(run=memory_command)

    la = sub.add_parser(
        "layers", help="list every registered layer type and the contract it declares",
        description="List every registered layer type: whether BVLC Caffe has it, its bottom "
                    "and top counts, learnable blobs, in-place support, what its backward "
                    "reads and its parameter messages (unroll.tools.catalogue).",
    )
    la.add_argument("--json", action="store_true", help="print the same as JSON, for tools")
    la.set_defaults(run=layers_command)
    ck = sub.add_parser(
        "check", help="run the test battery on a step template or on a net's layers",
        description="Run unroll.testing's battery on TEMPLATE (a step template: unrolled "
                    "forward against --reference, cont gating, gradients, accumulation, "
                    "float32) or on each layer of a .prototxt net (check_layer on bottoms "
                    "drawn from [-1, 1]). Prints a table of checks; exit status 1 if any "
                    "fails. A gradient check proves backward consistent with forward; only a "
                    "reference proves forward right.",
        epilog="examples:\n  unroll check lstm --reference unroll.testing.references:lstm_step "
               "--set hidden=64 --set steps=10\n  unroll check mycell.prototxt.j2 --reference "
               "mycells:peephole_step --set hidden=8\n  unroll check mylayer.prototxt",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ck.add_argument("template", metavar="TEMPLATE_OR_PROTOTXT",
                    help="a step template (name or .prototxt.j2 path) or a .prototxt net")
    ck.add_argument("--reference", metavar="MODULE:FUNCTION",
                    help="the NumPy reference: for a template, reference_step(x_t, states, "
                         "params) -> (outputs, states); for a one-layer net, f(*bottoms, "
                         "*blobs) -> top(s)")
    ck.add_argument("--set", action="append", type=parse_assignment, metavar="KEY=VALUE",
                    help="a template variable or battery option (hidden=64, steps=10, "
                         "batch=3, input_dim=3); repeatable")
    ck.add_argument("--template-dir", action="append", metavar="DIR",
                    help="a folder searched for templates by name (repeatable)")
    ck.set_defaults(run=check_command)
    for command in (ex, ins, dr, me, la, ck):
        command.add_argument("--debug", action="store_true",
                             help="show the traceback of an error, not one line")
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
