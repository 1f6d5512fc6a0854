"""Rendering templates: the sandbox they run in, their macros, and the parse cache.

Templates render in Jinja2's sandbox under :mod:`unroll.frontend.render_limits`'
budget: a template computes names and sizes but reaches no Python object
beyond the values it is given, and neither runs for ever nor fills memory. A
mistake while rendering is one :class:`~unroll.core.errors.TemplateError`
naming the template's file and line (:func:`render_error`).

A step's text differs from the step before it only in names, so a step is
parsed once per **shape** (its text with each name replaced by its role) and
later steps of that shape get its layers renamed (:class:`ParseCache`), which
keeps expansion linear in T.

>>> from unroll.frontend.template import Step, load_template
>>> t = load_template("rnn")
>>> macros = run_module(t, {"hidden": 2, "weight_filler": "xavier", "bias_value": 0.0})
>>> s = Step("", 0, 1, cont="cont_t0", input={"x": "x_t0"}, prev={"h": "h_0"},
...          state={"h": "h_1"})
>>> [lp.type for lp in ParseCache().step_layers(t, macros, s, check=lambda layers: None)]
['Scale', 'InnerProduct', 'Eltwise', 'TanH']
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from pathlib import Path

import jinja2
from jinja2.exceptions import SecurityError

from unroll.core.errors import TemplateError
from unroll.core.proto import LayerParameter, NetParameter, PrototxtError, parse_text
from unroll.frontend.render_limits import BoundedEnvironment, RenderLimitError, bounded_rendering

__all__ = ["RENDER_ERRORS", "ParseCache", "environment", "macro_text", "parse_layers",
           "render_error", "render_macro", "run_module"]

#: what rendering raises for a template's own mistake (render_error words it): a bad
#: operation (``1 // 0``, ``10.0 ** 999``, ``'{0}'.format()``), one past the limits of
#: :mod:`unroll.frontend.render_limits`, or one that ran out of memory
RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, ArithmeticError, LookupError,
                 MemoryError, RecursionError)


def environment(path: Path, builtins: Path) -> jinja2.Environment:
    """The sandbox a template at ``path`` renders in: it imports from its own folder and
    from ``builtins`` (the built-in templates' folder)."""
    return BoundedEnvironment(
        loader=jinja2.FileSystemLoader([str(path.parent), str(builtins)]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _template_line(error: BaseException, path: Path) -> int | None:
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if frame.filename == str(path) or Path(frame.filename).name == path.name:
            return frame.lineno
    return getattr(error, "lineno", None)


def render_error(template, error: BaseException) -> TemplateError:
    """The TemplateError for ``error``, raised rendering ``template``: its file, line, cause."""
    line = _template_line(error, template.path)
    where = f"{template.name}:{line}" if line else template.name
    if isinstance(error, SecurityError):
        return TemplateError(f"{where}: refused by the template sandbox: {error}")
    if isinstance(error, RecursionError):
        return TemplateError(f"{where}: recursion too deep (a macro that calls itself without "
                             f"end?)")
    if isinstance(error, jinja2.UndefinedError):
        return TemplateError(f"{where}: undefined variable: {error.message}")
    if isinstance(error, RenderLimitError):
        return TemplateError(f"{where}: {error.message}")
    if isinstance(error, MemoryError):
        return TemplateError(f"{where}: out of memory (a value too large to make)")
    return TemplateError(f"{where}: {type(error).__name__}: {error}")


def run_module(template, hyper: dict):
    """``template`` run with ``hyper``: its macros, ready to render steps."""
    try:
        return template.jinja.make_module(hyper)
    except RENDER_ERRORS as e:
        if isinstance(e, TemplateError):
            raise
        raise render_error(template, e) from None


def macro_text(template, module, macro: str, s) -> str:
    """The text of ``macro`` of ``template`` (run as ``module``) for ``s``."""
    try:
        try:
            with bounded_rendering():
                text = str(getattr(module, macro)(s))
        except Exception:
            # a macro called from Python bypasses Jinja's traceback rewriting, which maps
            # the compiled code's lines back to the template's lines: do it here
            template.jinja.environment.handle_exception()
    except RENDER_ERRORS as e:
        if isinstance(e, TemplateError):
            raise
        raise render_error(template, e) from None
    return text


def parse_layers(text: str, origin: str) -> list:
    """The layers of rendered prototxt ``text``; a TemplateError naming ``origin``."""
    try:
        return list(parse_text(text, NetParameter(), origin).layer)
    except PrototxtError as e:
        raise TemplateError(f"rendered {e}") from None


def _origin(template, macro: str, s) -> str:
    return f"{template.name} ({macro}, t={s.t})" if s.t is not None else template.name


def render_macro(template, module, macro: str, s) -> list:
    """Render one macro of ``template`` (run as ``module``) for ``s``; parse its layers."""
    return parse_layers(macro_text(template, module, macro, s), _origin(template, macro, s))


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _shape_key(text: str, roles: dict) -> str:
    """``text`` with each quoted name that has a role replaced by ``\\0`` and its role."""
    pieces = _QUOTED.split(text)  # text, a quoted string's inside, text, ...
    pieces[1::2] = [f"\0{roles[v]}" if v in roles else f'"{v}"' for v in pieces[1::2]]
    return "".join(pieces)


def _names(lp: LayerParameter):
    yield lp.name
    yield from lp.bottom
    yield from lp.top
    for spec in lp.param:
        yield spec.name


@dataclass
class _Shape:
    """A step's parsed layers, reusable for every step whose text differs only in names."""

    layers: list
    roles: dict  # this step's name -> role
    reusable: bool

    @classmethod
    def of(cls, layers: list, text: str, roles: dict) -> _Shape:
        # reusable when every name in the text sits in a field renamed() rewrites
        in_text = sum(m[1] in roles for m in _QUOTED.finditer(text))
        in_fields = sum(v in roles for lp in layers for v in _names(lp))
        return cls(layers, roles, in_text == in_fields)

    def renamed(self, roles: dict) -> list:
        """The layers with the names of the step whose name -> role map is ``roles``."""
        real = {role: name for name, role in roles.items()}

        def rename(v):
            return real[self.roles[v]] if v in self.roles else v

        out = []
        for lp in self.layers:
            new = LayerParameter()
            new.CopyFrom(lp)
            new.name = rename(lp.name)
            new.bottom[:] = [rename(b) for b in lp.bottom]
            new.top[:] = [rename(t) for t in lp.top]
            for spec in new.param:
                spec.name = rename(spec.name)
            out.append(new)
        return out


class ParseCache:
    """The steps of one recurrence parsed once per shape (their text up to names)."""

    def __init__(self):
        self._shapes: dict[str, _Shape] = {}

    def step_layers(self, template, module, s, check) -> list:
        """The layers of step ``s``: its text parsed, or, where an earlier step rendered the
        same text up to its names, that step's layers given this step's names.

        ``check(layers)`` runs for each step but those renamed from a step of their shape it
        passed: the renaming is one to one (the shape's key marks every name by its role,
        literal names included, and a name of two roles is parsed), and a check compares
        names only, so it would pass again."""
        text = macro_text(template, module, "step", s)
        if s.ambiguous:
            return _checked(check, parse_layers(text, _origin(template, "step", s)))
        key = _shape_key(text, s.roles)
        shape = self._shapes.get(key)
        if shape is None:
            layers = _checked(check, parse_layers(text, _origin(template, "step", s)))
            self._shapes[key] = _Shape.of(layers, text, s.roles)
            return layers
        if not shape.reusable:
            return _checked(check, parse_layers(text, _origin(template, "step", s)))
        return shape.renamed(s.roles)


def _checked(check, layers: list) -> list:
    check(layers)
    return layers
