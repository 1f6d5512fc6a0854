"""The templates unroll ships, read from its templates folder: what a test parametrizes over.

A test that lists the built-in cells by hand silently skips a cell added later;
one that takes them from :func:`builtin_templates` covers it the day it lands.
"""

from __future__ import annotations

from unroll.frontend.template import SUFFIX, builtin_template_dir, load_template

__all__ = ["builtin_templates"]


def builtin_templates(kind: str | None = None) -> list[str]:
    """The names of the built-in templates of ``kind`` ("step", "tree_step", "net",
    "module"; every kind without one), sorted, as ``expand`` takes them.

    >>> builtin_templates("step")[:3]
    ['gru', 'gru_primitive', 'lstm']
    >>> "tagger" in builtin_templates("net")
    True
    """
    # by path: a template of the same name on $UNROLL_TEMPLATE_PATH would shadow the name
    paths = sorted(builtin_template_dir().glob(f"*{SUFFIX}"))
    return [p.name[: -len(SUFFIX)] for p in paths if kind is None or load_template(p).kind == kind]
