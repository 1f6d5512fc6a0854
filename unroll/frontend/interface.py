"""Template interfaces: reading the literal ``interface`` dict, and one checker per kind.

Every template declares ``{% set interface = {...} %}``; its ``"kind"`` says
what it renders (docs/design.md, 3. Unrolling) and picks its checker from
:data:`CHECKERS`: a ``step`` (one timestep), a ``net`` (a whole net), a
``module`` (layers without recurrence, applied by ``shared()``) or a
``tree_step`` (one level of nodes). Loading a template checks its interface,
so a mistake in it is one line naming the file, whatever later expands it.

>>> check_interface({"kind": "module", "inputs": ["x"], "outputs": []}, Path("t.j2"),
...                 frozenset({"module"}))
Traceback (most recent call last):
unroll.core.errors.TemplateError: t.j2: a module interface must declare 'outputs', a non-empty \
list of names, found []
"""

from __future__ import annotations

from pathlib import Path

from jinja2 import nodes

from unroll.core.errors import TemplateError

__all__ = ["CHECKERS", "CHILDREN", "KINDS", "check_interface", "read_interface"]

#: how a tree-step node reads its children: their messages summed, or their states by position
CHILDREN = ("sum", "positional")


def read_interface(tree: nodes.Template, path: Path) -> dict:
    """The literal dict a parsed template assigns to ``interface``."""
    for node in tree.find_all(nodes.Assign):
        if isinstance(node.target, nodes.Name) and node.target.name == "interface":
            try:
                interface = node.node.as_const()
            except nodes.Impossible:
                raise TemplateError(
                    f"{path.name}:{node.lineno}: 'interface' must be a literal dict"
                ) from None
            if not isinstance(interface, dict):
                raise TemplateError(f"{path.name}:{node.lineno}: 'interface' must be a dict")
            return interface
    raise TemplateError(f"{path.name}: declares no 'interface' ({{% set interface = {{...}} %}})")


def _names_list(interface: dict, key: str, path: Path) -> None:
    names = interface[key]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise TemplateError(f"{path.name}: interface '{key}' must be a list of names, "
                            f"found {names!r}")


def _check_static(interface: dict, path: Path) -> None:
    """A step's static inputs: each name -> its dims, each an int, a hyper-parameter or "N"."""
    static = interface.get("static", {})
    defaults = interface.get("defaults", {})
    if not isinstance(static, dict) or not all(
            isinstance(name, str) and isinstance(dims, list) and dims and all(
                (isinstance(d, int) and not isinstance(d, bool)) or d == "N" or d in defaults
                for d in dims) for name, dims in static.items()):
        raise TemplateError(
            f"{path.name}: interface 'static' must map each static input to its dims, each an "
            f"integer, a hyper-parameter (a key of 'defaults') or \"N\" (the batch), e.g. "
            f"{{\"memory\": [\"source_steps\", \"N\", \"hidden\"]}}, found {static!r}")
    both = sorted(set(static) & set(interface["inputs"]))
    if both:
        raise TemplateError(f"{path.name}: '{both[0]}' is declared both as a per-step input "
                            f"and as a static one")


def _check_step(interface: dict, path: Path, macros: frozenset) -> None:
    for key in ("inputs", "states", "outputs"):
        if key not in interface:
            raise TemplateError(f"{path.name}: a step interface must declare '{key}'")
    for key in ("inputs", "outputs"):
        _names_list(interface, key, path)
    states = interface["states"]
    if not isinstance(states, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in states.items()):
        raise TemplateError(
            f"{path.name}: interface 'states' must map each state to the hyper-parameter "
            f"giving its size, e.g. {{\"h\": \"hidden\"}}, found {states!r}"
        )
    _check_static(interface, path)
    for state, size_var in states.items():
        if size_var not in interface.get("defaults", {}):
            raise TemplateError(
                f"{path.name}: state '{state}' takes its size from '{size_var}', which is not "
                f"a hyper-parameter (a key of 'defaults')"
            )
    if "step" not in macros:
        raise TemplateError(f"{path.name}: a step template must define {{% macro step(s) %}}")


def _check_net(interface: dict, path: Path, macros: frozenset) -> None:
    """A net template renders its layers as it likes: only its defaults are checked."""


def _check_module(interface: dict, path: Path, macros: frozenset) -> None:
    if interface.get("states"):
        raise TemplateError(
            f"{path.name}: a module template has no states, found 'states': "
            f"{interface['states']!r}; a template that carries state from step to step is a "
            f"step template (\"kind\": \"step\"), unrolled with recurrent()"
        )
    for key in ("inputs", "outputs"):
        names = interface.get(key)
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise TemplateError(f"{path.name}: a module interface must declare '{key}', a "
                                f"non-empty list of names, found {names!r}")
    if "module" not in macros:
        raise TemplateError(f"{path.name}: a module template must define "
                            f"{{% macro module(s) %}}")


def _check_tree_step(interface: dict, path: Path, macros: frozenset) -> None:
    name = path.name
    for key in ("inputs", "states", "outputs", "children"):
        if key not in interface:
            raise TemplateError(f"{name}: a tree_step interface must declare '{key}'")
    children = interface["children"]
    if children not in CHILDREN:
        raise TemplateError(f"{name}: interface 'children' must be one of {CHILDREN}, found "
                            f"{children!r}")
    inputs = interface["inputs"]
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], str):
        raise TemplateError(f"{name}: a tree_step template reads one input per node: 'inputs' "
                            f"must be a list of one name, found {inputs!r}")
    defaults = interface.get("defaults", {})
    sized = {"states": interface["states"]}
    if children == "sum":
        sized["messages"] = interface.get("messages")
    for key, names in sized.items():
        if not isinstance(names, dict) or not names or not all(
                isinstance(k, str) and v in defaults for k, v in names.items()):
            raise TemplateError(
                f"{name}: interface '{key}' must map each name to the hyper-parameter giving "
                f"its size (a key of 'defaults'), e.g. {{\"h\": \"hidden\"}}, found {names!r}")
    outputs = interface["outputs"]
    if not isinstance(outputs, list) or not outputs or not all(isinstance(o, str)
                                                               for o in outputs):
        raise TemplateError(f"{name}: interface 'outputs' must be a non-empty list of names, "
                            f"found {outputs!r}")
    if children == "positional" and "arity" not in defaults:
        raise TemplateError(f"{name}: a positional tree_step template takes its child slots "
                            f"from the hyper-parameter 'arity': declare it in 'defaults'")
    needed = ("node", "edge") if children == "sum" else ("node",)
    for macro in needed:
        if macro not in macros:
            raise TemplateError(f"{name}: a tree_step template with children {children!r} must "
                                f"define {{% macro {macro}(s) %}}")


#: each template kind -> the checker of its interface (the interface dict, the file, the
#: names of the macros it defines)
CHECKERS = {"step": _check_step, "net": _check_net, "module": _check_module,
            "tree_step": _check_tree_step}
KINDS = tuple(CHECKERS)


def check_interface(interface: dict, path: Path, macros: frozenset) -> None:
    """Check a template's declared ``interface`` with the checker of its kind."""
    kind = interface.get("kind", "step")
    if kind not in CHECKERS:
        raise TemplateError(f"{path.name}: interface kind must be 'step', 'net', 'module' or "
                            f"'tree_step', found {kind!r}")
    if not isinstance(interface.get("defaults", {}), dict):
        raise TemplateError(f"{path.name}: interface 'defaults' must be a dict of "
                            f"hyper-parameters, found {interface['defaults']!r}")
    CHECKERS[kind](interface, path, macros)
