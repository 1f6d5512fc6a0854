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
from dataclasses import dataclass, field
from pathlib import Path

from unroll.core.errors import NetError, TemplateError, UngatedStateError
from unroll.core.proto import LayerParameter, NetParameter, PrototxtError, parse_text, to_text
from unroll.engine import hidden_nets
from unroll.engine.memory import GRADIENT_CHUNK
from unroll.frontend.render_limits import bounded_rendering
from unroll.frontend.template import (
    RENDER_ERRORS,
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
    render_error,
    template_search_path,
    unknown_error,
)

__all__ = [
    "ALIGNS",
    "Application",
    "BlobNames",
    "DIRECTIONS",
    "NetBuilder",
    "Step",
    "Template",
    "builtin_template_dir",
    "carry_hidden",
    "expand",
    "find_template",
    "load_template",
    "template_search_path",
    "to_prototxt",
]

DIRECTIONS = ("forward", "reverse", "bidirectional")
ALIGNS = ("left", "right")
INITIAL_STATES = ("zeros", "learned")
#: the options of an unrolled layer that expand() takes beside a step template's variables
LAYER_OPTIONS = ("direction", "layers", "scope", "expose_hidden", "sequence_output", "align",
                 "initial_state")
#: everything recurrent() takes besides the template's hyper-parameters
RECURRENT_OPTIONS = ("cont", *LAYER_OPTIONS, "batch", "steps", "hyper")
#: everything shared() takes besides the module template's hyper-parameters
SHARED_OPTIONS = ("scope", "hyper")
#: marks where a net template placed an unrolled block: its layers go there, unparsed
_BLOCK = re.compile(r"#@unroll:block:(\d+)")


# -- unrolling ----------------------------------------------------------------------------


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


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


def _names(lp: LayerParameter):
    yield lp.name
    yield from lp.bottom
    yield from lp.top
    for spec in lp.param:
        yield spec.name


@dataclass
class _Direction:
    """One direction of one recurrent layer: what it reads, writes and how."""

    template: Template
    hyper: dict
    bottom: str
    top: str
    cont: str
    reverse: bool
    scope: str
    T: int
    N: int
    expose_hidden: bool
    sequence_output: bool
    align: str
    learned_init: bool
    given_init: dict = field(default_factory=dict)  # state -> the blob it starts from
    states: dict = field(default_factory=dict)  # state -> size
    module: object = None  # the template run with hyper
    shapes: dict = field(default_factory=dict)  # step text up to names -> _Shape
    #: run step index -> layers of the sequence macro over a chunk, added right before it
    pending: dict = field(default_factory=dict)

    @property
    def order(self) -> range:
        return range(self.T - 1, -1, -1) if self.reverse else range(self.T)

    def where(self, t=None) -> str:
        return self.template.name if t is None else f"{self.template.name} (step t={t})"


