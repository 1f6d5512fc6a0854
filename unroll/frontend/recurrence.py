"""One recurrent layer unrolled in time: a :class:`Recurrence` per direction.

``recurrent()`` (a net template's call, and what :func:`~unroll.frontend.unroller.expand`
makes of a step template) checks its options and adds, for each layer and
direction, one :class:`Recurrence` to a :class:`~unroll.frontend.builder.NetBuilder`
(docs/design.md, 3. Unrolling). Like Caffe's ``RecurrentLayer``, a recurrence
is a few hooks: its per-step **input names** (the bottom cut into steps, after
the sequence macro), its **state names and shapes**, and **filling a step**
(the step macro rendered with the step's names, checked, its layers added),
run in order, then its outputs, concatenated in time or each sequence's last.

>>> from unroll.frontend.builder import NetBuilder
>>> b = NetBuilder(steps=3, batch=2)
>>> b.input("input", {"x": (3, 2, 4), "cont": (3, 2)})
>>> recurrent(b, "rnn", "x", "h", hidden=5)
'#@unroll:block:0'
>>> [lp.name for lp in b.layers][-2:]
['tanh_t2', 'h_concat']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from unroll.core.errors import TemplateError
from unroll.core.proto import LayerParameter
from unroll.frontend.builder import NetBuilder
from unroll.frontend.checks import check_step, require
from unroll.frontend.render import ParseCache, render_macro, run_module
from unroll.frontend.template import Step, Template, hyper_parameters, load_template, merge_hyper

__all__ = ["ALIGNS", "DIRECTIONS", "GIVEN_STATE_CONT", "INITIAL_STATES", "LAYER_OPTIONS",
           "RECURRENT_OPTIONS", "Recurrence", "first_step_cont", "recurrent", "restart_from"]

#: docs/design.md, "State from anywhere": a recurrence with an initial state (given or
#: learned) starts every sequence from it, by :func:`restart_from`; its steps' own gates
#: then read this in place of cont, at every step, through :func:`first_step_cont`. The
#: unroller (``<cont>_ones`` and its mix layers) and a :class:`~unroll.train.stepper.Stepper`
#: reset to given states follow this rule, the one both are written from
GIVEN_STATE_CONT = 1.0


def restart_from(initial, carried, cont):
    """The state entering a step of a recurrence that starts every sequence from
    ``initial`` (1, N, ...): ``carried`` where ``cont`` (1, N) is 1, ``initial`` where it
    is 0 (a sequence starts), as ``cont * carried + (1 - cont) * initial``, the sum the
    unroller's mix layers compute. At the first step the carried state IS the initial
    one, so a given state enters it whatever its cont says.

    >>> import numpy as np
    >>> given, carried = np.full((1, 2, 1), 7.0), np.full((1, 2, 1), 3.0)
    >>> restart_from(given, carried, np.array([[1.0, 0.0]])).ravel().tolist()
    [3.0, 7.0]
    """
    cont = cont.reshape(cont.shape + (1,) * (carried.ndim - cont.ndim))
    return carried * cont + initial * (1 - cont)


def first_step_cont(cont):
    """The cont values a step of a recurrence with an initial state reads in place of
    ``cont``: :data:`GIVEN_STATE_CONT` everywhere, whatever ``cont`` holds, since
    :func:`restart_from` has already restarted the state where a sequence starts.

    >>> import numpy as np
    >>> first_step_cont(np.zeros((1, 2)))
    array([[1., 1.]])
    """
    return np.full_like(cont, GIVEN_STATE_CONT)

DIRECTIONS = ("forward", "reverse", "bidirectional")
ALIGNS = ("left", "right")
INITIAL_STATES = ("zeros", "learned")
#: the options of an unrolled layer that expand() takes beside a step template's variables
LAYER_OPTIONS = ("direction", "layers", "scope", "expose_hidden", "sequence_output", "align",
                 "initial_state")
#: everything recurrent() takes besides the template's hyper-parameters
RECURRENT_OPTIONS = ("cont", *LAYER_OPTIONS, "batch", "steps", "hyper")


def _row_wise(lp: LayerParameter) -> bool:
    """Whether a layer maps every row along axis 0 on its own (an InnerProduct from axis 1
    or later), so the sequence macro may run over chunks of the steps."""
    return lp.type == "InnerProduct" and lp.inner_product_param.axis >= 1


@dataclass
class Recurrence:
    """One direction of one recurrent layer: what it reads and writes, and how it unrolls."""

    builder: NetBuilder
    template: Template
    hyper: dict
    bottoms: dict  # each declared per-step input -> the (T, N, ...) blob cut into its steps
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
    static: dict = field(default_factory=dict)  # static input -> the blob every step reads
    states: dict = field(default_factory=dict)  # state -> size
    module: object = None  # the template run with hyper
    parses: ParseCache = field(default_factory=ParseCache)
    #: run step index -> layers of the sequence macro over a chunk, added right before it
    pending: dict = field(default_factory=dict)
    params: set | None = None  # the param names of the first step filled

    @property
    def order(self) -> range:
        return range(self.T - 1, -1, -1) if self.reverse else range(self.T)

    def where(self, t=None) -> str:
        return self.template.name if t is None else f"{self.template.name} (step t={t})"

    def unroll(self) -> None:
        """Unroll: sequence macro, per-step slices, steps, outputs, final state."""
        self.builder.claim_scope(self.scope, f"{self.where()}: scope '{self.scope}' is used twice; "
                                       f"give each recurrent layer its own")
        self.module = run_module(self.template, self.hyper)
        per_step = self.input_names()
        conts = self.builder.slice_steps(self.cont, self.T)
        self.states = {state: shape[2] for state, shape in self.state_shapes().items()}
        if self.given_init:
            for state, blob in self.given_init.items():
                self.builder.consumed.add(blob)
                self.builder.initial_blobs.append((self.where(), state, blob))
                self.builder.declared.append((self.where(), blob, (1, self.N, self.states[state]),
                                        f"initial state '{state}'"))
        else:
            self.builder.input(f"{self.scope}initial_state",
                         {f"{self.scope}{s}_0": (1, self.N, size)
                          for s, size in self.states.items()})
        outputs, final, run_conts = self._steps(per_step, conts)
        unread = self._outputs(outputs, run_conts)
        self._final_states(final, outputs, conts, unread)

    # -- the hooks --------------------------------------------------------------------------
    def state_shapes(self) -> dict[str, tuple]:
        """Each state's shape, (1, N, size), its size the hyper-parameter it names."""
        return {state: (1, self.N, int(self.hyper[size]))
                for state, size in self.template.interface["states"].items()}

    def input_names(self) -> dict[str, list[str]]:
        """Each declared input cut into steps, after the sequence macro if there is one."""
        inputs = dict(self.bottoms)
        self.builder.consumed.update(self.static.values())
        if "sequence" in self.template.macros:
            seq_out = {name: f"{self.scope}{name}_seq" for name in inputs}
            s = Step(self.scope, None, self.T, self.reverse, input=inputs, output=seq_out,
                     static=self.static)
            layers = render_macro(self.template, self.module, "sequence", s)
            require(self.template.name, seq_out, {top for lp in layers for top in lp.top},
                    lambda local, blob: (f"the sequence macro must produce s.output.{local} "
                                         f"('{blob}'), but no layer tops it"))
            chunk = self.builder.chunk
            if chunk is not None and self.T > chunk and all(_row_wise(lp) for lp in layers):
                return self._chunked_sequence(inputs, seq_out)
            for lp in layers:
                self.builder.add_layer(lp, f"{self.template.name} (sequence)")
            inputs = seq_out
        return {name: self.builder.slice_steps(blob, self.T) for name, blob in inputs.items()}

    def fill_step(self, t: int, s: Step, prev: dict, state: dict, extra: dict) -> None:
        """Render step ``t`` with the names ``s`` holds, check it, and add its layers."""
        layers = self.parses.step_layers(self.template, self.module, s, lambda layers: check_step(
            self.template.name, layers, s, prev, state, extra, t))
        params = {p.name for lp in layers for p in lp.param if p.name}
        if self.params is None:
            self.params = params
            self._declare(state, extra, t)
        elif params != self.params and not self.template.interface.get("params_vary_with_t",
                                                                        False):
            raise TemplateError(
                f"{self.template.name}: param name(s) {sorted(params ^ self.params)} change "
                f"with the step index (step {t}), so learnable params would grow with T; name "
                f"params with s.param(...) or declare \"params_vary_with_t\": true in the "
                f"interface"
            )
        for lp in layers:
            self.builder.add_layer(lp, self.where(t))

    # -- the rest -----------------------------------------------------------------------------
    def _chunked_sequence(self, inputs: dict, seq_out: dict) -> dict[str, list[str]]:
        """The sequence macro over chunks of the builder's ``chunk`` steps, each run right before
        its chunk's first step (docs/design.md, 6. Memory): a projection of the whole
        sequence would keep T steps of its rows, and of their diffs, alive at once. The
        chunks start with the run (from step T-1 down, in reverse), as the chunks of the
        batched weight gradients do, so that recomputed segments are cut between both."""
        T, chunk = self.T, self.builder.chunk
        starts = list(range(T, 0, -chunk)) if self.reverse else list(range(0, T, chunk))
        bounds = (sorted({max(0, e - chunk) for e in starts} | {T}) if self.reverse
                  else [*starts, T])
        spans = list(zip(bounds[:-1], bounds[1:]))
        parts = {}
        for name, blob in inputs.items():
            lp = LayerParameter(name=f"{self.scope}{name}_chunks", type="Slice", bottom=[blob],
                                top=[f"{self.scope}{name}_c{c}" for c in range(len(spans))])
            lp.slice_param.axis = 0
            lp.slice_param.slice_point.extend(a for a, _ in spans[1:])
            self.builder.add_layer(lp, f"layer '{lp.name}'")
            parts[name] = list(lp.top)
        per_step = {name: [""] * T for name in inputs}
        for c, (a, b) in enumerate(spans):
            out = {name: f"{blob}_c{c}" for name, blob in seq_out.items()}
            s = Step(self.scope, None, b - a, self.reverse,
                     input={n: p[c] for n, p in parts.items()}, output=out, chunk=c,
                     static=self.static)
            layers = render_macro(self.template, self.module, "sequence", s)
            for name, blob in out.items():
                lp = LayerParameter(name=f"{blob}_slice", type="Slice", bottom=[blob],
                                    top=[f"{seq_out[name]}_t{t}" for t in range(a, b)])
                lp.slice_param.axis = 0
                layers.append(lp)
                per_step[name][a:b] = list(lp.top)
            self.pending[b - 1 if self.reverse else a] = layers
        return per_step

    def _steps(self, per_step: dict, conts: list[str]):
        """Fill every step; returns outputs by t, the final states, and the conts by run step."""
        iface = self.template.interface
        sc = self.scope
        prev = {state: f"{sc}{state}_0" for state in self.states}
        init = {}  # state -> the blob every sequence starts from (learned or given)
        if self.learned_init:
            init = {state: self.builder.learned_state(sc, state) for state in self.states}
        elif self.given_init:
            init = dict(self.given_init)
        if init:
            prev = dict(init)
            # first_step_cont as a layer (shift + 0 * cont), read by every step: the mix
            # below (restart_from as layers) restarts the later ones
            ones = self.builder.power(conts[0], f"{self.cont}_ones", scale=0.0,
                                      shift=GIVEN_STATE_CONT)
        outputs = {name: [None] * self.T for name in iface["outputs"]}
        run_conts = []
        for k, t in enumerate(self.order, start=1):
            for lp in self.pending.pop(t, ()):
                self.builder.add_layer(lp, f"{self.template.name} (sequence)")
            # reverse: the state entering step t comes from t+1, so it continues
            # exactly when t+1 does not start a sequence (cont[t+1] == 1)
            cont_t = conts[t + 1] if self.reverse and t + 1 < self.T else conts[t]
            run_conts.append(cont_t)
            if init:
                # the step's own cont-masking becomes a no-op (cont = 1): the mix
                # cont * prev + (1 - cont) * init already restarted where needed, and the
                # first step takes the initial state as it is, whatever its cont
                if k > 1:
                    prev = {name: self.builder.mix(sc, name, prev[name], cont_t, t, init[name])
                            for name in self.states}
                cont_t = ones
            state = {name: f"{sc}{name}_{k}" for name in self.states}
            extra = {o: f"{sc}{o}_t{t}" for o in iface["outputs"] if o not in self.states}
            s = Step(sc, t, self.T, self.reverse, cont=cont_t,
                     input={n: v[t] for n, v in per_step.items()}, prev=prev, state=state,
                     output=extra, static=self.static)
            self.fill_step(t, s, prev, state, extra)
            for name in outputs:
                outputs[name][t] = state[name] if name in self.states else extra[name]
            prev = state
        return outputs, prev, run_conts

    def _declare(self, state: dict, extra: dict, t: int) -> None:
        for name, blob in state.items():
            self.builder.declared.append((self.where(t), blob, (1, self.N, self.states[name]),
                                    f"state '{name}'"))
        for name, blob in extra.items():
            self.builder.declared.append((self.where(t), blob, (1, self.N, None),
                                          f"output '{name}'"))

    def _outputs(self, outputs: dict, run_conts: list[str]) -> list[str]:
        """Each output: all steps concatenated in time, or each sequence's last one.

        Returns the step outputs left unread (those a trailing sequence end skips)."""
        unread = []
        for i, (name, blobs) in enumerate(outputs.items()):
            out = self.top if i == 0 else f"{self.top}_{name}"
            if self.sequence_output:
                self.builder.concat(f"{self.scope}{name}_concat", blobs, out, axis=0)
                continue
            run = [blobs[t] for t in self.order]
            # in run order, the sequence starts the run (padding after it) exactly when
            # left-aligned data runs forward or right-aligned data runs in reverse
            if (self.align == "left") != self.reverse:
                kind, states = "LeadingSequenceEnd", run
            else:
                kind, states = "TrailingSequenceEnd", run[-1:]
                unread += [] if name in self.states else run[:-1]
            lp = LayerParameter(name=f"{self.scope}{name}_final", type=kind,
                                bottom=states + run_conts[1:], top=[out])
            self.builder.add_layer(lp, f"layer '{lp.name}'")
        return unread

    def _final_states(self, final: dict, outputs: dict, conts: list[str],
                      unread: list[str]) -> None:
        """Expose the final states (expose_hidden), or silence those nothing reads."""
        if self.expose_hidden:
            for state in self.states:
                lp = LayerParameter(name=f"{self.scope}{state}_expose", type="Reshape",
                                    bottom=[final[state]], top=[f"{self.scope}{state}_T"])
                lp.reshape_param.shape.dim.extend([0, 0, 0])
                self.builder.add_layer(lp, f"layer '{lp.name}'")
        else:
            unread += [final[state] for state in self.states if state not in outputs]
        if conts[0] not in self.builder.consumed:
            # the reverse recurrence never reads cont[0]; without a reader it would dangle
            # as a net output
            unread.append(conts[0])
        if unread:
            self.builder.silence(f"{self.scope}final_state_silence", unread)


