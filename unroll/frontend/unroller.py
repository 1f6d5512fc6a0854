"""Expand step templates to T timesteps: one recurrent step in, an unrolled net out.

A **step template** (Jinja2, e.g. ``unroll/frontend/templates/rnn.prototxt.j2``) renders the
Caffe layers of ONE timestep; the unroller renders it once per step, with the
step's blob names, and wires the steps into an ordinary feed-forward
NetParameter whose steps share their params. A **net template** renders a whole
net and calls ``{{ recurrent(...) }}`` where it wants an unrolled recurrent
layer, and ``{{ shared(...) }}`` where it applies one **module template**
(layers without recurrence) to several inputs with one set of params. What a
template declares and what its macros receive is documented in one place,
:class:`~unroll.frontend.template.Step` (a module's: :class:`~unroll.frontend.template.Application`;
loading and checking templates is :mod:`unroll.frontend.template`); the options of an
unrolled layer and of ``shared()`` on :func:`expand`.

>>> import unroll
>>> net_param = unroll.expand("rnn", steps=3, batch=2, input_dim=4, hidden=5)
>>> unroll.Net(net_param).forward()["h"].shape
(3, 2, 5)
"""

from __future__ import annotations

import os
import re
from collections import Counter, OrderedDict
from pathlib import Path

from unroll.core.errors import TemplateError
from unroll.core.proto import NetParameter, PrototxtError, parse_text, to_text
from unroll.engine import hidden_nets
from unroll.engine.memory import GRADIENT_CHUNK
from unroll.frontend.builder import NetBuilder
from unroll.frontend.checks import check_net
from unroll.frontend.recurrence import ALIGNS, DIRECTIONS, LAYER_OPTIONS, recurrent
from unroll.frontend.render import RENDER_ERRORS, render_error
from unroll.frontend.render_limits import bounded_rendering
from unroll.frontend.shared import shared
from unroll.frontend.template import (
    SUFFIX,
    Application,
    BlobNames,
    Step,
    Template,
    builtin_template_dir,
    find_template,
    hyper_parameters,
    load_template,
    merge_hyper,
    template_search_path,
    unknown_error,
)
from unroll.frontend.tree_recurrence import tree, tree_net

__all__ = [
    "ALIGNS",
    "Application",
    "BlobNames",
    "DIRECTIONS",
    "Step",
    "Template",
    "builtin_template_dir",
    "expand",
    "find_template",
    "load_template",
    "template_search_path",
    "to_prototxt",
]

#: marks where a net template placed an unrolled block: its layers go there, unparsed
_BLOCK = re.compile(r"#@unroll:block:(\d+)")


# -- expand ---------------------------------------------------------------------------------


class _Calls:
    """What a net template calls to place blocks, bound to the builder they add to: a
    bound method, whose ``__self__`` the sandbox refuses, hands a template no builder."""

    def __init__(self, builder: NetBuilder):
        self._builder = builder

    def recurrent(self, *args, **kwargs) -> str:
        return recurrent(self._builder, *args, **kwargs)

    def shared(self, *args, **kwargs) -> str:
        return shared(self._builder, *args, **kwargs)

    def tree(self, *args, **kwargs) -> str:
        return tree(self._builder, *args, **kwargs)


def _step_inputs(template: Template, steps: int, batch: int, input_dim, sizes: dict) -> dict:
    """The Input tops of a step template expanded on its own: each per-step input
    (T, N, its input_dim: one for all, or a dict by input), each static input in its
    declared dims, and cont (T, N)."""
    inputs = template.interface["inputs"]
    dims = input_dim if isinstance(input_dim, dict) else dict.fromkeys(inputs, input_dim)
    unknown = sorted(set(dims) - set(inputs))
    missing = [n for n in inputs if n not in dims]
    if unknown or missing:
        raise TemplateError(
            f"{template.name}: input_dim= must give the size of each input {inputs}, "
            + (f"found no size for '{missing[0]}'" if missing else
               f"found '{unknown[0]}', which it does not read"))
    tops = {name: (steps, batch, int(dims[name])) for name in inputs}
    for name, spec in template.interface.get("static", {}).items():
        tops[name] = tuple(batch if d == "N" else int(sizes[d] if isinstance(d, str) else d)
                           for d in spec)
    tops["cont"] = (steps, batch)
    return tops