class NetBuilder:
    """Collects the layers of an unrolled net and checks names as it goes.

    The unroller adds glue (input slicing, output concatenation, initial
    states) as protobuf messages, and step layers as rendered and parsed
    templates; :meth:`net_param` assembles them into one ordinary NetParameter.
    """

    def __init__(self, steps: int, batch: int, search_path=()):
        if steps < 1:
            raise TemplateError(f"steps must be >= 1, found {steps}")
        self.T = int(steps)
        self.batch = int(batch)
        self.search_path = tuple(search_path)
        self.layers: list[LayerParameter] = []
        self.blocks: list[list[LayerParameter]] = []  # the layers of each recurrent() call
        self.produced: dict[str, str] = {}  # blob name -> who produced it
        self.consumed: set[str] = set()
        #: (where, blob, expected shape with None for any size, what) for the shape check
        self.declared: list[tuple[str, str, tuple, str]] = []
        self._sliced: dict[str, list[str]] = {}
        self._scopes: set[str] = set()
        #: block index of each shared() call -> (module template name, its layers)
        self.modules: dict[int, tuple[str, list[LayerParameter]]] = {}
        #: the files of the templates recurrent() and shared() loaded
        self.loaded: set[Path] = set()
        #: (where, state, blob) for each state a recurrent layer starts from a given blob
        self.initial_blobs: list[tuple[str, str, str]] = []

    def net_param(self, name: str = "") -> NetParameter:
        net = NetParameter(name=name)
        net.layer.extend(self.layers)
        return net

    # -- glue layers ---------------------------------------------------------
    def add_layer(self, lp: LayerParameter, origin: str) -> None:
        for top in lp.top:
            if top in self.produced and top not in lp.bottom:
                raise TemplateError(
                    f"{origin}: blob '{top}' is already produced by {self.produced[top]}; "
                    f"blob names must be unique across steps"
                )
            self.produced.setdefault(top, origin)
        self.consumed.update(lp.bottom)
        self.layers.append(lp)

    def input(self, name: str, tops: dict) -> None:
        """An Input layer with ``tops`` = {blob name: shape}."""
        lp = LayerParameter(name=name, type="Input", top=list(tops))
        for shape in tops.values():
            lp.input_param.shape.add().dim.extend(shape)
        self.add_layer(lp, f"layer '{name}'")

    def slice_steps(self, blob: str, steps: int) -> list[str]:
        """Names of ``blob`` cut into ``steps`` steps along axis 0 (one Slice per blob, reused)."""
        if blob not in self._sliced:
            names = [f"{blob}_t{t}" for t in range(steps)]
            lp = LayerParameter(name=f"{blob}_slice", type="Slice", bottom=[blob], top=names)
            lp.slice_param.axis = 0
            self.add_layer(lp, f"layer '{lp.name}'")
            self._sliced[blob] = names
        return self._sliced[blob]

    def concat(self, name: str, bottoms: list[str], top: str, axis: int) -> None:
        lp = LayerParameter(name=name, type="Concat", bottom=bottoms, top=[top])
        lp.concat_param.axis = axis
        self.add_layer(lp, f"layer '{name}'")

    # -- rendering -------------------------------------------------------------
    @staticmethod
    def module(template: Template, hyper: dict):
        """``template`` run with ``hyper``: its macros, ready to render steps."""
        try:
            return template.jinja.make_module(hyper)
        except RENDER_ERRORS as e:
            if isinstance(e, TemplateError):
                raise
            raise render_error(template, e) from None

    def render(self, template: Template, module, macro: str, s: Step) -> list:
        """Render one macro of ``template`` (run as ``module``) for ``s``; parse its layers."""
        return self._parse(template, macro, s, self._text(template, module, macro, s))

    @staticmethod
    def _text(template: Template, module, macro: str, s: Step) -> str:
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

    @staticmethod
    def _parse(template: Template, macro: str, s: Step, text: str) -> list:
        origin = f"{template.name} ({macro}, t={s.t})" if s.t is not None else template.name
        return NetBuilder._parse_layers(text, origin)

    @staticmethod
    def _parse_layers(text: str, origin: str) -> list:
        """The layers of rendered prototxt ``text``; a TemplateError naming ``origin``."""
        try:
            return list(parse_text(text, NetParameter(), origin).layer)
        except PrototxtError as e:
            raise TemplateError(f"rendered {e}") from None

    def _step_layers(self, d: _Direction, s: Step) -> list:
        """The layers of step ``s``: its text parsed, or, where an earlier step rendered the
        same text up to its names, that step's layers given this step's names."""
        text = self._text(d.template, d.module, "step", s)
        if s.ambiguous:
            return self._parse(d.template, "step", s, text)
        key = _QUOTED.sub(lambda m: "\0" + s.roles.get(m[1], m[0]), text)
        shape = d.shapes.get(key)
        if shape is None:
            layers = self._parse(d.template, "step", s, text)
            d.shapes[key] = _Shape.of(layers, text, s.roles)
            return layers
        return shape.renamed(s.roles) if shape.reusable else self._parse(
            d.template, "step", s, text)

    def recurrent(self, step, bottom: str, top: str, cont: str = "cont", *,
                  direction: str = "forward", layers: int = 1, scope: str = "",
                  expose_hidden: bool = False, sequence_output: bool = True,
                  align: str = "right", initial_state="zeros", batch: int | None = None,
                  steps: int | None = None, hyper: dict | None = None, **more_hyper) -> str:
        """Unroll step template ``step`` over ``bottom`` (T, N, D) into ``top`` (T, N, ...).

        Called from net templates as ``{{ recurrent("lstm", "emb", "h", hidden=128) }}``;
        returns a marker that :func:`expand` replaces with the unrolled layers,
        so they go where the call is printed. ``cont`` names the
        (T, N) cont blob; ``batch`` and ``steps`` are N and T of ``bottom``
        where they differ from the net's; ``initial_state`` may give each state
        a blob made above the call, ``initial_state={"h": "enc_h_T", "c":
        "enc_c_T"}``. The other options are described in
        :func:`expand`. The step template's hyper-parameters are the other
        keywords, or ``hyper={...}`` for one whose name is an option (``layers``).
        """
        template = load_template(step, self.search_path)
        self.loaded.add(template.path)
        what = f"recurrent({Path(str(step)).name!r})"
        if template.kind != "step":
            raise TemplateError(f"{what}: '{step}' is a {template.kind} template, not a step")
        for option, value, allowed in (("direction", direction, DIRECTIONS),
                                       ("align", align, ALIGNS),
                                       ("initial_state", "zeros" if isinstance(
                                           initial_state, dict) else initial_state,
                                        INITIAL_STATES)):
            if value not in allowed:
                raise TemplateError(f"{what}: {option} must be one of {allowed}, found {value!r}")
        if expose_hidden and direction != "forward":
            raise TemplateError(
                f"{what}: expose_hidden carries state forward in time; it needs "
                f"direction='forward', found {direction!r}"
            )
        if not isinstance(layers, int) or layers < 1:
            raise TemplateError(f"{what}: layers must be an integer >= 1, found {layers!r}")
        if initial_state == "learned" and expose_hidden:
            raise TemplateError(
                f"{what}: a learned initial state and expose_hidden (a carried one) exclude "
                f"each other"
            )
        hyper = hyper_parameters(template, merge_hyper(what, more_hyper, hyper),
                                 also=RECURRENT_OPTIONS)
        given = _given_states(what, template, initial_state, direction, layers, hyper)
        first = len(self.layers)
        x = bottom
        for k in range(layers):
            out = top if k == layers - 1 else f"{scope}l{k}_out"
            sc = f"{scope}l{k}_" if layers > 1 else scope
            sides = [("fw_", False), ("bw_", True)] if direction == "bidirectional" else [
                ("", direction == "reverse")]
            for side, reverse in sides:
                d = _Direction(
                    template, hyper, x, f"{out}_{side[:-1]}" if side else out, cont, reverse,
                    sc + side, self.T if steps is None else int(steps),
                    self.batch if batch is None else int(batch), expose_hidden,
                    sequence_output, align, initial_state == "learned", given)
                self._direction(d)
            if direction == "bidirectional":
                self.concat(f"{sc}bi_concat", [f"{out}_fw", f"{out}_bw"], out, axis=2)
            x = out
        self.blocks.append(self.layers[first:])
        return f"#@unroll:block:{len(self.blocks) - 1}"

    def _direction(self, d: _Direction) -> None:
        """Unroll one direction: sequence macro, per-step slices, steps, outputs, final state."""
        self._claim_scope(d)
        d.module = self.module(d.template, d.hyper)
        per_step = self._step_inputs(d)
        conts = self.slice_steps(d.cont, d.T)
        d.states = {state: int(d.hyper[size]) for state, size in
                    d.template.interface["states"].items()}
        if d.given_init:
            for state, blob in d.given_init.items():
                self.consumed.add(blob)
                self.initial_blobs.append((d.where(), state, blob))
                self.declared.append((d.where(), blob, (1, d.N, d.states[state]),
                                      f"initial state '{state}'"))
        else:
            self.input(f"{d.scope}initial_state",
                       {f"{d.scope}{s}_0": (1, d.N, size) for s, size in d.states.items()})
        outputs, final, run_conts = self._unroll_steps(d, per_step, conts)
        unread = self._outputs(d, outputs, run_conts)
        self._final_states(d, final, outputs, conts, unread)

    def _claim_scope(self, d: _Direction) -> None:
        if d.scope in self._scopes:
            raise TemplateError(
                f"{d.where()}: scope '{d.scope}' is used twice; give each recurrent layer its own"
            )
        self._scopes.add(d.scope)

    def _step_inputs(self, d: _Direction) -> dict[str, list[str]]:
        """Each declared input cut into steps, after the sequence macro if there is one."""
        inputs = {name: d.bottom for name in d.template.interface["inputs"]}
        if "sequence" in d.template.macros:
            seq_out = {name: f"{d.scope}{name}_seq" for name in inputs}
            s = Step(d.scope, None, d.T, d.reverse, input=inputs, output=seq_out)
            layers = self.render(d.template, d.module, "sequence", s)
            _require(d, seq_out, {top for lp in layers for top in lp.top}, lambda local, blob: (
                f"the sequence macro must produce s.output.{local} ('{blob}'), but no layer "
                f"tops it"))
            if d.T > GRADIENT_CHUNK and all(_row_wise(lp) for lp in layers):
                return self._chunked_sequence(d, inputs, seq_out)
            for lp in layers:
                self.add_layer(lp, f"{d.template.name} (sequence)")
            inputs = seq_out
        return {name: self.slice_steps(blob, d.T) for name, blob in inputs.items()}

    def _chunked_sequence(self, d: _Direction, inputs: dict, seq_out: dict
                          ) -> dict[str, list[str]]:
        """The sequence macro over chunks of GRADIENT_CHUNK steps, each run right before
        its chunk's first step (docs/design.md, 6. Memory): a projection of the whole
        sequence would keep T steps of its rows, and of their diffs, alive at once. The
        chunks start with the run (from step T-1 down, in reverse), as the chunks of the
        batched weight gradients do, so that recomputed segments are cut between both."""
        starts = (list(range(d.T, 0, -GRADIENT_CHUNK)) if d.reverse
                  else list(range(0, d.T, GRADIENT_CHUNK)))
        bounds = (sorted({max(0, e - GRADIENT_CHUNK) for e in starts} | {d.T}) if d.reverse
                  else [*starts, d.T])
        spans = list(zip(bounds[:-1], bounds[1:]))
        parts = {}
        for name, blob in inputs.items():
            lp = LayerParameter(name=f"{d.scope}{name}_chunks", type="Slice", bottom=[blob],
                                top=[f"{d.scope}{name}_c{c}" for c in range(len(spans))])
            lp.slice_param.axis = 0
            lp.slice_param.slice_point.extend(a for a, _ in spans[1:])
            self.add_layer(lp, f"layer '{lp.name}'")
            parts[name] = list(lp.top)
        per_step = {name: [""] * d.T for name in inputs}
        for c, (a, b) in enumerate(spans):
            out = {name: f"{blob}_c{c}" for name, blob in seq_out.items()}
            s = Step(d.scope, None, b - a, d.reverse, input={n: p[c] for n, p in parts.items()},
                     output=out, chunk=c)
            layers = self.render(d.template, d.module, "sequence", s)
            for name, blob in out.items():
                lp = LayerParameter(name=f"{blob}_slice", type="Slice", bottom=[blob],
                                    top=[f"{seq_out[name]}_t{t}" for t in range(a, b)])
                lp.slice_param.axis = 0
                layers.append(lp)
                per_step[name][a:b] = list(lp.top)
            d.pending[b - 1 if d.reverse else a] = layers
        return per_step

    def _unroll_steps(self, d: _Direction, per_step: dict, conts: list[str]):
        """Render every step; returns outputs by t, the final states, and the conts by run step."""
        iface = d.template.interface
        prev = {state: f"{d.scope}{state}_0" for state in d.states}
        init = {}  # state -> the blob every sequence starts from (learned or given)
        if d.learned_init:
            init = {state: self._learned_state(d.scope, state) for state in d.states}
        elif d.given_init:
            init = dict(d.given_init)
        if init:
            prev = dict(init)
            ones = self._power(conts[0], f"{d.cont}_ones", scale=0.0, shift=1.0)
        outputs = {name: [None] * d.T for name in iface["outputs"]}
        run_conts = []
        params_seen = None
        for k, t in enumerate(d.order, start=1):
            for lp in d.pending.pop(t, ()):
                self.add_layer(lp, f"{d.template.name} (sequence)")
            # reverse: the state entering step t comes from t+1, so it continues
            # exactly when t+1 does not start a sequence (cont[t+1] == 1)
            cont_t = conts[t + 1] if d.reverse and t + 1 < d.T else conts[t]
            run_conts.append(cont_t)
            if init:
                # the step's own cont-masking becomes a no-op (cont = 1): the mix
                # cont * prev + (1 - cont) * init already restarted where needed, and the
                # first step takes the initial state as it is, whatever its cont
                if k > 1:
                    prev = {name: self._mix(d.scope, name, prev[name], cont_t, t, init[name])
                            for name in d.states}
                cont_t = ones
            state = {name: f"{d.scope}{name}_{k}" for name in d.states}
            extra = {o: f"{d.scope}{o}_t{t}" for o in iface["outputs"] if o not in d.states}
            s = Step(d.scope, t, d.T, d.reverse, cont=cont_t,
                     input={n: v[t] for n, v in per_step.items()}, prev=prev, state=state,
                     output=extra)
            layers = self._step_layers(d, s)
            self._check_step(d, layers, s, prev, state, extra, t)
            params = {p.name for lp in layers for p in lp.param if p.name}
            if params_seen is None:
                params_seen = params
                self._declare(d, state, extra, t)
            elif params != params_seen and not iface.get("params_vary_with_t", False):
                changed = sorted(params ^ params_seen)
                raise TemplateError(
                    f"{d.template.name}: param name(s) {changed} change with the step index "
                    f"(step {t}), so learnable params would grow with T; name params with "
                    f"s.param(...) or declare \"params_vary_with_t\": true in the interface"
                )
            for lp in layers:
                self.add_layer(lp, d.where(t))
            for name in outputs:
                outputs[name][t] = state[name] if name in d.states else extra[name]
            prev = state
        return outputs, prev, run_conts

    def _declare(self, d: _Direction, state: dict, extra: dict, t: int) -> None:
        for name, blob in state.items():
            self.declared.append((d.where(t), blob, (1, d.N, d.states[name]), f"state '{name}'"))
        for name, blob in extra.items():
            self.declared.append((d.where(t), blob, (1, d.N, None), f"output '{name}'"))

    def _outputs(self, d: _Direction, outputs: dict, run_conts: list[str]) -> list[str]:
        """Each output: all steps concatenated in time, or each sequence's last one.

        Returns the step outputs left unread (those a trailing sequence end skips)."""
        unread = []
        for i, (name, blobs) in enumerate(outputs.items()):
            out = d.top if i == 0 else f"{d.top}_{name}"
            if d.sequence_output:
                self.concat(f"{d.scope}{name}_concat", blobs, out, axis=0)
                continue
            run = [blobs[t] for t in d.order]
            # in run order, the sequence starts the run (padding after it) exactly when
            # left-aligned data runs forward or right-aligned data runs in reverse
            if (d.align == "left") != d.reverse:
                kind, states = "LeadingSequenceEnd", run
            else:
                kind, states = "TrailingSequenceEnd", run[-1:]
                unread += [] if name in d.states else run[:-1]
            lp = LayerParameter(name=f"{d.scope}{name}_final", type=kind,
                                bottom=states + run_conts[1:], top=[out])
            self.add_layer(lp, f"layer '{lp.name}'")
        return unread

    def _final_states(self, d: _Direction, final: dict, outputs: dict, conts: list[str],
                      unread: list[str]) -> None:
        """Expose the final states (expose_hidden), or silence those nothing reads."""
        if d.expose_hidden:
            for state in d.states:
                lp = LayerParameter(name=f"{d.scope}{state}_expose", type="Reshape",
                                    bottom=[final[state]], top=[f"{d.scope}{state}_T"])
                lp.reshape_param.shape.dim.extend([0, 0, 0])
                self.add_layer(lp, f"layer '{lp.name}'")
        else:
            unread += [final[state] for state in d.states if state not in outputs]
        if conts[0] not in self.consumed:
            # the reverse recurrence never reads cont[0]; without a reader it would dangle
            # as a net output
            unread.append(conts[0])
        if unread:
            lp = LayerParameter(name=f"{d.scope}final_state_silence", type="Silence",
                                bottom=unread)
            self.add_layer(lp, f"layer '{lp.name}'")

    def _learned_state(self, sc: str, state: str) -> str:
        """``<sc><state>_init``: a learned (size,) bias on the zero initial state, (1, N, size)."""
        lp = LayerParameter(name=f"{sc}{state}_init", type="Bias", bottom=[f"{sc}{state}_0"],
                            top=[f"{sc}{state}_init"])
        lp.param.add(name=f"{sc}{state}_init")
        lp.bias_param.axis = 2
        self.add_layer(lp, f"layer '{lp.name}'")
        return lp.top[0]

    def _power(self, bottom: str, top: str, scale: float, shift: float) -> str:
        """``top`` = shift + scale * ``bottom``, made once per name."""
        if top not in self.produced:
            lp = LayerParameter(name=top, type="Power", bottom=[bottom], top=[top])
            lp.power_param.scale = scale
            lp.power_param.shift = shift
            self.add_layer(lp, f"layer '{top}'")
        return top

    def _mix(self, sc: str, state: str, prev: str, cont: str, t: int, init: str) -> str:
        """cont * prev + (1 - cont) * init: the state entering step t, ``init`` where a
        sequence starts."""
        inv = self._power(cont, f"{cont}_inv", scale=-1.0, shift=1.0)
        kept, fresh, mixed = (f"{sc}{state}_{what}_t{t}" for what in ("kept", "fresh", "in"))
        for name, bottoms in ((kept, [prev, cont]), (fresh, [init, inv])):
            lp = LayerParameter(name=name, type="Scale", bottom=bottoms, top=[name])
            lp.scale_param.axis = 0
            self.add_layer(lp, f"layer '{name}'")
        lp = LayerParameter(name=mixed, type="Eltwise", bottom=[kept, fresh], top=[mixed])
        self.add_layer(lp, f"layer '{mixed}'")
        return mixed

    @staticmethod
    def _check_step(d: _Direction, layers, s: Step, prev: dict, state: dict, extra: dict,
                    t: int) -> None:
        """The step makes its states and outputs, reads every state, and lets cont reach them."""
        tops = {top for lp in layers for top in lp.top}
        for kind, blobs in (("state", state), ("output", extra)):
            _require(d, blobs, tops, lambda local, blob, kind=kind: (
                f"step {t} must produce {kind} '{local}' (s.{kind}.{local}, '{blob}'), but no "
                f"layer tops it"))
        _require(d, prev, {b for lp in layers for b in lp.bottom}, lambda local, blob: (
            f"step {t} never reads state '{local}' (s.prev.{local}, '{blob}'); every declared "
            f"state must feed the next step"))
        reached = {s.cont}
        for lp in layers:  # rendered in order, so one pass follows every path
            if reached.intersection(lp.bottom):
                reached.update(lp.top)
        _require(d, state, reached, lambda local, blob: (
            f"state '{local}' ('{blob}') does not depend on s.cont at step {t}; a step must "
            f"restart its state where a sequence starts (cont 0), e.g. with a Scale of "
            f"s.prev.{local} by s.cont"))
        _check_gated(d, layers, s, prev, t)

    def shared(self, module, bottoms, tops, *, scope: str = "", hyper: dict | None = None,
               **more_hyper) -> str:
        """Apply module template ``module`` to each of ``bottoms``: one set of params for all.

        Called from net templates as ``{{ shared("tower", ["left", "right"],
        ["left_feat", "right_feat"], scope="tower_", hidden=8) }}``; like
        :meth:`recurrent`, returns a marker that :func:`expand` replaces with
        the layers. Each application renders the module's layers once, with
        its own blob and layer names (``s.blob``, ``s.layer`` carry its index)
        and the same param names (``s.param``), so the net holds one set of
        params and backward sums every application's gradient into it. An
        application's bottom and top are blob names, or lists of them where
        the module declares several inputs or outputs. ``scope`` prefixes every
        name, as in :meth:`recurrent`; the module's hyper-parameters are the
        other keywords, or ``hyper={...}``.
        """
        template = load_template(module, self.search_path)
        self.loaded.add(template.path)
        what = f"shared({Path(str(module)).name!r})"
        if template.kind != "module":
            use = "unroll it with recurrent()" if template.kind == "step" else "it renders a net"
            raise TemplateError(
                f"{what}: '{module}' is a {template.kind} template ({use}); shared() applies a "
                f"module template, one declaring \"kind\": \"module\" and a module(s) macro"
            )
        hyper = hyper_parameters(template, merge_hyper(what, more_hyper, hyper),
                                 also=SHARED_OPTIONS)
        calls = _applications(what, template.interface, bottoms, tops)
        if scope in self._scopes:
            raise TemplateError(
                f"{what}: scope '{scope}' is already used by another recurrent() or shared() "
                f"call; give each its own, so that their blobs and params stay apart"
            )
        self._scopes.add(scope)
        jinja_module = self.module(template, hyper)
        first = len(self.layers)
        params_seen, layer_names = None, set()
        for i, (inputs, outputs) in enumerate(calls):
            s = Application(scope, i, len(calls), input=inputs, output=outputs)
            where = f"{template.name} (application {i})"
            layers = self._parse_layers(self._text(template, jinja_module, "module", s), where)
            missing = sorted(set(outputs.values()) - {top for lp in layers for top in lp.top})
            if missing:
                local = next(k for k, v in outputs.items() if v == missing[0])
                raise TemplateError(
                    f"{where}: must produce output '{local}' (s.output.{local}, "
                    f"'{missing[0]}'), but no layer tops it"
                )
            repeated = sorted({lp.name for lp in layers} & layer_names)
            if repeated:
                raise TemplateError(
                    f"{where}: layer name(s) {repeated} are the same in every application; "
                    f"name layers with s.layer(...), which carries the application's index"
                )
            layer_names.update(lp.name for lp in layers)
            params = {spec.name for lp in layers for spec in lp.param if spec.name}
            if params_seen is None:
                params_seen = params
            elif params != params_seen:
                raise TemplateError(
                    f"{where}: param name(s) {sorted(params ^ params_seen)} change with the "
                    f"application, so the applications would not share them; name params "
                    f"with s.param(...)"
                )
            for lp in layers:
                self.add_layer(lp, where)
        self.modules[len(self.blocks)] = (template.name, self.layers[first:])
        self.blocks.append(self.layers[first:])
        return f"#@unroll:block:{len(self.blocks) - 1}"