def _check_options(what: str, direction, align, initial_state, expose_hidden, layers) -> None:
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


def _bottoms(what: str, template: Template, bottom) -> tuple[dict, dict]:
    """({per-step input: blob}, {static input: blob}) from recurrent()'s ``bottom``: one
    blob name where the template reads one input, else a list in the declared order (the
    inputs, then the static ones) or a dict by name; each declared one given, nothing else."""
    inputs = list(template.interface["inputs"])
    static = list(template.interface.get("static", {}))
    names = inputs + static
    declared = (f"{template.name} reads inputs {inputs}"
                + (f" and static inputs {static}" if static else ""))
    if isinstance(bottom, str):  # the first input's: any other is missing
        given = {names[0]: bottom} if names else {}
    elif isinstance(bottom, (list, tuple)):
        if len(bottom) != len(names):
            raise TemplateError(f"{what}: {declared}: give one blob for each, in that order, "
                                f"found {len(bottom)}: {list(bottom)!r}")
        given = dict(zip(names, bottom))
    elif isinstance(bottom, dict):
        given = dict(bottom)
    else:
        raise TemplateError(f"{what}: the bottom must be a blob name, a list or a dict of "
                            f"them; {declared}; found {bottom!r}")
    missing = [n for n in names if n not in given]
    unknown = sorted(set(given) - set(names), key=str)
    if missing or unknown:
        problem = (f"gives no blob for '{missing[0]}'" if missing
                   else f"names {unknown[0]!r}, which it does not read")
        raise TemplateError(f"{what}: the bottom {problem}; {declared}: bottom="
                            f"{{{', '.join(f'{n!r}: ...' for n in names)}}}")
    bad = {n: b for n, b in given.items() if not isinstance(b, str) or not b}
    if bad:
        raise TemplateError(f"{what}: each bottom must be a blob name, found {bad}")
    return {n: given[n] for n in inputs}, {n: given[n] for n in static}


