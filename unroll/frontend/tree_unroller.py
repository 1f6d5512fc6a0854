"""Unroll a tree-step template over trees, level by level: one batched step per level.

A **tree-step template** (``"kind": "tree_step"``) renders one node's layers
from its input and its children's states, for all nodes of one level of a
batch at once (``docs/design.md``, "Unrolling over trees"). The unroller
renders it once per level and wires the levels with gathers (BatchReindex)
and segment sums whose indices are inputs, like cont: the net depends only
on the level widths (nodes per level, padded to a bucket), never on which
node is whose child, so it is built once per bucket and reused.

Two ways for a node to see its children (the interface's ``"children"``):

- ``"sum"`` (child-sum Tree-LSTM): an ``edge(s)`` macro computes what a child
  sends to its parent (``s.message.NAME``, declared in ``"messages"``) from
  the child's states (``s.sender.NAME``) and the parent's input
  (``s.receiver.NAME``); ``node(s)`` reads the sum of its incoming messages
  (``s.inbox.NAME``, (W, size)).
- ``"positional"`` (N-ary Tree-LSTM, hyper-parameter ``arity`` = N): ``node(s)``
  reads ``s.inbox.NAME``, the children's states side by side by position,
  (W, N * size), zero where a position is empty. No edge macro.

``node(s)`` reads ``s.input.NAME`` (the level's rows of the input, (W, D)) and
must produce every state ``s.state.NAME`` (W, size) and every output that is
not a state. ``s.level``, ``s.levels`` and ``s.direction`` ("up" or "down")
tell where it is; ``s.blob``, ``s.layer`` and ``s.param`` name things as in a
step template (params are shared by every level).

Directions: ``"up"`` runs leaves to root, levels by height (a node's
children are done before it); ``"down"`` runs root to leaves, levels by depth,
and a node's one "child" is its parent, so the same equations give each node
the context above it; ``"bidirectional"`` runs both (params ``up_*`` and
``down_*``) and concatenates their outputs.

The expanded net reads the node inputs ``x`` (rows, D) in node order (the
batch's trees back to back, then padding rows) and writes ``h`` (rows, ...)
in node order; the index inputs that place nodes into level slots and wire
children to parents come from :meth:`unroll.frontend.tree.TreeLayout.inputs` (or
:func:`tree_inputs`). :func:`expand_tree` is :func:`~unroll.frontend.unroller.expand`
of a tree_step template over level widths; a net template places a tree layer
with ``{{ tree(template, bottom, top, widths, ...) }}``
(:func:`unroll.frontend.tree_recurrence.tree`).

>>> from unroll.frontend.tree import Tree
>>> trees = [Tree.from_heads([2, 0, 2]), Tree.from_heads([0])]
>>> widths = tree_widths(trees, "up")
>>> widths
(3, 1)
>>> net_param = expand_tree("child_sum_tree_lstm", widths, input_dim=4, hidden=5)
>>> import unroll, numpy as np
>>> net = unroll.Net(net_param)
>>> inputs = tree_inputs(trees, load_template("child_sum_tree_lstm"), widths, "up")
>>> net.forward(x=np.ones((4, 4)), **inputs)["h"].shape
(4, 5)
"""

from __future__ import annotations

from unroll.core.errors import TemplateError
from unroll.core.proto import NetParameter
from unroll.frontend.template import load_template
from unroll.frontend.tree_recurrence import TREE_DIRECTIONS, TreeStep, tree_inputs, tree_widths
from unroll.frontend.unroller import expand

__all__ = ["TREE_DIRECTIONS", "TreeStep", "expand_tree", "tree_inputs", "tree_widths"]


def expand_tree(template, widths, input_dim: int, direction: str = "up",
                rows: int | None = None, fixed_arity: int | None = None, search_path=(),
                hyper: dict | None = None, **variables) -> NetParameter:
    """Unroll tree-step ``template`` over level ``widths``: a whole net, x (rows, D) -> h.

    ``widths`` holds the nodes per level (run order: by height for
    ``direction="up"``, by depth for ``"down"``), or for ``"bidirectional"``
    the pair (up widths, down widths); ``rows`` the node rows (default: the
    most slots of a direction). The net has inputs ``x`` (rows, input_dim) in
    node order and the index inputs of :func:`tree_inputs`, and outputs ``h``
    (rows, ...) in node order (bidirectional: both directions side by side).
    It is ``expand(template, widths=widths, input_dim=input_dim, ...)``: one
    cache, one render budget and one set of checks with every other expansion.

    The child-sum of a ``"sum"`` template bottom-up is a SegmentSum (an unroll
    layer) of every message below the level, by the parent's slot. With
    ``fixed_arity=A`` it is instead the sum of A gathers, one per child slot,
    in Caffe's own layers (BatchReindex, Reshape, Slice, Eltwise), for trees
    whose nodes have at most A children: the form to export to Caffe. A
    positional template is in that form already.

    >>> net_param = expand_tree("nary_tree_lstm", (2, 1), input_dim=3, hidden=4, arity=2)
    >>> sorted({lp.type for lp in net_param.layer})[:4]
    ['BatchReindex', 'Concat', 'Eltwise', 'InnerProduct']
    """
    loaded = load_template(template, search_path)
    if loaded.kind != "tree_step":
        raise TemplateError(f"{loaded.name} is a {loaded.kind} template; expand_tree takes "
                            f"a tree_step template")
    options = {"rows": rows, "fixed_arity": fixed_arity}
    return expand(str(loaded.path), search_path=search_path, hyper=hyper, widths=widths,
                  input_dim=input_dim, direction=direction,
                  **{k: v for k, v in options.items() if v is not None}, **variables)
