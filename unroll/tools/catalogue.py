"""The layer catalogue: every registered layer type and the contract it declares.

Read off the layer classes themselves (the class attributes of
:data:`unroll.engine.layer.CONTRACT`, ``param_blobs``, ``param_messages`` and the
optional hooks), so it cannot drift from the code. ``unroll layers`` prints
it (``--json`` for tools); the README's "Layers" table is
:func:`markdown`, regenerated with ``python -m unroll.tools.catalogue --markdown``.

>>> entry = next(e for e in catalogue() if e.type == "InnerProduct")
>>> entry.caffe, entry.bottoms, entry.tops, entry.param_messages
(True, '1', '1', ('inner_product_param',))
>>> next(e for e in catalogue() if e.type == "GRUUnit").caffe
False
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass

from unroll.core.proto import LayerParameter
from unroll.engine.layer import LAYERS, Layer
from unroll.frontend.caffe_export import caffe_layer_types

#: the optional hooks a layer class may define, and what each tells the net: a name of
#: Layer's, or ``memory.<field>``, one of its :class:`~unroll.engine.memory_traits.MemoryTraits`
HOOKS = {
    "check_host_bottom": "checks index bottoms on the host",
    "draws_random": "draws random numbers",
    "memory.batched_param_gradient": "param gradient batched over sharers",
    "memory.passes_diff": "may alias a bottom diff to the top's",
    "memory.parts_of_whole": "parts placed inside the whole",
    "memory.reads_in_backward": "what backward reads depends on the bottoms needing gradients",
}


@dataclass(frozen=True)
class LayerEntry:
    """One registered layer type, as its class declares it."""

    type: str
    #: BVLC Caffe has this type (``unroll.frontend.caffe_export.caffe_layer_types``)
    caffe: bool
    bottoms: str
    tops: str
    #: the learnable blobs, in order ("name (shape), when it exists")
    learnable_blobs: tuple
    #: the blobs are state that no solver updates (BatchNorm's statistics), not weights
    state_blobs: bool
    #: may run in place (top == bottom)
    in_place: bool
    #: what backward reads besides the top diffs and what forward saved
    backward_reads: str
    param_messages: tuple
    is_loss: bool
    #: the optional hooks the class defines (keys of :data:`HOOKS`)
    hooks: tuple
    summary: str


def _count(bounds: tuple) -> str:
    lo, hi = bounds
    if lo == hi:
        return str(lo)
    return f"{lo}..{'any' if hi is None else hi}"


def _backward_reads(cls) -> str:
    if isinstance(cls.backward_reads, property):  # fixed by the LayerParameter
        doc = " ".join((cls.backward_reads.__doc__ or "").split()).rstrip(".")
        return f"by params ({doc})" if doc else "by params"
    reads = []
    if "bottom" in cls.backward_reads:
        which = cls.backward_reads_bottoms
        reads.append("bottoms" if which is None else
                     "bottom " + ", ".join(str(k) for k in which))
    if "top" in cls.backward_reads:
        reads.append("top")
    return " and ".join(reads) or "nothing"


def _snake(type_name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", type_name).lower()


def param_messages(cls) -> tuple:
    """The LayerParameter fields ``cls`` takes its parameters from.

    >>> param_messages(LAYERS["BatchNorm"]), param_messages(LAYERS["SoftmaxWithLoss"])
    (('batch_norm_param',), ('loss_param', 'softmax_param'))
    """
    if cls.param_messages is not None:
        return tuple(cls.param_messages)
    fields = LayerParameter.DESCRIPTOR.fields_by_name
    for name in (_snake(cls.type), cls.type.lower()):  # inner_product_param, relu_param
        if f"{name}_param" in fields:
            return (f"{name}_param",)
    return ()


def _hooks(cls) -> tuple:
    found = []
    for hook in HOOKS:
        owner, base, name = (cls.memory, Layer.memory, hook[7:]) if hook.startswith(
            "memory.") else (cls, Layer, hook)
        value, default = getattr(owner, name), getattr(base, name)
        if value is not None and value is not default and value is not False:
            found.append(hook)
    return tuple(found)


def _summary(cls) -> str:
    doc = (cls.__doc__ or "").strip()
    return doc.split("\n\n")[0].replace("\n", " ") if doc else ""


def entry(cls) -> LayerEntry:
    """The catalogue entry of layer class ``cls``."""
    bottoms, tops, more = cls.num_bottoms, cls.num_tops, ""
    if cls.counts is not Layer.counts:  # counts that depend on the layer's parameters
        bottoms, tops = cls(LayerParameter(name=cls.type, type=cls.type)).counts()
        more = " (default params)"
    return LayerEntry(
        type=cls.type, caffe=cls.type in caffe_layer_types(),
        bottoms=_count(bottoms) + more, tops=_count(tops) + more,
        learnable_blobs=tuple(cls.param_blobs), state_blobs=not cls.learnable,
        in_place=bool(cls.in_place),
        backward_reads=_backward_reads(cls), param_messages=param_messages(cls),
        is_loss=bool(cls.is_loss), hooks=_hooks(cls), summary=_summary(cls),
    )


def catalogue(built_in: bool = False) -> list[LayerEntry]:
    """Every registered layer type, sorted by name; ``built_in``: only unroll's own (the
    README's table), not the types a user's or a test's module registered."""
    return [entry(LAYERS[name]) for name in sorted(LAYERS)
            if not built_in or LAYERS[name].__module__.startswith("unroll.")]