def _applications(what: str, interface: dict, bottoms, tops) -> list[tuple[dict, dict]]:
    """Each application's {input: blob} and {output: blob}, checked against the interface."""
    for name, given in (("bottoms", bottoms), ("tops", tops)):
        if not isinstance(given, (list, tuple)) or not given:
            raise TemplateError(
                f"{what}: {name} must be a non-empty list, one entry per application, found "
                f"{given!r}"
            )
    if len(bottoms) != len(tops):
        raise TemplateError(
            f"{what}: {len(bottoms)} bottoms but {len(tops)} tops; give one top per "
            f"application (bottoms {list(bottoms)}, tops {list(tops)})"
        )
    calls = []
    for i, (bottom, top) in enumerate(zip(bottoms, tops)):
        call = []
        for kind, given in (("inputs", bottom), ("outputs", top)):
            names = interface[kind]
            blobs = [given] if isinstance(given, str) else given
            if not isinstance(blobs, (list, tuple)) or len(blobs) != len(names) or not all(
                    isinstance(b, str) for b in blobs):
                raise TemplateError(
                    f"{what}: application {i} must give {len(names)} blob name(s) for the "
                    f"module's {kind} {names}, found {given!r}"
                )
            call.append(dict(zip(names, blobs)))
        calls.append(tuple(call))
    return calls


