"""A tree layer unrolled level by level: a :class:`TreeRecurrence` per direction.

The sibling of :mod:`unroll.frontend.recurrence` over the levels of a batch of
trees instead of the steps of a sequence (docs/design.md, "Unrolling over
trees"; the template API and the index inputs: :mod:`unroll.frontend.tree_unroller`).
``tree()`` (a net template's call, and what :func:`~unroll.frontend.unroller.expand`
makes of a tree_step template) checks its options and adds one
:class:`TreeRecurrence` per direction to a :class:`~unroll.frontend.builder.NetBuilder`.

>>> from unroll.frontend.builder import NetBuilder
>>> b = NetBuilder(steps=1, batch=3)
>>> b.input("input", {"x": (3, 4)})
>>> tree(b, "child_sum_tree_lstm", "x", "h", (2, 1), hidden=5)
'#@unroll:block:0'
>>> b.layers[-1].type
'Silence'
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from unroll.core.errors import TemplateError
from unroll.core.proto import LayerParameter, NetParameter
from unroll.frontend.builder import NetBuilder
from unroll.frontend.render import render_macro, run_module
from unroll.frontend.template import (
    SUFFIX,
    BlobNames,
    Step,
    Template,
    hyper_parameters,
    load_template,
    merge_hyper,
)
from unroll.frontend.tree import DIRECTIONS, MAX_TREE_DEPTH, TreeLayout, level_widths

__all__ = ["TREE_DIRECTIONS", "TREE_OPTIONS", "TreeRecurrence", "TreeStep", "tree",
           "tree_inputs", "tree_net", "tree_widths"]

#: the directions of a tree layer
TREE_DIRECTIONS = (*DIRECTIONS, "bidirectional")
#: everything tree() and a tree_step expansion take besides the template's hyper-parameters
TREE_OPTIONS = ("widths", "direction", "rows", "fixed_arity", "scope", "input_dim", "hyper")


class TreeStep(Step):
    """What a tree-step template's macros receive as ``s``: the names of one level.

    ``node(s)``: ``input.NAME`` (the level's rows of input NAME), ``inbox.NAME``
    (what the children sent: their summed messages, or their states side by
    side by position), ``state.NAME`` and ``output.NAME`` to produce.
    ``edge(s)`` (children "sum" only): ``sender.NAME`` (a child's states),
    ``receiver.NAME`` (its parent's inputs), ``message.NAME`` to produce. Both:
    ``level`` (0 .. levels-1, in run order), ``levels``, ``direction``, and
    ``blob``, ``layer``, ``param`` as in :class:`~unroll.frontend.template.Step`.

    >>> s = TreeStep("up_", "node", 2, 5, "up", input={"x": "up_x_l2"}, state={"h": "up_h_l2"})
    >>> s.blob("gates"), s.param("W"), s.input.x, s.level
    ('up_gates_l2', 'up_W', 'up_x_l2', 2)
    """

    def __init__(self, scope: str, macro: str, level: int, levels: int, direction: str,
                 input=None, inbox=None, state=None, output=None, sender=None, receiver=None,
                 message=None):
        super().__init__(scope, level, levels, input=input, state=state, output=output)
        # removed, not left None: a tree template reading them is wrong (t and T stay: the
        # level and the levels, which name the rendered text in errors)
        del self.reverse, self.cont, self.prev
        self._suffix = f"_l{level}" if macro == "node" else f"_e{level}"
        self.level, self.levels, self.direction = level, levels, direction
        self.inbox, self.sender, self.receiver, self.message = (
            BlobNames(kind, names or {}) for kind, names in (
                ("inbox", inbox), ("sender", sender), ("receiver", receiver),
                ("message", message)))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise jinja2.UndefinedError(
            f"s.{name}: a tree step's s has no '{name}' (it has level, levels, direction, "
            f"input, inbox, state, output, sender, receiver, message, blob(), layer(), param())")


def tree_widths(trees, direction: str) -> tuple:
    """The real level widths of the batch ``trees``: a tuple of nodes per level, or for
    ``"bidirectional"`` the pair (up widths, down widths)."""
    if direction == "bidirectional":
        return (level_widths(trees, "up"), level_widths(trees, "down"))
    return level_widths(trees, direction)


def _directions(direction: str, widths, rows) -> list[tuple[str, str, tuple]]:
    """(direction, scope, widths) of each direction of a tree layer."""
    if direction not in TREE_DIRECTIONS:
        raise TemplateError(f"direction must be one of {TREE_DIRECTIONS}, found {direction!r}")
    if direction == "bidirectional":
        if len(widths) != 2:
            raise TemplateError(f"a bidirectional tree layer takes widths (up widths, down "
                                f"widths), found {widths!r}")
        pairs = [("up", "up_", tuple(widths[0])), ("down", "down_", tuple(widths[1]))]
    else:
        pairs = [(direction, "", tuple(widths))]
    for d, _, w in pairs:
        if not w or any(int(n) < 1 for n in w):
            raise TemplateError(f"{d}: level widths must be one or more counts >= 1, found {w!r}")
        if len(w) > MAX_TREE_DEPTH:
            raise TemplateError(f"{d}: {len(w)} levels; a tree layer runs at most "
                                f"{MAX_TREE_DEPTH} (unroll.frontend.tree.MAX_TREE_DEPTH)")
        if rows is not None and sum(w) > rows:
            raise TemplateError(f"{d}: {sum(w)} level slots do not fit {rows} node rows")
    return pairs


def _rows(widths_by_dir) -> int:
    return max(sum(w) for _, _, w in widths_by_dir)


def tree_inputs(trees, template: Template, widths, direction: str = "up", rows=None,
                fixed_arity: int | None = None, hyper: dict | None = None,
                scope: str = "") -> dict:
    """The index inputs of a tree net expanded with ``widths`` for the batch ``trees``.

    ``template``, ``direction``, ``rows``, ``fixed_arity`` and ``scope`` as given to
    :func:`~unroll.frontend.tree_unroller.expand_tree`; ``hyper`` the template's
    hyper-parameters where it takes ``arity`` from them.
    """
    children = template.interface["children"]
    arity = fixed_arity
    if children == "positional":
        arity = int({**template.defaults, **(hyper or {})}["arity"])
    pairs = _directions(direction, widths, rows)
    rows = _rows(pairs) if rows is None else int(rows)
    out = {}
    for d, sc, w in pairs:
        layout = TreeLayout.of(trees, d, w, rows)
        out.update(layout.inputs(scope + sc, children, arity))
    return out


def _layer(name: str, type_: str, bottoms, tops) -> LayerParameter:
    return LayerParameter(name=name, type=type_, bottom=list(bottoms), top=list(tops))


class TreeRecurrence:
    """One direction of a tree layer, added to a NetBuilder: the sibling of
    :class:`~unroll.frontend.recurrence.Recurrence` over levels, not steps."""

    def __init__(self, builder: NetBuilder, template: Template, hyper: dict, bottom: str, top: str,
                 direction: str, scope: str, widths: tuple, rows: int, fixed_arity):
        self.builder, self.template, self.hyper = builder, template, hyper
        self.bottom, self.top, self.direction, self.scope = bottom, top, direction, scope
        self.widths, self.rows = widths, rows
        iface = template.interface
        self.children = iface["children"]
        self.states = {n: int(hyper[v]) for n, v in iface["states"].items()}
        self.messages = ({n: int(hyper[v]) for n, v in iface["messages"].items()}
                         if self.children == "sum" else self.states)
        self.arity = int(hyper["arity"]) if self.children == "positional" else fixed_arity
        self.input_name = iface["inputs"][0]
        self.module = run_module(template, hyper)
        self.where = f"{template.name} ({direction})"

    def name(self, local: str, level: int | None = None) -> str:
        return f"{self.scope}{local}" + ("" if level is None else f"_l{level}")

    def add(self, lp: LayerParameter) -> None:
        self.builder.add_layer(lp, f"{self.where}: layer '{lp.name}'")

    def inputs(self) -> None:
        """The index inputs and the zero rows every table starts with."""
        w, n = self.widths, self.name
        tops = {n("slot_node"): (sum(w),), n("node_slot"): (self.rows,)}
        for lv, width in enumerate(w):
            if self.children == "positional":
                tops[n(f"src_{lv}")] = (width * self.arity,)
            elif self.direction == "down":
                tops[n(f"src_{lv}")] = (width,)
            else:
                if self.arity is None:  # a zero row, then the level below
                    tops[n(f"seg_{lv}")] = (1 + (w[lv - 1] if lv else 0),)
                else:
                    tops[n(f"src_{lv}")] = (self.arity * width,)
                tops[n(f"parent_{lv}")] = (width,)
        # the tables hold messages (child sums bottom-up) or states (everything else)
        tabled = self.messages if self.children == "sum" and self.direction == "up" else (
            self.states)
        for m, size in tabled.items():
            tops[n(f"{m}_zero")] = (1, size)
        self.builder.input(n("tree_input"), tops)

    def table(self, name: str, parts: list[str], level: int) -> str:
        """A zero row, then ``parts``, along axis 0."""
        zero = self.name(f"{name}_zero")
        if not parts:
            return zero
        lp = _layer(self.name(f"{name}_table", level), "Concat", [zero, *parts],
                    [self.name(f"{name}_table", level)])
        lp.concat_param.axis = 0
        self.add(lp)
        return lp.top[0]

    def gather(self, table: str, index: str, top: str) -> str:
        self.add(_layer(top, "BatchReindex", [table, index], [top]))
        return top

    def reshape(self, bottom: str, top: str, dims) -> str:
        lp = _layer(top, "Reshape", [bottom], [top])
        lp.reshape_param.shape.dim.extend(dims)
        self.add(lp)
        return top

    def render(self, macro: str, s: TreeStep, must: list) -> None:
        """Render ``macro`` for ``s``; it must top each (kind, local name, blob) of ``must``."""
        layers = render_macro(self.template, self.module, macro, s)
        tops = {t for lp in layers for t in lp.top}
        for kind, local, blob in must:
            if blob not in tops:
                raise TemplateError(f"{self.template.name}: the {macro} macro at level {s.level} "
                                    f"must produce {kind} '{local}' (s.{kind}.{local}, "
                                    f"'{blob}'), but no layer tops it")
        for lp in layers:
            self.builder.add_layer(lp, f"{self.template.name} ({macro}, level {s.level})")

    def expand(self) -> list[str]:
        """Add the direction's layers; returns the blobs nothing may read (to silence)."""
        self.inputs()
        n, w, levels = self.name, self.widths, len(self.widths)
        slots = self.gather(self.bottom, n("slot_node"), n(f"{self.input_name}_slots"))
        if levels == 1:
            xs = [slots]
        else:
            lp = _layer(n(f"{self.input_name}_levels"), "Slice", [slots],
                        [n(self.input_name, lv) for lv in range(levels)])
            lp.slice_param.axis = 0
            point = 0
            for width in w[:-1]:
                point += width
                lp.slice_param.slice_point.append(point)
            self.add(lp)
            xs = list(lp.top)
        state_blobs = {s: [] for s in self.states}
        msg_blobs = {m: [] for m in self.messages}
        iface = self.template.interface
        outputs = {o: [] for o in iface["outputs"]}
        for lv in range(levels):
            inbox = self.inbox(lv, xs[lv], state_blobs, msg_blobs)
            state = {s: n(s, lv) for s in self.states}
            extra = {o: n(f"{o}_out", lv) for o in outputs if o not in self.states}
            s = TreeStep(self.scope, "node", lv, levels, self.direction,
                         input={self.input_name: xs[lv]}, inbox=inbox, state=state, output=extra)
            self.render("node", s, [*(("state", k, v) for k, v in state.items()),
                                    *(("output", k, v) for k, v in extra.items())])
            for k, blob in state.items():
                state_blobs[k].append(blob)
            for o in outputs:
                outputs[o].append(state[o] if o in state else extra[o])
            if self.children == "sum" and self.direction == "up":
                receiver = self.gather(self.bottom, n(f"parent_{lv}"),
                                       n(f"{self.input_name}_parent", lv))
                message = {m: n(f"{m}_msg", lv) for m in self.messages}
                e = TreeStep(self.scope, "edge", lv, levels, self.direction,
                             sender=state, receiver={self.input_name: receiver}, message=message)
                self.render("edge", e, [("message", k, v) for k, v in message.items()])
                for m, blob in message.items():
                    msg_blobs[m].append(blob)
        for i, (o, blobs) in enumerate(outputs.items()):
            out = self.top if i == 0 else f"{self.top}_{o}"
            table = blobs[0]
            if levels > 1:
                table = n(f"{o}_slots")
                lp = _layer(table, "Concat", blobs, [table])
                lp.concat_param.axis = 0
                self.add(lp)
            self.gather(table, n("node_slot"), out)
        return [b for blobs in (*state_blobs.values(), *msg_blobs.values()) for b in blobs]

    def inbox(self, lv: int, x: str, state_blobs: dict, msg_blobs: dict) -> dict:
        """The blobs node(s) of level ``lv`` reads as ``s.inbox``."""
        n, width = self.name, self.widths[lv]
        # every child is in the level next to its parent's: each table holds the level
        # before this one only (tree.levels_of), so a level costs what its nodes do
        if self.children == "positional":
            out = {}
            for k, size in self.states.items():
                got = self.gather(self.table(k, state_blobs[k][lv - 1: lv], lv), n(f"src_{lv}"),
                                  n(f"{k}_children", lv))
                out[k] = self.reshape(got, n(f"{k}_inbox", lv), [width, self.arity * size])
            return out
        if self.direction == "down":
            sender = {k: self.gather(self.table(k, state_blobs[k][lv - 1: lv], lv),
                                     n(f"src_{lv}"), n(f"{k}_parent", lv))
                      for k in self.states}
            message = {m: n(f"{m}_msg", lv) for m in self.messages}
            e = TreeStep(self.scope, "edge", lv, len(self.widths), self.direction,
                         sender=sender, receiver={self.input_name: x}, message=message)
            self.render("edge", e, [("message", k, v) for k, v in message.items()])
            return message
        out = {}
        for m, size in self.messages.items():
            table = self.table(m, msg_blobs[m][lv - 1: lv], lv)
            if self.arity is None:
                top = n(f"{m}_inbox", lv)
                self.add(_layer(top, "SegmentSum", [table, n(f"seg_{lv}"), x], [top]))
                out[m] = top
                continue
            # the fixed-arity form, in Caffe's own layers: child a of every slot, a-major
            got = self.gather(table, n(f"src_{lv}"), n(f"{m}_children", lv))
            if self.arity == 1:
                out[m] = got
                continue
            by_child = self.reshape(got, n(f"{m}_by_child", lv), [self.arity, width * size])
            cut = _layer(n(f"{m}_child_cut", lv), "Slice", [by_child],
                         [n(f"{m}_child_{a}", lv) for a in range(self.arity)])
            cut.slice_param.axis = 0
            self.add(cut)
            total = n(f"{m}_child_sum", lv)
            self.add(_layer(total, "Eltwise", cut.top, [total]))
            out[m] = self.reshape(total, n(f"{m}_inbox", lv), [width, size])
        return out


def tree(builder: NetBuilder, template, bottom: str, top: str, widths,
         rows: int | None = None, direction: str = "up", scope: str = "",
         fixed_arity: int | None = None, hyper: dict | None = None, **more_hyper) -> str:
    """Add a tree layer reading ``bottom`` (rows, D) to ``builder``: ``top`` (rows, ...).

    Called from net templates as ``{{ tree("child_sum_tree_lstm", "x", "enc", widths,
    direction="bidirectional", hidden=64) }}``; returns a marker that
    :func:`~unroll.frontend.unroller.expand` replaces with the layers. Layers, inputs and
    params as :func:`~unroll.frontend.tree_unroller.expand_tree` describes; ``scope``
    prefixes every name (the directions of a bidirectional layer add ``up_`` and
    ``down_``).
    """
    template = load_template(template, builder.search_path)
    builder.loaded.add(template.path)
    what = f"tree({Path(str(template.path)).name!r})"
    if template.kind != "tree_step":
        raise TemplateError(f"{what}: '{template.name}' is a {template.kind} template, not a "
                            f"tree_step")
    hyper = hyper_parameters(template, merge_hyper(what, more_hyper, hyper), also=TREE_OPTIONS)
    if fixed_arity is not None and (template.interface["children"] == "positional"
                                    or int(fixed_arity) < 1):
        raise TemplateError(f"{what}: fixed_arity is the child slots of a child-sum template "
                            f"(>= 1); a positional template takes them from its 'arity'")
    pairs = _directions(direction, widths, rows)
    rows = _rows(pairs) if rows is None else int(rows)
    first = len(builder.layers)
    unread, outs = [], []
    for d, sc, w in pairs:
        out = top if len(pairs) == 1 else f"{top}_{d}"
        unread += TreeRecurrence(builder, template, hyper, bottom, out, d, scope + sc, w, rows,
                                 fixed_arity).expand()
        outs.append(out)
    if len(pairs) > 1:
        builder.concat(f"{scope}bi_concat", outs, top, axis=1)
    unread = [blob for blob in unread if blob not in builder.consumed]
    if unread:
        builder.silence(f"{scope}tree_silence", unread)
    return builder.block(first)


def tree_net(template: Template, search_path, variables: dict,
             hyper: dict | None) -> tuple[NetParameter, NetBuilder]:
    """The whole net of tree_step ``template``: x (rows, input_dim) in, h out; and the
    builder that made it. ``variables``: ``widths``, ``input_dim``, the options of
    :func:`tree` and the template's hyper-parameters."""
    variables = dict(variables)
    for needed in ("widths", "input_dim"):
        if needed not in variables:
            raise TemplateError(f"{template.name}: expanding a tree_step template needs "
                                f"{needed}=")
    widths, input_dim = variables.pop("widths"), variables.pop("input_dim")
    direction = variables.pop("direction", "up")
    rows = variables.pop("rows", None)
    pairs = _directions(direction, widths, rows)
    rows = _rows(pairs) if rows is None else int(rows)
    builder = NetBuilder(1, rows, search_path)
    builder.input("input", {"x": (rows, int(input_dim))})
    tree(builder, str(template.path), "x", "h", widths, rows, direction, hyper=hyper,
         **variables)
    name = template.name[: -len(SUFFIX)] if template.name.endswith(SUFFIX) else template.name
    return builder.net_param(f"{name}_{direction}"), builder
