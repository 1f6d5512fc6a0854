"""Help text made from what unroll has, so a new built-in template shows up by itself."""

from __future__ import annotations

import argparse

__all__ = ["HelpParser", "builtin_template_lines"]

#: how the help names each kind of template the loader takes, in the order it lists them
KIND_WORDS = {
    "step": "step templates",
    "tree_step": "tree-step templates (expand --tree WIDTHS)",
    "net": "whole nets",
    "module": "shared modules (applied by nets)",
}


class HelpParser(argparse.ArgumentParser):
    """An ArgumentParser whose ``epilog`` may be a function, called only when the help is
    printed: listing the built-in templates loads each of them, which a run need not do."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def builtin_template_lines(kinds=None) -> str:
    """The built-in templates of ``kinds`` (default: all), one line per kind, read from the
    templates folder.

    >>> print(builtin_template_lines(["net"]))
    Built-in templates:
      whole nets: siamese, tagger
    """
    from unroll.testing.builtins import builtin_templates

    lines = ["Built-in templates:"]
    for kind in kinds or KIND_WORDS:
        names = builtin_templates(kind)
        if names:
            lines.append(f"  {KIND_WORDS[kind]}: {', '.join(names)}")
    return "\n".join(lines)
