"""Graphviz rendering of a net: layers, blobs and the params they share (as Caffe's draw.py)."""

from __future__ import annotations

from collections import defaultdict

from unroll.core.proto import NetParameter

__all__ = ["shared_params", "to_dot"]

PALETTE = [
    "#a6cee3", "#b2df8a", "#fb9a99", "#fdbf6f", "#cab2d6", "#ffff99",
    "#8dd3c7", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69",
]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def shared_params(net_param: NetParameter) -> dict[str, list[str]]:
    """Param name -> names of the layers that use it, for params used by 2 or more layers."""
    users = defaultdict(list)
    for lp in net_param.layer:
        for spec in lp.param:
            if spec.name and lp.name not in users[spec.name]:
                users[spec.name].append(lp.name)
    return {name: layers for name, layers in users.items() if len(layers) > 1}


def to_dot(net_param: NetParameter, rankdir: str = "LR") -> str:
    """Graphviz source of ``net_param``: layers as boxes, blobs as ellipses.

    Edges run bottom blob -> layer -> top blob. Each shared param has a colour;
    the layers using it are filled with it (striped when they use several) and
    list it in their label, and a note node for the param links to them by
    dashed edges. A blob rewritten in place is one node, as in Caffe's draw_net.

    >>> from unroll.core.proto import parse_text
    >>> net = parse_text('layer { name: "a" type: "Input" top: "x" }', NetParameter())
    >>> print(to_dot(net).splitlines()[0])
    digraph "net" {
    """
    shared = shared_params(net_param)
    colour = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(shared)}
    lines = [
        f"digraph {_quote(net_param.name or 'net')} {{",
        f"  rankdir={rankdir};",
        '  node [fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    blobs = dict.fromkeys(name for lp in net_param.layer for name in (*lp.bottom, *lp.top))
    for name in blobs:
        lines.append(f"  {_quote('blob:' + name)} [label={_quote(name)}, shape=ellipse];")
    for i, lp in enumerate(net_param.layer):
        layer_id = _quote(f"layer:{i}:{lp.name}")
        label = f"{lp.name}\n({lp.type})"
        named = [spec.name for spec in lp.param if spec.name]
        if named:
            label += "\nparam: " + ", ".join(
                f"{name} (shared)" if name in shared else name for name in named)
        fills = [colour[name] for name in named if name in shared]
        attrs = [f"label={_quote(label)}", "shape=box"]
        if len(fills) == 1:
            attrs += ["style=filled", f"fillcolor={_quote(fills[0])}"]
        elif fills:
            attrs += ["style=striped", f"fillcolor={_quote(':'.join(fills))}"]
        lines.append(f"  {layer_id} [{', '.join(attrs)}];")
        for bottom in lp.bottom:
            lines.append(f"  {_quote('blob:' + bottom)} -> {layer_id};")
        for top in lp.top:
            lines.append(f"  {layer_id} -> {_quote('blob:' + top)};")
    index = {lp.name: i for i, lp in enumerate(net_param.layer)}
    for name, layers in shared.items():
        param_id = _quote("param:" + name)
        label = f"shared param {name}\nused by {len(layers)} layers"
        lines.append(f"  {param_id} [label={_quote(label)}, shape=note, style=filled, "
                     f"fillcolor={_quote(colour[name])}];")
        for layer in layers:
            lines.append(f"  {param_id} -> {_quote(f'layer:{index[layer]}:{layer}')} "
                         f"[style=dashed, arrowhead=none, color={_quote(colour[name])}, "
                         f"constraint=false];")
    lines.append("}")
    return "\n".join(lines) + "\n"