def recurrent(builder: NetBuilder, step, bottom, top: str, cont: str = "cont", *,
              direction: str = "forward", layers: int = 1, scope: str = "",
              expose_hidden: bool = False, sequence_output: bool = True,
              align: str = "right", initial_state="zeros", batch: int | None = None,
              steps: int | None = None, hyper: dict | None = None, **more_hyper) -> str:
    """Unroll step template ``step`` over ``bottom`` (T, N, D) into ``top`` (T, N, ...).

    Called from net templates as ``{{ recurrent("lstm", "emb", "h", hidden=128) }}``;
    a template with several inputs, or static ones, takes a list of blobs in the
    declared order (its inputs, then its static inputs) or a dict by name,
    ``recurrent("lstm_attention", {"x": "emb", "memory": "enc", "memory_mask": "pad"},
    "a", ...)``; each layer of a stack reads the one below as its first input and the
    same blobs as the others;
    returns a marker that :func:`~unroll.frontend.unroller.expand` replaces with the
    unrolled layers, so they go where the call is printed. ``cont`` names the
    (T, N) cont blob; ``batch`` and ``steps`` are N and T of ``bottom``
    where they differ from the net's; ``initial_state`` may give each state
    a blob made above the call, ``initial_state={"h": "enc_h_T", "c":
    "enc_c_T"}``. The other options are described in
    :func:`~unroll.frontend.unroller.expand`. The step template's hyper-parameters are
    the other keywords, or ``hyper={...}`` for one whose name is an option (``layers``).
    """
    template = load_template(step, builder.search_path)
    builder.loaded.add(template.path)
    what = f"recurrent({Path(str(step)).name!r})"
    if template.kind != "step":
        raise TemplateError(f"{what}: '{step}' is a {template.kind} template, not a step")
    _check_options(what, direction, align, initial_state, expose_hidden, layers)
    hyper = hyper_parameters(template, merge_hyper(what, more_hyper, hyper),
                             also=RECURRENT_OPTIONS)
    given = _given_states(what, template, initial_state, direction, layers, hyper)
    inputs, static = _bottoms(what, template, bottom)
    first = len(builder.layers)
    first_input = next(iter(inputs), None)  # what a stack's upper layers read from below
    for k in range(layers):
        out = top if k == layers - 1 else f"{scope}l{k}_out"
        sc = f"{scope}l{k}_" if layers > 1 else scope
        sides = [("fw_", False), ("bw_", True)] if direction == "bidirectional" else [
            ("", direction == "reverse")]
        for side, reverse in sides:
            Recurrence(
                builder, template, hyper, dict(inputs), f"{out}_{side[:-1]}" if side else out,
                cont,
                reverse, sc + side, builder.T if steps is None else int(steps),
                builder.batch if batch is None else int(batch), expose_hidden,
                sequence_output, align, initial_state == "learned", given, static).unroll()
        if direction == "bidirectional":
            builder.concat(f"{sc}bi_concat", [f"{out}_fw", f"{out}_bw"], out, axis=2)
        if first_input is not None:
            inputs[first_input] = out
    return builder.block(first)