def _check_shared_params(net, builder: NetBuilder) -> None:
    """Every param of a module's layers is named: an unnamed one would be each application's own."""
    held = net.params
    for name, layers in builder.modules.values():
        for lp in layers:
            for k in range(len(held.get(lp.name, []))):
                if k >= len(lp.param) or not lp.param[k].name:
                    raise TemplateError(
                        f"{name}: param {k} of layer '{lp.name}' ({lp.type}) has no name, so "
                        f"each application would learn its own; name every param of a module, "
                        f"e.g. param {{ name: \"{{{{ s.param('W') }}}}\" }}"
                    )


def _gates(lp: LayerParameter, blob: str, cont: str) -> bool:
    """Whether layer ``lp``, reading state ``blob``, multiplies it by ``cont`` or resets it:
    a Scale of it by cont, or a recurrent unit whose roles say it takes a state first and
    cont last (Caffe's LSTMUnit: c = cont * f * c_prev + i * g)."""
    from unroll.engine.layer import LAYERS  # here: the layers package imports the unroller

    if lp.type == "Scale":
        return list(lp.bottom) == [blob, cont]
    roles = getattr(LAYERS.get(lp.type), "roles", ())
    return (len(roles) == len(lp.bottom) > 1 and roles[0].endswith("_prev")
            and roles[-1] == "cont" and lp.bottom[0] == blob and lp.bottom[-1] == cont
            and blob not in lp.bottom[1:])


