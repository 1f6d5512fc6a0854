"""Step templates: finding, loading and checking them, and the API their macros see.

A template is a Jinja2 file of Caffe prototxt that declares its interface in a
literal ``interface`` dict. What a step template's macros receive is
documented in one place, :class:`Step`. Templates render in Jinja2's sandbox:
a template computes names and sizes but reaches no Python object beyond the
values it is given, so loading a template from an untrusted file runs no code.

>>> t = load_template("rnn")
>>> t.kind, t.interface["states"]
('step', {'h': 'hidden'})
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2
from jinja2 import nodes

from unroll.core.errors import TemplateError
from unroll.frontend.interface import check_interface, read_interface
from unroll.frontend.render import environment

__all__ = [
    "SUFFIX",
    "Application",
    "BlobNames",
    "Step",
    "Template",
    "builtin_template_dir",
    "find_template",
    "hyper_parameters",
    "load_template",
    "merge_hyper",
    "template_search_path",
    "unknown_error",
]

SUFFIX = ".prototxt.j2"


# -- the template API ---------------------------------------------------------------


class BlobNames:
    """Read-only names by attribute (``s.prev.h``); a missing one is a template error."""

    def __init__(self, kind: str, names: dict):
        self._kind = kind
        self._names = dict(names)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._names[name]
        except KeyError:
            have = ", ".join(self._names) or "none"
            raise jinja2.UndefinedError(
                f"s.{self._kind} has no '{name}' (declared: {have})"
            ) from None

    def __repr__(self) -> str:
        return f"s.{self._kind}{self._names}"


class Step:
    """What a step template's macros receive as ``s``: the names of one step. The template API.

    A step template declares its interface in a literal dict and defines a
    ``step(s)`` macro, rendered once per timestep, and optionally a
    ``sequence(s)`` macro, rendered once over the whole (T, N, D) input
    before the recurrence (the input projection of Caffe's LSTM); where every
    layer it renders is an InnerProduct from axis 1 or later, which maps each
    timestep on its own, and T is over the chunk ``expand`` is given (``chunk=``,
    by default the engine's weight-gradient chunk, 32 steps), it is
    rendered once per chunk of that many steps instead, right before the
    chunk's steps (docs/design.md, 6. Memory)::

        {% set interface = {
            "kind": "step",
            "inputs": ["x"],                    # per-step inputs, cut from (T, N, ...) blobs
            "static": {"memory": ["source_steps", "N", "hidden"]},  # optional: read by every
                                                # step whole; its dims (hyper-parameters, ints, N)
            "states": {"h": "hidden"},          # recurrent state -> hyper-parameter giving its size
            "outputs": ["h"],                   # per-step outputs: a state, or s.output.NAME
            "defaults": {"hidden": none},       # every hyper-parameter; none means required
        } %}
        {% from "projection.j2" import input_projection %}
        {% macro sequence(s) %}{{ input_projection(s, hidden, "W_x", "b", "xavier") }}{% endmacro %}
        {% macro step(s) %}
        layer { name: "{{ s.layer('h_cont') }}" type: "Scale" scale_param { axis: 0 }
                bottom: "{{ s.prev.h }}" bottom: "{{ s.cont }}" top: "{{ s.blob('h_cont') }}" }
        ... layers reading s.input.x and s.blob('h_cont'), writing s.state.h ...
        {% endmacro %}

    Attributes (all blob names are strings; N is the batch):

    - ``t``: the timestep, 0 .. T-1 (``None`` in the sequence macro); ``T``: the step count
      (in the sequence macro: of the steps it covers);
      ``reverse``: True when the recurrence runs from T-1 down to 0.
    - ``input.NAME``: the step's (1, N, ...) slice of input NAME (in the sequence
      macro: the whole (T, N, ...) input); with a sequence macro, the slice of
      what it produced.
    - ``static.NAME``: static input NAME, the same whole blob at every step (and in the
      sequence macro), as Caffe's RecurrentLayer ``x_static``: an (N, ...) or (S, N, ...)
      blob such as an attention memory; its diff sums every step's gradient.
    - ``output.NAME``: the sequence macro must produce (T, N, ...) ``output.NAME``
      for every input; the step macro must produce every declared output that
      is not a state.
    - ``prev.NAME``: state NAME entering the step, (1, N, size); ``state.NAME``:
      the state the step must produce, (1, N, size).
    - ``cont``: (1, N), 0 where a sequence starts at this step, else 1.
    - ``blob(local)`` and ``layer(local)``: names for the step's own blobs and
      layers (they carry the step index); ``param(local)``: a param name shared
      by every step (it does not).

    Hyper-parameters are plain template variables. Expanding checks that each
    step reads every ``prev`` state, that ``cont`` reaches every state, that
    states come out (1, N, size) and outputs (1, N, ...), and that param names
    do not change with ``t`` (unless the interface says
    ``"params_vary_with_t": true``).

    >>> s = Step("fw_", t=2, T=5, cont="cont_t2", prev={"h": "fw_h_2"}, state={"h": "fw_h_3"})
    >>> s.blob("gates"), s.param("W"), s.prev.h
    ('fw_gates_t2', 'fw_W', 'fw_h_2')
    """

    def __init__(self, scope: str, t: int | None, T: int, reverse: bool = False,
                 cont: str | None = None, input=None, prev=None, state=None, output=None,
                 chunk: int | None = None, static=None):
        self.t = t
        self.T = T
        self.reverse = reverse
        self.cont = cont
        self._scope = scope
        # the sequence macro over a chunk of the steps (chunk c) names its layers _seq_c<c>
        self._suffix = (f"_t{t}" if t is not None else "_seq" if chunk is None
                        else f"_seq_c{chunk}")
        # every name handed out -> its role ("prev:h"), the same role in every step: lets the
        # unroller parse a step's text once and give later steps their own names
        self.roles: dict[str, str] = {} if cont is None else {cont: "cont"}
        self.ambiguous = False
        named = {"input": input, "prev": prev, "state": state, "output": output,
                 "static": static}
        for kind, names in named.items():
            for local, blob in (names or {}).items():
                self._role(blob, f"{kind}:{local}")
        self.input, self.prev, self.state, self.output, self.static = (
            BlobNames(kind, names or {}) for kind, names in named.items())

    def _role(self, name: str, role: str) -> str:
        if self.roles.setdefault(name, role) != role:
            self.ambiguous = True
        return name

    def blob(self, local: str) -> str:
        """This step's blob ``local``."""
        return self._role(f"{self._scope}{local}{self._suffix}", f"step:{local}")

    def layer(self, local: str) -> str:
        """This step's layer ``local``."""
        return self._role(f"{self._scope}{local}{self._suffix}", f"step:{local}")

    def param(self, local: str) -> str:
        """Param ``local``, one for every step."""
        return self._role(f"{self._scope}{local}", f"param:{local}")


class Application(Step):
    """What a module template's ``module(s)`` macro receives as ``s``: the names of one application.

    A **module template** is a stack of layers without recurrence that a net
    template applies to several inputs with ``{{ shared(...) }}``, one set of
    params for all of them (siamese towers, every level of a pyramid). It
    declares ``"kind": "module"``, its ``inputs`` and ``outputs`` (no
    ``states``) and ``defaults``, and defines ``module(s)``, rendered once per
    application::

        {% set interface = {"kind": "module", "inputs": ["x"], "outputs": ["y"],
                            "defaults": {"hidden": none}} %}
        {% macro module(s) %}
        layer { name: "{{ s.layer('fc') }}" type: "InnerProduct"
                bottom: "{{ s.input.x }}" top: "{{ s.output.y }}"
                param { name: "{{ s.param('W') }}" } param { name: "{{ s.param('b') }}" }
                inner_product_param { num_output: {{ hidden }} } }
        {% endmacro %}

    Attributes: ``index`` (this application, 0 .. count-1) and ``count``;
    ``input.NAME`` and ``output.NAME``, the blobs this application reads and
    must produce; ``blob(local)`` and ``layer(local)``, names carrying the
    index; ``param(local)``, a param name shared by every application (every
    param of a module must be named with it). A module has no time and no
    state: ``t``, ``T``, ``cont``, ``prev`` and ``state`` do not exist.

    >>> s = Application("tower_", 1, 2, input={"x": "right"}, output={"y": "right_feat"})
    >>> s.blob("fc"), s.param("W"), s.output.y
    ('tower_fc_1', 'tower_W', 'right_feat')
    """

    def __init__(self, scope: str, index: int, count: int, input=None, output=None):
        super().__init__(scope, None, count, input=input, output=output)
        # removed, not left None: a module template reading them is wrong, and would render
        # None into a blob name
        del self.t, self.T, self.reverse, self.cont, self.prev, self.state, self.static
        self.index = index
        self.count = count
        self._suffix = f"_{index}"

    def __getattr__(self, name):
        # reached only for attributes an application lacks, such as the step's it removed
        if name.startswith("_"):
            raise AttributeError(name)
        raise jinja2.UndefinedError(
            f"s.{name}: a module's s has no '{name}' (a module has no time and no state; "
            f"it has index, count, input, output, blob(), layer() and param())"
        )


# -- finding and loading templates ----------------------------------------------------


def builtin_template_dir() -> Path:
    """The folder of the templates shipped with unroll."""
    return Path(str(resources.files("unroll.frontend.templates")))


def template_search_path(extra=()) -> list[Path]:
    """Where template names are looked up: ``extra``, then $UNROLL_TEMPLATE_PATH, then built-ins."""
    env = [p for p in os.environ.get("UNROLL_TEMPLATE_PATH", "").split(os.pathsep) if p]
    return [Path(p) for p in (*extra, *env)] + [builtin_template_dir()]


def find_template(template, search_path=()) -> Path:
    """The file of ``template``: a path to a file, or a name like "lstm" on the search path."""
    path = Path(template)
    if path.is_file():
        return path
    dirs = template_search_path(search_path)
    for d in dirs:
        for candidate in (d / f"{template}{SUFFIX}", d / str(template)):
            if candidate.is_file():
                return candidate
    names = sorted(p.name[: -len(SUFFIX)] for d in dirs if d.is_dir() for p in d.glob(f"*{SUFFIX}"))
    raise TemplateError(f"no template '{template}' (a file, or one of: {', '.join(names)})")


@dataclass
class Template:
    """A loaded template: its file, its declared interface and its compiled Jinja2 form."""

    path: Path
    interface: dict
    jinja: jinja2.Template
    macros: frozenset

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def kind(self) -> str:
        return self.interface.get("kind", "step")

    @property
    def defaults(self) -> dict:
        return self.interface.get("defaults", {})

    def __repr__(self) -> str:
        return (f"Template({self.name!r}, kind={self.kind!r}, "
                f"variables={sorted(self.defaults)}, path='{self.path}')")


def _parse(source: str, path: Path, env: jinja2.Environment) -> nodes.Template:
    try:
        return env.parse(source, path.name, str(path))
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"{path.name}:{e.lineno}: template syntax error: {e.message}") from None


