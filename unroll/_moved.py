"""The import paths of the flat layout (and of modules since split into packages), kept for
one release with a DeprecationWarning.

unroll's modules moved into sub-packages along the data flow (``unroll.net`` is
now ``unroll.engine.net``, ``unroll.unroller`` is ``unroll.frontend.unroller``,
...). A finder on ``sys.meta_path`` answers an old name with the module at its
new place, the same module object, so nothing is imported twice and a layer
type is never registered twice.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: the old dotted name of each moved module or package -> its new one
MOVED = {
    "unroll.errors": "unroll.core.errors",
    "unroll.atomic": "unroll.core.atomic",
    "unroll.proto": "unroll.core.proto",
    "unroll._generated": "unroll.core._generated",
    "unroll.backend": "unroll.engine.backend",
    "unroll.trace": "unroll.engine.trace",
    "unroll.kernels": "unroll.engine.kernels",
    "unroll.blob": "unroll.engine.blob",
    "unroll.fillers": "unroll.engine.fillers",
    "unroll.layer": "unroll.engine.layer",
    "unroll.layers": "unroll.engine.layers",
    "unroll.host_checks": "unroll.engine.host_checks",
    "unroll.param_store": "unroll.engine.param_store",
    "unroll.workspace": "unroll.engine.workspace",
    "unroll.net": "unroll.engine.net",
    "unroll.inspection": "unroll.engine.inspection",
    "unroll.cuda_graph": "unroll.engine.cuda_graph",
    "unroll.template": "unroll.frontend.template",
    "unroll.unroller": "unroll.frontend.unroller",
    "unroll.templates": "unroll.frontend.templates",
    "unroll.solver": "unroll.train.solver",
    "unroll.bucketing": "unroll.train.bucketing",
    "unroll.bucketed_model": "unroll.train.bucketed_model",
    "unroll.distributed": "unroll.train.distributed",
    "unroll.cli": "unroll.tools.cli",
    "unroll.draw": "unroll.tools.draw",
    "unroll.engine.memory_plan": "unroll.engine.memory",
}


def new_name(old: str) -> str | None:
    """The module's name now, for a name of the flat layout (or a submodule of one)."""
    for prefix, moved in MOVED.items():
        if old == prefix or old.startswith(prefix + "."):
            return moved + old[len(prefix):]
    return None


class _Loader(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # the module at its new place ran already; the import system set its __spec__ to
        # the old name's, which resources and pickling read: give it its own back
        module.__spec__ = self.spec


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds ``unroll.net`` (and the other old names) as the module at its new place."""

    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new}; the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        spec = importlib.util.spec_from_loader(fullname, _Loader(new),
                                               is_package=hasattr(module, "__path__"))
        return spec


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
