"""The errors unroll raises for bad nets, templates, files and data.

Each is a ``ValueError`` whose message names what is wrong and where (the
layer, template, file and line), so a command can print it as one line.
"""

__all__ = ["FileFormatError", "NetError", "TemplateError", "TreeError", "UngatedStateError"]


class NetError(ValueError):
    """A net that cannot be built or run: names the layer, blob and shapes involved."""


class MemoryBudgetError(NetError):
    """A memory budget that no plan of the net fits: ``smallest`` is the fewest bytes a plan
    found needs, a budget that works."""

    def __init__(self, message: str, smallest: int):
        self.smallest = smallest
        super().__init__(message)


class TemplateError(ValueError):
    """A template that cannot be expanded: names the template, line and offending name."""


class UngatedStateError(TemplateError):
    """A step template that reads a state before cont gates it: ``state`` names it."""

    def __init__(self, message: str, state: str):
        self.state = state
        super().__init__(message)


class FileFormatError(ValueError):
    """A file whose bytes are not what it should hold (a .caffemodel, a JSON file).

    >>> str(FileFormatError("w.caffemodel", "holds no layers"))
    'w.caffemodel: holds no layers'
    """

    def __init__(self, path, problem: str):
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")


class TreeError(ValueError):
    """A tree that is not one (several roots, a cycle, a head out of range): names it and
    the node."""