def as_json(entries=None) -> str:
    """The catalogue as JSON: a list of objects with the fields of :class:`LayerEntry`."""
    return json.dumps([asdict(e) for e in entries or catalogue()], indent=2)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(entries=None) -> str:
    """The catalogue as a Markdown table (the README's "Layers" section)."""
    rows = ["| type | Caffe | bottoms | tops | learnable blobs | in place | backward reads "
            "| parameters |",
            "|---|---|---|---|---|---|---|---|"]
    for e in entries or catalogue(built_in=True):
        learnable = "; ".join(e.learnable_blobs) or "none"
        if e.state_blobs:
            learnable += " (state, never updated by a solver)"
        rows.append("| " + " | ".join(_cell(c) for c in (
            f"`{e.type}`" + (" (loss)" if e.is_loss else ""),
            "yes" if e.caffe else "unroll only", e.bottoms, e.tops, learnable,
            "yes" if e.in_place else "no", e.backward_reads,
            ", ".join(f"`{m}`" for m in e.param_messages) or "none")) + " |")
    return "\n".join(rows) + "\n"


#: the lines that enclose the generated table in the README
README_BEGIN = ("<!-- the layer table: generated by `python -m unroll.tools.catalogue --readme "
                "README.md` -->")
README_END = "<!-- end of the layer table -->"


def readme_table(readme: str) -> str:
    """The generated table inside the text of a README (between :data:`README_BEGIN` and
    :data:`README_END`); a ValueError if the README has no such place."""
    start, end = readme.find(README_BEGIN), readme.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"the README has no layer table: no line {README_BEGIN!r} followed by "
                         f"{README_END!r}")
    return readme[start + len(README_BEGIN):end].strip("\n") + "\n"


def update_readme(path) -> bool:
    """Write the catalogue's table into the README at ``path``; True if it changed."""
    from pathlib import Path

    from unroll.core.atomic import write_atomic

    readme = Path(path).read_text()
    old = readme_table(readme)
    start = readme.index(README_BEGIN) + len(README_BEGIN)
    new = readme[:start] + "\n" + markdown() + readme[readme.index(README_END):]
    if new != readme:
        write_atomic(path, new.encode())
    return old != markdown()


def text(entries=None) -> str:
    """The catalogue as aligned text, one layer type a line (``unroll layers``)."""
    entries = entries or catalogue()
    header = ("TYPE", "CAFFE", "BOTTOMS", "TOPS", "IN PLACE", "BACKWARD READS", "PARAMETERS",
              "LEARNABLE BLOBS")
    rows = [header] + [(e.type, "yes" if e.caffe else "unroll", e.bottoms, e.tops,
                        "yes" if e.in_place else "no", e.backward_reads,
                        ",".join(e.param_messages) or "-",
                        "; ".join(b.split(" (")[0] for b in e.learnable_blobs) or "-")
                       for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]
                     for r in rows) + "\n"


def main(argv=None) -> int:
    """``python -m unroll.tools.catalogue [--markdown | --json | --readme README.md]``."""
    parser = argparse.ArgumentParser(prog="python -m unroll.tools.catalogue",
                                     description="Print every registered layer type.")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--markdown", action="store_true", help="the README's Markdown table")
    form.add_argument("--json", action="store_true", help="JSON, for tools")
    form.add_argument("--readme", metavar="README", help="rewrite the table inside README")
    args = parser.parse_args(argv)
    if args.readme:
        changed = update_readme(args.readme)
        print(f"{args.readme}: layer table {'updated' if changed else 'already current'}")
        return 0
    sys.stdout.write(markdown() if args.markdown else as_json() + "\n" if args.json else text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