def _check_gated(d: _Direction, layers, s: Step, prev: dict, t: int) -> None:
    """Each state entering the step is multiplied by s.cont, or reset by it, before any
    other layer reads it: else a sequence that starts here inherits the last one's state."""
    ungated = {blob: local for local, blob in prev.items()}
    for lp in layers:
        for blob in [b for b in lp.bottom if b in ungated]:
            if not _gates(lp, blob, s.cont):
                local = ungated[blob]
                raise UngatedStateError(
                    f"{d.template.name}: state '{local}' (s.prev.{local}, '{blob}') is read by "
                    f"layer '{lp.name}' ({lp.type}) at step {t} before s.cont gates it, so a "
                    f"sequence starting there would carry the previous sequence's {local}; "
                    f"multiply it by cont first and read that instead: layer {{ type: "
                    f"\"Scale\" bottom: \"{{{{ s.prev.{local} }}}}\" bottom: \"{{{{ s.cont }}}}\" "
                    f"top: \"{{{{ s.blob('{local}_cont') }}}}\" scale_param {{ axis: 0 }} }} (or "
                    f"hand it, with s.cont, to a unit that resets it: LSTMUnit, GRUUnit)", local)
            if blob in lp.top:  # gated in place: later readers see the gated state
                del ungated[blob]


