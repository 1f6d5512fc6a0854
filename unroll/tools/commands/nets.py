"""The net ``expand`` and ``inspect`` work on: a template unrolled, or a prototxt file."""

from __future__ import annotations

import difflib
import inspect
from pathlib import Path

from unroll.core.errors import NetError, TemplateError
from unroll.core.proto import NetParameter, parse_text, read_prototxt
from unroll.tools.commands.running import CommandError

__all__ = ["net_param"]


def _check_variables(template: str, variables: dict, search_path) -> None:
    """Refuse a --set key the template does not take (a typo would be silently ignored)."""
    from unroll.frontend.recurrence import recurrent
    from unroll.frontend.template import load_template

    loaded = load_template(template, search_path)
    known = {"batch", *loaded.interface.get("defaults", {})}
    if loaded.kind == "step":
        options = inspect.signature(recurrent).parameters.values()
        known |= {"input_dim"} | {p.name for p in options if p.default is not p.empty}
    for key in variables:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise CommandError(f"--set {key}: template '{template}' has no variable '{key}'"
                               f"{hint}; it takes {', '.join(sorted(known))}")


def net_param(args) -> NetParameter:
    """TEMPLATE unrolled to --steps, or a prototxt file (with --steps, its Caffe LSTM and RNN
    layers unrolled to that many steps)."""
    from unroll.frontend.unroller import expand
    from unroll.tools.caffe_prototxt import expand_net_file

    variables = dict(args.set or [])
    if "steps" in variables:
        raise CommandError("give the number of steps with --steps, not --set steps=...")
    for folder in args.template_dir or ():
        if not Path(folder).is_dir():
            raise CommandError(f"--template-dir {folder}: no such folder")
    if getattr(args, "tree", None) is not None:  # a tree-step template over level widths
        from unroll.tools.tree_option import tree_net

        return tree_net(args.template, args.tree, variables, args.template_dir or ())
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
