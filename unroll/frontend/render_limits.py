"""Bounds on rendering a template: time, text and the size of the values it makes.

A template comes from a file that may not be trusted (a model folder's), and
Jinja2's sandbox stops it reaching Python objects but not from running for
ever or filling memory. Rendering here therefore runs under a **budget**: a
deadline and a number of characters of output, shared by every template
rendered while it is open (a net template and the step templates its
``recurrent()`` calls render). Loops check the deadline at every iteration and
output statements spend the characters, so neither nested loops nor a loop
that prints stop only when the machine does. Values are bounded before they
are made: ``'x' * 10**10``, ``10 ** (10**10)`` and ``'x'.center(10**10)`` are
refused, not allocated, and ``range()`` yields at most :data:`MAX_RANGE` items.

The defaults, :data:`DEFAULT_SECONDS` and :data:`DEFAULT_CHARS`, are far above
any real template; the environment variables ``UNROLL_TEMPLATE_SECONDS`` and
``UNROLL_TEMPLATE_CHARS`` change them, and :func:`bounded_rendering` sets them
for one block of code.

>>> env = BoundedEnvironment()
>>> with bounded_rendering(chars=1000):
...     env.from_string("{% for i in range(10**6) %}x{% endfor %}").render()
Traceback (most recent call last):
unroll.frontend.render_limits.RenderLimitError: range(1000000) has 1000000 items; the \
template sandbox allows at most 100000
>>> with bounded_rendering(chars=1000):
...     env.from_string("{% for i in range(5000) %}x{% endfor %}").render()
Traceback (most recent call last):
unroll.frontend.render_limits.RenderLimitError: the output passed the limit of 1000 characters \
(UNROLL_TEMPLATE_CHARS)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
import time
import types
from dataclasses import dataclass

import jinja2
from jinja2 import nodes
from jinja2.sandbox import SandboxedEnvironment

from unroll.core.errors import TemplateError

__all__ = [
    "CHARS_ENV",
    "DEFAULT_CHARS",
    "DEFAULT_SECONDS",
    "MAX_INT_BITS",
    "MAX_RANGE",
    "SECONDS_ENV",
    "BoundedEnvironment",
    "RenderLimitError",
    "RenderLimits",
    "bounded_rendering",
    "render_limits",
]

SECONDS_ENV = "UNROLL_TEMPLATE_SECONDS"
CHARS_ENV = "UNROLL_TEMPLATE_CHARS"
#: the time one expansion may spend rendering, in seconds
DEFAULT_SECONDS = 60.0
#: the characters one expansion may output (and the largest string or list a template may make)
DEFAULT_CHARS = 64 * 2**20
#: the most items one range() may yield (Jinja2's own sandbox bound)
MAX_RANGE = 100_000
#: the largest integer a template may compute, in bits (about 300,000 decimal digits)
MAX_INT_BITS = 2**20


class RenderLimitError(jinja2.TemplateError):
    """A template that went past a render limit: the limit, and how to change it."""


@dataclass(frozen=True)
class RenderLimits:
    """The time (seconds) and output (characters) one rendering budget allows."""

    seconds: float = DEFAULT_SECONDS
    chars: int = DEFAULT_CHARS


def _positive(name: str, convert, default):
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not value > 0 or not math.isfinite(value):
        raise TemplateError(f"{name} must be a positive number, found {text!r}")
    return value


def render_limits() -> RenderLimits:
    """The default limits: :data:`DEFAULT_SECONDS` and :data:`DEFAULT_CHARS`, unless the
    environment sets ``UNROLL_TEMPLATE_SECONDS`` or ``UNROLL_TEMPLATE_CHARS``.

    >>> render_limits() == RenderLimits(DEFAULT_SECONDS, DEFAULT_CHARS)
    True
    """
    return RenderLimits(_positive(SECONDS_ENV, float, DEFAULT_SECONDS),
                        _positive(CHARS_ENV, int, DEFAULT_CHARS))


class _Budget:
    def __init__(self, limits: RenderLimits):
        self.limits = limits
        self.deadline = time.monotonic() + limits.seconds
        self.chars_left = limits.chars

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise RenderLimitError(
                f"rendering ran past the limit of {self.limits.seconds:g} s ({SECONDS_ENV}); "
                f"a loop that runs too long?"
            )

    def spend(self, chars: int) -> None:
        self.chars_left -= chars
        if self.chars_left < 0:
            raise RenderLimitError(f"the output passed the limit of {self.limits.chars} "
                                   f"characters ({CHARS_ENV})")
        self.tick()


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "unroll_render_budget", default=None)


@contextlib.contextmanager
def bounded_rendering(seconds: float | None = None, chars: int | None = None):
    """Render the templates of this block under one budget of time and output.

    With no arguments, a block inside another one shares the outer budget (an
    expansion's nested renders count together); otherwise it opens a budget
    of its own, ``seconds`` and ``chars`` replacing the defaults of
    :func:`render_limits`. Going past a limit raises :class:`RenderLimitError`
    from inside the template, so the error names its line.

    >>> env = BoundedEnvironment()
    >>> with bounded_rendering(seconds=0.01):
    ...     env.from_string("{% for i in range(9) %}{% for j in range(99999) %}"
    ...                     "{% for k in range(99999) %}{% endfor %}{% endfor %}"
    ...                     "{% endfor %}").render()
    Traceback (most recent call last):
    unroll.frontend.render_limits.RenderLimitError: rendering ran past the limit of 0.01 s \
(UNROLL_TEMPLATE_SECONDS); a loop that runs too long?
    """
    if seconds is None and chars is None and _BUDGET.get() is not None:
        yield
        return
    defaults = render_limits()
    limits = RenderLimits(defaults.seconds if seconds is None else seconds,
                          defaults.chars if chars is None else chars)
    token = _BUDGET.set(_Budget(limits))
    try:
        yield
    finally:
        _BUDGET.reset(token)


class _Unbounded:
    # outside any block there is no deadline to keep and no output to count: the render
    # methods of the environment's templates open a block, so only a macro called from
    # Python outside one gets here (and is still bounded in the size of its values)
    def tick(self) -> None:
        pass

    def spend(self, chars: int) -> None:
        pass


def _budget() -> _Budget | _Unbounded:
    return _BUDGET.get() or _Unbounded()


def _max_chars() -> int:
    budget = _BUDGET.get()
    return budget.limits.chars if budget is not None else render_limits().chars


def _shown(value) -> str:
    # Python refuses to print an int of more than 4300 digits
    if isinstance(value, int) and value.bit_length() > 64:
        return f"{'-' if value < 0 else ''}~2**{value.bit_length() - 1}"
    return repr(value)


def _bounded_range(*args) -> range:
    items = range(*args)
    try:
        count = len(items)
    except OverflowError:  # more than 2**63 items
        count = None
    if count is None or count > MAX_RANGE:
        shown = ", ".join(_shown(a) for a in args)
        raise RenderLimitError(f"range({shown}) has {count or 'over 2**63'} items; the template "
                               f"sandbox allows at most {MAX_RANGE}")
    return items


@jinja2.pass_context  # evaluated at render time, never folded into a constant when compiling
def _iterations(context, iterable):
    budget = _budget()
    for item in iterable:
        budget.tick()
        yield item


@jinja2.pass_context
def _output(context, value) -> str:
    text = str(value)
    budget = _BUDGET.get()  # an output per name of every step: no call it can save
    if budget is not None:
        budget.spend(len(text))
    return text


@jinja2.pass_context
def _made(context, value):
    _check_size(len(value))
    return value


def _check_size(size: int) -> None:
    limit = _max_chars()
    if size > limit:
        raise RenderLimitError(f"a value of {size} items or characters passes the limit of "
                               f"{limit} ({CHARS_ENV})")


#: the methods the sandbox may wrap (``str.format``), judged value by value
_METHODS = (types.MethodType, types.BuiltinMethodType)
_WRAPPED = frozenset({"format", "format_map"})

#: str methods and filters whose result can be far larger than their inputs
_AMPLIFIERS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "replace", "indent",
                         "join"})


def _amplified_size(name: str, value, args, kwargs) -> int:
    """An upper bound of the length of ``value.name(*args, **kwargs)`` (or of filter
    ``name`` on ``value``), where the result can outgrow its inputs; else 0."""
    first = args[0] if args else None
    if name in ("center", "ljust", "rjust", "zfill"):
        width = kwargs.get("width", first)
        return width if isinstance(width, int) else 0
    if name == "expandtabs":
        tabsize = kwargs.get("tabsize", 8 if first is None else first)
        return len(str(value)) * tabsize if isinstance(tabsize, int) else 0
    if name == "replace" and len(args) >= 2 and isinstance(args[1], str):
        text, old = str(value), args[0]
        found = text.count(old) if isinstance(old, str) and old else len(text) + 1
        return len(text) + found * len(args[1])
    if name == "indent":
        width = kwargs.get("width", 4 if first is None else first)
        text = str(value)
        return len(text) + (text.count("\n") + 1) * (width if isinstance(width, int)
                                                      else len(str(width)))
    if name == "join":  # str.join(items) on the separator, or the filter join(items, d)
        items, sep = (first, value) if isinstance(value, str) else (value, kwargs.get("d", first))
        if isinstance(items, (list, tuple, range)):
            sep = sep if isinstance(sep, str) else ""
            return sum(len(i) if isinstance(i, str) else len(str(i)) for i in items) + (
                len(sep) * len(items))
    return 0


def _bounded_filter(name: str, original):
    # the value follows the context, eval context or environment a filter may take first
    skip = 1 if getattr(original, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(original)  # keeps jinja_pass_arg, so Jinja2 passes what it passed
    def bounded(*args, **kwargs):
        _check_size(_amplified_size(name, args[skip], args[skip + 1 :], kwargs))
        return original(*args, **kwargs)

    return bounded


def _int_bits(value) -> float:
    return abs(value).bit_length() if isinstance(value, int) else 0


def _check_binop(operator: str, left, right) -> None:
    sized = (str, list, tuple)
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, sized) and isinstance(times, int):
                _check_size(len(seq) * max(times, 0))
        bits = _int_bits(left) + _int_bits(right)
    elif operator == "**":
        exponent_ok = isinstance(right, int) and right > 0 and isinstance(left, int)
        bits = right * math.log2(abs(left)) if exponent_ok and abs(left) > 1 else 0
    else:  # "+"
        if isinstance(left, sized) and isinstance(right, sized):
            _check_size(len(left) + len(right))
        bits = 0
    if bits > MAX_INT_BITS:
        raise RenderLimitError(f"{_shown(left)} {operator} {_shown(right)} would have about "
                               f"{bits:.0f} bits; the template sandbox allows {MAX_INT_BITS}")


class _BoundedTemplate(jinja2.Template):
    def render(self, *args, **kwargs) -> str:
        with bounded_rendering():
            return super().render(*args, **kwargs)

    def make_module(self, vars=None, shared=False, locals=None):
        with bounded_rendering():
            try:
                return super().make_module(vars, shared, locals)
            except Exception:
                # as render() does, and make_module() does not: map the compiled code's
                # lines back to the template's, so that errors name the template's line
                self.environment.handle_exception()


class BoundedEnvironment(SandboxedEnvironment):
    """Jinja2's sandbox, with every loop, output, call and big operation under the budget.

    The bounds are put into the parsed template: each ``for`` iterates through
    a filter that checks the deadline, each output statement through one that
    spends characters, each ``~`` through one that checks the string's size.
    The sandbox routes calls and ``*``, ``**`` and ``+`` here, where the
    deadline and the sizes are checked before Python computes anything; the
    str methods and filters that can make a result far larger than their
    inputs (``center``, ``replace``, ``join``, ...) are checked the same way.
    """

    intercepted_binops = frozenset({"*", "**", "+"})
    template_class = _BoundedTemplate

    def __init__(self, **options):
        super().__init__(**options)
        self.globals["range"] = _bounded_range
        self.filters.update({name: _bounded_filter(name, self.filters[name])
                             for name in _AMPLIFIERS if name in self.filters})
        self.filters.update(unroll_iterations=_iterations, unroll_output=_output,
                            unroll_made=_made)
        self._safe_values: dict[tuple, bool] = {}

    def _parse(self, source, name, filename):
        # Jinja2 has no public hook between parsing and compiling; this one sees the
        # tree of every template the environment compiles, includes and imports too
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = _filtered(loop.iter, "unroll_iterations")
        for output in tree.find_all(nodes.Output):
            output.nodes = [_filtered(child, "unroll_output") for child in output.nodes]
        for parent in list(tree.find_all(nodes.Node)):
            for field, value in parent.iter_fields():
                if _grows(value):
                    setattr(parent, field, _filtered(value, "unroll_made"))
                elif isinstance(value, list):
                    value[:] = [_filtered(v, "unroll_made") if _grows(v) else v for v in value]
        return tree

    def getattr(self, obj, attribute):
        # the sandbox's verdict on an attribute whose value it does not wrap (a str.format)
        # depends on the attribute's name and the object's type alone: reached once per
        # (type, name), not at every ``s.prev.h`` and ``s.blob`` of every step
        try:
            value = getattr(obj, attribute)
        except AttributeError:
            return super().getattr(obj, attribute)
        if isinstance(value, _METHODS) and value.__name__ in _WRAPPED:
            return super().getattr(obj, attribute)
        key = (type(obj), attribute)
        safe = self._safe_values.get(key)
        if safe is None:
            safe = self._safe_values[key] = self.is_safe_attribute(obj, attribute, value)
        return value if safe else self.unsafe_undefined(obj, attribute)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: B902 (the sandbox's names)
        _budget().tick()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str) and getattr(__obj, "__name__", None) in _AMPLIFIERS:
            _check_size(_amplified_size(__obj.__name__, owner, args, kwargs))
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context, operator, left, right):
        _check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)


def _grows(node) -> bool:
    # a ``~`` of literals stays a literal (an interface dict may hold one)
    return isinstance(node, nodes.Concat) and not all(
        isinstance(n, (nodes.Const, nodes.TemplateData)) for n in node.nodes)


def _filtered(node: nodes.Expr, name: str) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)