def _given_states(what: str, template: Template, initial_state, direction: str,
                  layers, hyper: dict) -> dict:
    """The {state: blob} an ``initial_state`` dict gives, checked against the template's
    states; {} for "zeros" and "learned"."""
    if not isinstance(initial_state, dict):
        return {}
    states = template.interface["states"]
    shapes = ", ".join(f"'{s}' (1, N, {hyper[size]})" for s, size in states.items())
    missing = [s for s in states if s not in initial_state]
    unknown = sorted(set(initial_state) - set(states))
    if missing or unknown:
        problem = (f"gives no blob for state '{missing[0]}'" if missing
                   else f"names '{unknown[0]}', which is not a state")
        raise TemplateError(
            f"{what}: initial_state {problem}; {template.name} starts from one blob per state, "
            f"{shapes}: initial_state={{{', '.join(f'{s!r}: ...' for s in states)}}}"
        )
    bad = {s: b for s, b in initial_state.items() if not isinstance(b, str) or not b}
    if bad:
        raise TemplateError(f"{what}: initial_state must map each state to a blob name, found "
                            f"{bad}")
    if direction == "bidirectional" or layers != 1:
        raise TemplateError(
            f"{what}: initial_state from blobs starts one recurrence; found direction "
            f"{direction!r} and layers {layers!r}: make one recurrent() call per direction "
            f"and layer, each with its own initial_state"
        )
    return dict(initial_state)