def load_template(template, search_path=()) -> Template:
    """Find, parse and check a template by name or path (cached while the file is unchanged)."""
    path = find_template(template, search_path).resolve()
    return _load(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _load(path: Path, mtime_ns: int) -> Template:
    # a bucketed model expands the same templates once per bucket length
    env = environment(path, builtin_template_dir())
    try:
        source = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TemplateError(f"{path.name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    tree = _parse(source, path, env)
    interface = read_interface(tree, path)
    macros = frozenset(m.name for m in tree.find_all(nodes.Macro))
    check_interface(interface, path, macros)
    return Template(path, interface, env.get_template(path.name), macros)


def unknown_error(what: str, unknown, known) -> TemplateError:
    """The error for ``unknown`` keys, suggesting the closest of ``known``.

    >>> print(unknown_error("lstm.prototxt.j2", {"hiden"}, ["hidden", "weight_filler"]))
    lstm.prototxt.j2: unknown variable 'hiden'; did you mean 'hidden'?
    """
    name = sorted(unknown)[0]
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f" (known: {', '.join(sorted(known))})"
    return TemplateError(f"{what}: unknown {'variable' if len(unknown) == 1 else 'variables'} "
                         f"{', '.join(repr(u) for u in sorted(unknown))}{hint}")


def hyper_parameters(template: Template, variables: dict, also=()) -> dict:
    """Hyper-parameters: declared defaults, overridden by ``variables``; every key checked.

    ``also`` names the other keys the caller accepts, for the did-you-mean hint.
    """
    defaults = template.defaults
    unknown = set(variables) - set(defaults)
    if unknown:
        raise unknown_error(template.name, unknown, [*defaults, *also])
    merged = {**defaults, **variables}
    missing = [k for k, v in merged.items() if v is None]
    if missing:
        raise TemplateError(
            f"{template.name}: hyper-parameter(s) {', '.join(sorted(missing))} must be given "
            f"(e.g. --set {sorted(missing)[0]}=...)"
        )
    return merged


def merge_hyper(what: str, keywords: dict, hyper: dict | None) -> dict:
    """Keyword hyper-parameters and an explicit ``hyper`` dict, which may not overlap.

    >>> merge_hyper("recurrent('cell')", {"hidden": 8}, {"layers": 3})
    {'hidden': 8, 'layers': 3}
    """
    hyper = dict(hyper or {})
    both = sorted(set(keywords) & set(hyper))
    if both:
        raise TemplateError(f"{what}: {', '.join(both)} given both as a keyword and in hyper=")
    return {**keywords, **hyper}
