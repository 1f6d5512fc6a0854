"""The package's layout is its data flow: imports run one way, old paths still work.

docs/design.md, 1. Layout: core <- graph <- engine <- frontend <- train <- testing <- tools.
A module may import from its own package and from those before it, never from one after
it, not even inside a function: that is what keeps each part usable and testable alone.
"""

import ast
import importlib
import warnings
from pathlib import Path

import pytest

import unroll
from unroll import _moved

ROOT = Path(unroll.__file__).parent
#: the packages in data-flow order: each may import the ones before it
ORDER = ("core", "graph", "engine", "frontend", "train", "testing", "tools")


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "unroll" and parts[1] in ORDER else None


def modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        if package_of(name) and "_generated" not in name:
            yield name, path


def imports(path: Path, name: str):
    """Every module ``path`` imports, at the top or inside a function: (line, module)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module
            yield node.lineno, target
            for alias in node.names:  # `from unroll.engine import net` imports unroll.engine.net
                yield node.lineno, f"{target}.{alias.name}"


def module_level_imports(path: Path, name: str):
    """The modules ``path`` imports when it is itself imported: (line, module), leaving out
    imports inside functions and classes, which run only when called, and those under
    ``if TYPE_CHECKING:``, which never run."""
    tree = ast.parse(path.read_text())
    top = []
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING",
                                                                  "typing.TYPE_CHECKING"):
            stack.extend(node.orelse)
            continue
        top.append(node)
        for field in ("body", "orelse", "finalbody", "handlers"):
            stack.extend(getattr(node, field, []))
    wanted = {id(node) for node in top}
    lines = {node.lineno for node in top if isinstance(node, (ast.Import, ast.ImportFrom))
             and id(node) in wanted}
    for line, target in imports(path, name):
        if line in lines:
            yield line, target


def import_cycle(graph: dict) -> list:
    """One cycle of ``graph`` (module -> the modules it imports), as a path that ends where
    it starts, or [] where there is none."""
    done, on_path = set(), []

    def visit(node):
        if node in on_path:
            return on_path[on_path.index(node):] + [node]
        if node in done:
            return []
        on_path.append(node)
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt)
            if found:
                return found
        on_path.pop()
        done.add(node)
        return []

    for node in sorted(graph):
        found = visit(node)
        if found:
            return found
    return []


def test_imports_for_type_checking_alone_are_no_cycle(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nimport os\nif TYPE_CHECKING:\n"
                      "    import json\n")
    assert [target for _, target in module_level_imports(module, "m")] == ["typing",
                                                                           "typing.TYPE_CHECKING",
                                                                           "os"]


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("package", ORDER)
def test_no_import_cycle_inside_a_package(package):
    """A module-level import cycle among one package's modules makes what loads first depend
    on who imports first; the modules of a package import one way too."""
    found = dict(modules())
    own = {name for name in found if package_of(name) == package}
    # importing a submodule runs its package's __init__ first, whoever imports it: an
    # edge into a package's __init__ is no cycle of the modules
    packages = {name for name in own if found[name].name == "__init__.py"}
    graph = {name: {target for _, target in module_level_imports(found[name], name)
                    if target in own and target not in packages and target != name}
             for name in own}
    cycle = import_cycle(graph)
    assert not cycle, f"a module-level import cycle in unroll.{package}: {' -> '.join(cycle)}"


def test_every_module_lies_in_a_package_of_the_data_flow():
    flat = sorted(p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "_moved.py"))
    assert not flat, f"modules outside the packages {ORDER}: {flat}"


@pytest.mark.parametrize(("name", "path"), list(modules()), ids=lambda v: str(v))
def test_imports_run_one_way(name, path):
    own = ORDER.index(package_of(name))
    upward = []
    for line, target in imports(path, name):
        if target == "unroll" or target.startswith("unroll._moved"):
            upward.append(f"line {line}: {target} (the package root: import from where it lives)")
            continue
        other = package_of(target)
        if other is not None and ORDER.index(other) > own:
            upward.append(f"line {line}: {target}")
    assert not upward, (f"{path.relative_to(ROOT.parent)} ({package_of(name)}) imports from "
                        f"packages after it: " + "; ".join(upward))


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_import_path_gives_the_module_at_its_new_place_with_a_warning(old):
    new = importlib.import_module(_moved.MOVED[old])
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {_moved.MOVED[old]}"):
        found = importlib.import_module(old)
    assert found is new


def test_a_submodule_of_an_old_package_is_the_same_module():
    from unroll.engine.layers import embed

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("unroll.layers.embed")
    assert old is embed


def test_the_public_names_of_unroll_build_nets_with_caffe_recurrent_layers():
    net = unroll.Net('''
      layer { name: "in" type: "Input" top: "x" top: "cont"
              input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } } }
      layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
              recurrent_param { num_output: 5 } }''')
    assert net.forward()["h"].shape == (3, 2, 5)


TESTS = Path(__file__).parent
#: test folders beside the packages': a layer's tests sit with the engine, the examples' apart
EXTRA_TEST_FOLDERS = {"engine/layers", "examples"}


def test_the_tests_mirror_the_packages():
    """docs/design.md, 9. Tests: a package's tests lie in the folder of its name."""
    folders = {str(p.parent.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")}
    stray = sorted(folders - set(ORDER) - EXTRA_TEST_FOLDERS - {"."})
    assert not stray, f"test folders that mirror no package of {ORDER}: {stray}"
    loose = sorted(p.name for p in TESTS.glob("test_*.py") if p.name != "test_layout.py")
    assert not loose, f"tests outside a package's folder: {loose}"
    missing = sorted(set(ORDER) - folders)
    assert not missing, f"packages with no test folder: {missing}"