def _build(template: Template, steps: int, batch: int, search_path, variables: dict,
           hyper: dict | None, chunk: int | None) -> tuple[NetParameter, NetBuilder]:
    """The unrolled NetParameter of ``template`` and the builder that made it."""
    if template.kind == "tree_step":
        return tree_net(template, search_path, variables, hyper)
    builder = NetBuilder(steps, batch, search_path, chunk)
    if template.kind == "step":
        options = {k: variables.pop(k) for k in LAYER_OPTIONS if k in variables}
        unknown = set(variables) - set(template.defaults) - {"input_dim"}
        if unknown:
            raise unknown_error(template.name, unknown,
                                [*template.defaults, *LAYER_OPTIONS, "batch", "input_dim"])
        input_dim = variables.pop("input_dim", None)
        if input_dim is None:
            raise TemplateError(f"{template.name}: expanding a step template needs input_dim=")
        if options.get("sequence_output", True) is False and "align" not in options:
            raise TemplateError(
                f"{template.name}: sequence_output=False needs align='left' or align='right', "
                f"as the batches are padded (time_major(..., align=...)): it finds each "
                f"sequence's last step from cont and refuses batches padded otherwise"
            )
        sizes = hyper_parameters(template, merge_hyper(template.name, variables, hyper))
        tops = _step_inputs(template, steps, batch, input_dim, sizes)
        given = options.get("initial_state")
        if isinstance(given, dict):  # the blobs the states start from are inputs here
            states = template.interface["states"]
            tops.update((blob, (1, batch, int(sizes[states[state]])))
                        for state, blob in given.items()
                        if state in states and isinstance(blob, str) and blob not in tops)
        builder.input("input", tops)
        names = [*template.interface["inputs"], *template.interface.get("static", {})]
        recurrent(builder, str(template.path), {n: n for n in names}, "h", "cont", hyper=hyper,
                  **options, **variables)
        return builder.net_param(f"{template.name[: -len(SUFFIX)]}_T{steps}"), builder
    merged = hyper_parameters(template, merge_hyper(template.name, variables, hyper),
                              also=["batch"])
    calls = _Calls(builder)
    merged.update(T=builder.T, batch=batch, recurrent=calls.recurrent, shared=calls.shared,
                  tree=calls.tree)
    try:
        text = template.jinja.render(merged)
    except TemplateError:
        raise
    except RENDER_ERRORS as e:
        raise render_error(template, e) from None
    return _assemble(template, text, builder), builder


def _assemble(template: Template, text: str, builder: NetBuilder) -> NetParameter:
    """The net of a rendered net template, each recurrent() block's layers in its place."""
    net = NetParameter()
    pieces = _BLOCK.split(text)
    placed = Counter(int(i) for i in pieces[1::2])
    lost = [i for i in range(len(builder.blocks)) if placed[i] != 1]
    if lost:
        call = "shared" if lost[0] in builder.modules else "recurrent"
        raise TemplateError(
            f"{template.name}: {call}() block {lost[0]} is placed {placed[lost[0]]} times; "
            f"print each call's result once, where its layers go: {{{{ {call}(...) }}}}"
        )
    line = 0
    for i, piece in enumerate(pieces):
        if i % 2:
            net.layer.extend(builder.blocks[int(piece)])
            continue
        try:
            # leading newlines keep the parser's line numbers those of the rendered text
            part = parse_text("\n" * line + piece, NetParameter(), f"{template.name} (rendered)")
        except PrototxtError as e:
            raise TemplateError(str(e)) from None
        line += piece.count("\n")
        net.layer.extend(part.layer)
        part.ClearField("layer")
        net.MergeFrom(part)
    outer = Counter(t for lp in net.layer for t in lp.top if t not in lp.bottom)
    collisions = sorted(t for t, n in outer.items() if n > 1 and t in builder.produced)
    if collisions:
        raise TemplateError(
            f"{template.name}: blob name(s) {collisions} are made both by the template and by "
            f"a recurrent() or shared() block"
        )
    return net


#: (template, T, variables) -> (the template files it read, their state, the net serialized):
#: a bucketed model, a twin test model and a shape check ask for the same nets again
_EXPANDED: OrderedDict[str, tuple[tuple, tuple, bytes]] = OrderedDict()
_EXPANDED_BYTES = 32 << 20  # the oldest go first past this (a T = 100 tagger is ~170 KB)


