"""The examples use unroll as a user would: only public names, the ones a module lists.

A name is public when it is in ``unroll.__all__`` or in the ``__all__`` of the module it
is imported from (a module with no ``__all__`` exports nothing to the examples); a module
itself is public when its package is imported from and it has an ``__all__``. So the
examples show what a researcher's own model can do, and reach around nothing.
"""

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def unroll_imports():
    for path in sorted(EXAMPLES.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and (
                    node.module == "unroll" or node.module.startswith("unroll.")):
                for alias in node.names:
                    yield path.relative_to(EXAMPLES.parent), node.lineno, node.module, alias.name
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("unroll"):
                        yield path.relative_to(EXAMPLES.parent), node.lineno, alias.name, None


def public(module: str, name: str | None) -> bool:
    found = importlib.import_module(module)
    if name is None:  # `import unroll`
        return module == "unroll"
    if name in getattr(found, "__all__", ()):
        return True
    value = getattr(found, name, None)
    if value is None and importlib.util.find_spec(f"{module}.{name}") is not None:
        value = importlib.import_module(f"{module}.{name}")  # a module nothing imported yet
    return getattr(value, "__name__", "") == f"{module}.{name}" and hasattr(value, "__all__")


@pytest.mark.parametrize(("path", "line", "module", "name"), list(unroll_imports()),
                         ids=lambda v: str(v))
def test_examples_import_only_public_names(path, line, module, name):
    assert public(module, name), (
        f"{path}:{line} imports {name or module} from {module}, which does not list it in "
        f"__all__: make it public there (documented) or use what is")