def _check_initial_blobs(template: Template, net: NetParameter, builder: NetBuilder) -> None:
    """Each blob a recurrent layer starts from is made by a layer above it, or an input."""
    for where, state, blob in builder.initial_blobs:
        first = next((lp for lp in net.layer if blob in lp.bottom or blob in lp.top), None)
        if first is None or blob not in first.top:
            raise TemplateError(
                f"{template.name}: {where} starts state '{state}' from blob '{blob}', which no "
                f"layer above the recurrence makes; it must be a (1, N, size) blob made by a "
                f"layer before the recurrent() call, or an input of the net"
            )


def _row_wise(lp: LayerParameter) -> bool:
    """Whether a layer maps every row along axis 0 on its own (an InnerProduct from axis 1
    or later), so the sequence macro may run over chunks of the steps."""
    return lp.type == "InnerProduct" and lp.inner_product_param.axis >= 1


def _require(d: _Direction, blobs: dict, found: set, problem) -> None:
    """Each of ``blobs`` (local name -> blob) is in ``found``; else ``problem(local, blob)``."""
    for local, blob in blobs.items():
        if blob not in found:
            raise TemplateError(f"{d.template.name}: {problem(local, blob)}")


# -- expand ---------------------------------------------------------------------------------


def _build(template: Template, steps: int, batch: int, search_path, variables: dict,
           hyper: dict | None) -> tuple[NetParameter, NetBuilder]:
    """The unrolled NetParameter of ``template`` and the builder that made it."""
    builder = NetBuilder(steps, batch, search_path)
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
        tops = {"x": (steps, batch, int(input_dim)), "cont": (steps, batch)}
        given = options.get("initial_state")
        if isinstance(given, dict):  # the blobs the states start from are inputs here
            sizes = hyper_parameters(template, merge_hyper(template.name, variables, hyper))
            states = template.interface["states"]
            tops.update((blob, (1, batch, int(sizes[states[state]])))
                        for state, blob in given.items()
                        if state in states and isinstance(blob, str) and blob not in tops)
        builder.input("input", tops)
        builder.recurrent(str(template.path), "x", "h", "cont", hyper=hyper, **options,
                          **variables)
        return builder.net_param(f"{template.name[: -len(SUFFIX)]}_T{steps}"), builder
    merged = hyper_parameters(template, merge_hyper(template.name, variables, hyper),
                              also=["batch"])
    merged.update(T=builder.T, batch=batch, recurrent=builder.recurrent, shared=builder.shared)
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


def _net_of(net_param: NetParameter, builder: NetBuilder):
    """(the Net of ``net_param``, keeping the declared blobs, None), or (None, its NetError)."""
    from unroll.engine.net import Net

    try:
        return Net(net_param, keep=[blob for _, blob, _, _ in builder.declared]), None
    except NetError as e:
        return None, e


def _check_declared(net, builder: NetBuilder) -> None:
    """Each declared state and output comes out of its step in the declared shape."""
    for where, blob, want, what in builder.declared:
        found = tuple(net.blobs[blob].shape)
        if len(found) != len(want) or any(w is not None and w != f for w, f in zip(want, found)):
            shape = "(" + ", ".join("..." if w is None else str(w) for w in want) + ")"
            raise TemplateError(
                f"{where}: {what} ('{blob}') comes out {found}, but must be {shape}: "
                f"(1, N, size) per step (an InnerProduct without axis: 2 flattens N away)"
            )


def _check_initial_shapes(net_param: NetParameter, builder: NetBuilder) -> None:
    """Each blob a recurrence starts from is (1, N, size), built up to its first reader: a
    wrong one would break the recurrence's first step, which says less."""
    from unroll.engine.net import Net

    wanted = {declared[1]: declared for declared in builder.declared}
    for _, _, blob in builder.initial_blobs:
        prefix = NetParameter()
        for lp in net_param.layer:
            if blob in lp.bottom:
                break
            prefix.layer.add().CopyFrom(lp)
        try:
            found = Net(prefix, keep=[blob]).blobs[blob].shape
        except (NetError, KeyError):
            continue
        where, _, want, what = wanted[blob]
        if tuple(found) != want:
            raise TemplateError(f"{where}: {what} ('{blob}') comes out {tuple(found)}, but "
                                f"must be {want}: (1, N, size) for every sequence")