def _plain(value) -> bool:
    """Whether ``value``'s repr says all of it (so that it can key the cache)."""
    if value is None or isinstance(value, (str, bool, int, float, Path)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _cache_key(template: Template, steps: int, batch: int, search_path, variables: dict,
               hyper: dict | None, chunk: int | None) -> str | None:
    given = (list(search_path), variables, hyper or {})
    if not _plain(given):
        return None
    return repr((str(template.path), int(steps), batch, chunk, [str(p) for p in search_path],
                 os.environ.get("UNROLL_TEMPLATE_PATH", ""), sorted(variables.items()),
                 sorted((hyper or {}).items())))


def _state(files, folders) -> tuple:
    """The modification times and sizes of ``files`` and of every template in ``folders``
    (what a template may import): a cached net is stale once one changes."""
    paths = set(files) | {p for d in folders if d.is_dir() for p in d.glob("*.j2")}
    stats = {p: p.stat() if p.exists() else None for p in paths}
    return tuple(sorted((str(p), st and (st.st_mtime_ns, st.st_size)) for p, st in stats.items()))


def expand(template, steps: int | None = None, search_path=(), hyper: dict | None = None,
           chunk: int | None = GRADIENT_CHUNK, **variables) -> NetParameter:
    """Unroll ``template`` (a built-in name or a path) to ``steps`` timesteps: the one way
    to expand a step, net or tree_step template.

    For a **step template** the result is a whole net: an Input layer making
    ``x`` (T, N, input_dim) and ``cont`` (T, N), the unrolled recurrence, and
    its output ``h`` (T, N, hidden). Variables: ``batch`` (N, default 1),
    ``input_dim``, the template's hyper-parameters, and the options below.
    A template declaring several inputs reads each from the input of its name,
    (T, N, its ``input_dim``: one size for all, or a dict by input); each static
    input is an input of its name in the dims the interface declares.
    For a **net template**, ``variables`` are ``batch`` and its
    hyper-parameters; it places unrolled layers with ``{{ recurrent(step,
    bottom, top, cont="cont", ...options, **hyper) }}``. A hyper-parameter
    whose name is taken (``layers``, ``steps``) goes in ``hyper`` (a dict). An
    unknown variable or option is an error that suggests the close one.

    The net is checked as it is unrolled, at ``steps``: it must build, and each
    step's states and outputs must come out (1, N, ...), so structure that
    depends on T (a Slice whose points the caller computes from T) works at
    every T it is valid for. Each (template, steps, variables) is expanded
    once: asked again, ``expand`` returns a copy of that net, until a template
    file it read (or one beside it, which it may import) changes.

    For a **tree_step template** there are no steps: ``widths=`` gives the
    nodes per level, and the net reads ``x`` (rows, ``input_dim``) level by
    level (:func:`~unroll.frontend.tree_unroller.expand_tree` says the rest; its options
    ``direction``, ``rows`` and ``fixed_arity`` are variables here). A net
    template places a tree layer with ``{{ tree(template, bottom, top, widths,
    rows=..., direction=..., **hyper) }}``.

    Options of an unrolled layer (``expand`` and ``recurrent()``):

    - ``direction``: "forward", "reverse" or "bidirectional" (the two
      directions' outputs concatenated on axis 2; params ``fw_*`` and ``bw_*``).
    - ``layers``: stack that many recurrent layers, each with its own params
      (``l0_*``, ``l1_*``).
    - ``scope``: a prefix for every blob, layer and param name.
    - ``sequence_output`` (default True): the output at every step, (T, N, ...).
      False: only each sequence's last output, (1, N, ...) (many-to-one; for
      the reverse direction, the output after reading back to its first step).
      Each column must then hold ONE sequence, padded as ``align`` says;
      the last step is found from ``cont``, and a batch padded otherwise is
      an error, not a wrong answer (only a padded one-token sequence looks
      alike either way, so ``align`` must say the truth). ``expand`` asks for
      ``align`` here.
    - ``align``: "right" (padding first, each sequence ends at step T-1:
      ``time_major(..., align="right")``) or "left" (padding after, the
      default of ``time_major``). Default "right" in ``recurrent()``.
    - ``expose_hidden``: the initial states ``<scope><state>_0`` become inputs
      to fill and the final ones outputs ``<scope><state>_T`` (truncated BPTT:
      :func:`~unroll.train.carry.carry_hidden` between chunks; ``cont_from_lengths(...,
      continues=True)`` so that a stream's next chunk carries on).
    - ``initial_state``: "zeros", or "learned": every sequence starts from a
      learned state, a (size,) param ``<scope><state>_init`` shared by all steps;
      or a dict giving each state a (1, N, size) blob to start from, made by a
      layer above the recurrence (an encoder's final states, ``enc_h_T``, with
      ``expose_hidden``) or, in ``expand``, an input of that name:
      ``initial_state={"h": "enc_h_T", "c": "enc_c_T"}``. The first step takes
      the given state whatever its cont (cont gates only a carried state); a
      sequence that starts later in a column starts from it too, and the
      gradient flows back into the blobs. One direction, one layer.
    - ``cont``, ``batch``, ``steps`` (``recurrent()`` only): the cont blob, and
      N and T of the bottom where they differ from the net's.

    ``chunk`` (every recurrence of the expansion): a sequence macro that maps
    each step on its own runs over chunks of that many steps, each right
    before its steps, where T is over it (None: once over the whole
    sequence). The caller's engine picks it; the default is this engine's
    weight-gradient chunk (``unroll.engine.memory.GRADIENT_CHUNK``), so
    that recomputed segments are cut between both (docs/design.md, 6. Memory).

    Shared modules (net templates): ``{{ shared(module, bottoms, tops,
    scope="", **hyper) }}`` applies a module template (``"kind": "module"``,
    see :class:`~unroll.frontend.template.Application`) to each of ``bottoms``, without
    recurrence: every application has its own blob and layer names and the
    same param names, so the net holds one set of params and backward sums
    every application's gradient into it (siamese towers, every level of a
    pyramid). ``bottoms`` and ``tops`` hold one entry per application: a blob
    name, or a list of names where the module declares several inputs or
    outputs. ``scope`` prefixes every name; each ``recurrent()`` and
    ``shared()`` call needs its own. The built-in ``siamese`` net applies the
    ``tower`` module to two inputs (nothing in it is recurrent: expand it
    with ``steps=1``).

    >>> from unroll.engine.net import Net
    >>> net = Net(expand("siamese", steps=1, batch=2, input_dim=3, hidden=4, embed=2))
    >>> [p.name for p in net.learnable_params][:4]
    ['tower_W_fc1', 'tower_b_fc1', 'tower_W_out', 'tower_b_out']

    >>> net_param = expand("lstm", steps=4, batch=2, input_dim=3, hidden=5)
    >>> [l.name for l in net_param.layer][:2]
    ['input', 'x_proj_seq']
    >>> expand("lstm", steps=4, input_dim=3, hiden=5)
    Traceback (most recent call last):
    ...
    unroll.core.errors.TemplateError: lstm.prototxt.j2: unknown variable 'hiden'; did you \
mean 'hidden'?
    """
    template = load_template(template, search_path)
    if template.kind == "module":
        raise TemplateError(
            f"{template.name} is a module template: a net template applies it to its inputs "
            f"with {{{{ shared(\"{template.name.removesuffix(SUFFIX)}\", bottoms, tops, ...) }}}} "
            f"(see the built-in siamese template)"
        )
    if template.kind == "tree_step":  # level by level: the widths say the net's size
        if steps not in (None, 1):
            raise TemplateError(f"{template.name}: a tree_step template runs over level widths "
                                f"(widths=...), not steps; found steps={steps!r}")
        steps, batch = 1, None
    elif steps is None:
        raise TemplateError(f"{template.name}: expanding a {template.kind} template needs "
                            f"steps=")
    else:
        batch = int(variables.pop("batch", 1))
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int)
                              or chunk < 1):
        raise TemplateError(f"{template.name}: chunk must be an integer >= 1 (steps) or None, "
                            f"found {chunk!r}")
    key = _cache_key(template, steps, batch, search_path, variables, hyper, chunk)
    cached = _EXPANDED.get(key) if key is not None else None
    if cached is not None and _state(*cached[0]) == cached[1]:
        _EXPANDED.move_to_end(key)
        return NetParameter.FromString(cached[2])
    with bounded_rendering():  # one budget for all the templates an expansion renders
        net, builder = _build(template, steps, batch, search_path, dict(variables), hyper,
                              chunk)
    check_net(template, net, builder, None if steps == 1 else lambda: _build(
        template, 1, batch, search_path, dict(variables), hyper, chunk))
    if key is not None:
        files = (template.path, *builder.loaded)
        sources = (files, {p.parent for p in files} | {builtin_template_dir()})
        _EXPANDED[key] = (sources, _state(*sources), net.SerializeToString())
        while sum(len(entry[2]) for entry in _EXPANDED.values()) > _EXPANDED_BYTES:
            _EXPANDED.popitem(last=False)
    return net


def to_prototxt(net_param: NetParameter, caffe: bool = False) -> str:
    """Prototxt text of a NetParameter, readable by unroll.Net.

    A net holding layer types BVLC Caffe lacks (``GRUUnit``, ``Scatter``, ...)
    starts with a comment naming them. ``caffe=True`` writes the net for real
    Caffe: those layers lowered to Caffe's own (:mod:`unroll.frontend.caffe_export`),
    or a NetError with one line per layer that Caffe cannot express.

    >>> text = to_prototxt(expand("gru", steps=2, input_dim=1, hidden=2), caffe=True)
    >>> 'type: "GRUUnit"' in text, 'type: "Sigmoid"' in text
    (False, True)
    """
    from unroll.frontend.caffe_export import caffe_header, export_for_caffe, unroll_only_header

    if caffe:
        lowered, notes = export_for_caffe(net_param)
        return caffe_header(notes) + to_text(lowered)
    return unroll_only_header(net_param) + to_text(net_param)


# Caffe's LSTM and RNN layers unroll their hidden nets with this expand; the engine may not
# import the frontend, so the frontend hands it over (see unroll.engine.hidden_nets)
hidden_nets.register_unroller(expand)
