"""``unroll expand TEMPLATE --tree WIDTHS``: a tree_step template over level widths.

The option's text is the nodes per level, ``4,2,1``, or for a bidirectional
layer the up widths and the down widths, ``4,2,1/1,2,4``; ``--set`` gives the
template's hyper-parameters, ``input_dim`` and the tree layer's options
(``direction``, ``fixed_arity``, ``rows``). See
:func:`unroll.frontend.tree_unroller.expand_tree`.

>>> net = tree_net("child_sum_tree_lstm", "2,1", {"input_dim": 3, "hidden": 4})
>>> net.name
'child_sum_tree_lstm_up'
"""

from __future__ import annotations

from unroll.core.errors import TemplateError
from unroll.core.proto import NetParameter
from unroll.frontend.tree_unroller import expand_tree

__all__ = ["parse_widths", "tree_net"]


def parse_widths(text: str) -> tuple:
    """Level widths from the command line: "4,2,1", or "4,2,1/1,2,4" (up widths/down widths).

    >>> parse_widths("4,2,1"), parse_widths("3,1/1,3")
    ((4, 2, 1), ((3, 1), (1, 3)))
    """
    parts = text.split("/")
    try:
        widths = [tuple(int(w) for w in part.split(",")) for part in parts]
    except ValueError:
        raise TemplateError(f"--tree {text!r}: expected nodes per level, e.g. 4,2,1 (or up "
                            f"widths/down widths, 4,2,1/1,2,4)") from None
    if len(widths) > 2:
        raise TemplateError(f"--tree {text!r}: at most two lists of widths (up/down)")
    return widths[0] if len(widths) == 1 else tuple(widths)


def tree_net(template: str, widths_text: str, variables: dict, search_path=()) -> NetParameter:
    """The net of ``unroll expand TEMPLATE --tree WIDTHS_TEXT --set VARIABLES...``."""
    widths = parse_widths(widths_text)
    variables = dict(variables)
    direction = variables.pop("direction", "bidirectional" if len(widths) == 2 and isinstance(
        widths[0], tuple) else "up")
    if "input_dim" not in variables:
        raise TemplateError(f"{template}: expanding a tree_step template needs "
                            f"--set input_dim=D")
    return expand_tree(template, widths, direction=direction, search_path=search_path,
                       **variables)
