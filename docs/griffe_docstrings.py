"""A griffe extension: unroll's reST docstrings read as Markdown on the API page.

The docstrings are written for ``help()`` and doctest: a doctest run (``>>>`` and its
output, to the next blank line) and a reST literal block (a line ending ``::``, then
indented lines) become fenced code, ``:role:`name``` becomes ```name```, so Markdown
neither reflows them nor reads ``['W', 'b']`` as a link.
"""

from __future__ import annotations

import re

import griffe


def markdown(text: str) -> str:
    """``text`` (a cleaned docstring) with its doctests and literal blocks fenced."""
    out, doctest, literal = [], False, None
    for line in text.splitlines():
        if doctest and not line.strip():
            out.append("```")
            doctest = False
        if literal is not None and line.strip() and not line.startswith(literal):
            out += ["```", ""]
            literal = None
        if literal is not None:
            out.append(line[len(literal):])
            continue
        if not doctest and line.lstrip().startswith(">>> "):
            out += ["", "```pycon"]
            doctest = True
        if doctest:
            out.append(line.strip() if line.lstrip().startswith((">>>", "...")) else line)
            continue
        if line.endswith("::") and not line.strip().startswith(".."):
            out += [re.sub(r"::$", ":", line), "", "```text"]
            literal = " " * (len(line) - len(line.lstrip()) + 4)
            continue
        out.append(re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", line))
    if doctest or literal is not None:
        out.append("```")
    return "\n".join(out).replace("\n```text\n\n", "\n```text\n")


class ReSTAsMarkdown(griffe.Extension):
    """Rewrite every docstring griffe loads with :func:`markdown`."""

    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