def _check_shapes(template: Template, net_param: NetParameter, builder: NetBuilder,
                  one_step=None) -> None:
    """Build the unrolled net, at the T it was unrolled to, and check its declared shapes.

    Where it does not build, ``one_step()`` (the same unrolled to one step: net, builder)
    may say why better: a state of the wrong shape breaks the step after it, far from the
    mistake."""
    net, error = _net_of(net_param, builder)
    if error is not None:
        _check_initial_shapes(net_param, builder)
        try:  # T-dependent structure may not unroll to one step: then T's error stands
            small_param, small_builder = one_step() if one_step is not None else (None, None)
        except TemplateError:
            small_param = None
        if small_param is not None:
            small, _ = _net_of(small_param, small_builder)
            if small is not None:
                _check_declared(small, small_builder)
        raise TemplateError(f"{template.name}: the net unrolled to {builder.T} step(s) does not "
                            f"build: {error}") from None
    _check_declared(net, builder)
    _check_shared_params(net, builder)


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
               hyper: dict | None) -> str | None:
    given = (list(search_path), variables, hyper or {})
    if not _plain(given):
        return None
    return repr((str(template.path), int(steps), batch, [str(p) for p in search_path],
                 os.environ.get("UNROLL_TEMPLATE_PATH", ""), sorted(variables.items()),
                 sorted((hyper or {}).items())))


def _state(files, folders) -> tuple:
    """The modification times and sizes of ``files`` and of every template in ``folders``
    (what a template may import): a cached net is stale once one changes."""
    paths = set(files) | {p for d in folders if d.is_dir() for p in d.glob("*.j2")}
    stats = {p: p.stat() if p.exists() else None for p in paths}
    return tuple(sorted((str(p), st and (st.st_mtime_ns, st.st_size)) for p, st in stats.items()))


def expand(template, steps: int, search_path=(), hyper: dict | None = None,
           **variables) -> NetParameter:
    """Unroll ``template`` (a built-in name or a path) to ``steps`` timesteps.

    For a **step template** the result is a whole net: an Input layer making
    ``x`` (T, N, input_dim) and ``cont`` (T, N), the unrolled recurrence, and
    its output ``h`` (T, N, hidden). Variables: ``batch`` (N, default 1),
    ``input_dim``, the template's hyper-parameters, and the options below.
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
      :func:`carry_hidden` between chunks; ``cont_from_lengths(...,
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
    batch = int(variables.pop("batch", 1))
    key = _cache_key(template, steps, batch, search_path, variables, hyper)
    cached = _EXPANDED.get(key) if key is not None else None
    if cached is not None and _state(*cached[0]) == cached[1]:
        _EXPANDED.move_to_end(key)
        return NetParameter.FromString(cached[2])
    with bounded_rendering():  # one budget for all the templates an expansion renders
        net, builder = _build(template, steps, batch, search_path, dict(variables), hyper)
    _check_initial_blobs(template, net, builder)
    _check_shapes(template, net, builder, None if steps == 1 else lambda: _build(
        template, 1, batch, search_path, dict(variables), hyper))
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


def carry_hidden(model) -> dict:
    """Copy each exposed final state ``X_T`` into its initial state ``X_0`` (truncated BPTT).

    ``model`` is a :class:`~unroll.engine.net.Net` or a
    :class:`~unroll.train.bucketed_model.BucketedModel` (the net that ran last
    gives the states; every net the model has built receives them). Returns
    {initial name: state}; pass it to the next ``forward`` of a bucketed
    model whose next chunk length has no net yet. Use between the chunks of
    long streams, on a net expanded with ``expose_hidden=True``, with cont
    from ``cont_from_lengths(..., continues=True)`` so the chunk carries on.

    >>> import unroll, numpy as np
    >>> net = unroll.Net(expand("rnn", steps=2, batch=1, input_dim=1, hidden=2,
    ...                         expose_hidden=True))
    >>> _ = net.forward(x=np.ones((2, 1, 1)), cont=np.ones((2, 1)))
    >>> sorted(carry_hidden(net))
    ['h_0']
    """
    nets = getattr(model, "nets", None)
    source = model.active if nets is not None else model
    if source is None:
        raise ValueError("carry_hidden: the model has not run forward yet")
    state = {}
    for name in source.outputs:
        initial = f"{name[:-2]}_0"
        if name.endswith("_T") and initial in source.inputs:
            state[initial] = source.blobs[name].data.copy()
    if not state:
        raise ValueError(
            "carry_hidden: the net exposes no final states (no output X_T with an input X_0); "
            "expand it with expose_hidden=True"
        )
    for net in nets.values() if nets is not None else [model]:
        for initial, value in state.items():
            if initial in net.inputs:
                net.set_input(initial, value)
    return state


# Caffe's LSTM and RNN layers unroll their hidden nets with this expand; the engine may not
# import the frontend, so the frontend hands it over (see unroll.engine.hidden_nets)
hidden_nets.register_unroller(expand)
