"""Stepper: run a net one step at a time, carrying every recurrent state from call to call.

A net unrolled to one step with ``expose_hidden=True`` takes each state as an
input ``X_0`` and gives it back as an output ``X_T``. A :class:`Stepper` holds
those states between calls, so a loop of calls computes what the net unrolled
to T steps computes over the same inputs: decoders that feed each step's
prediction to the next (greedy decoding, beam search), streams read as they
come. Built over the training model's :class:`~unroll.engine.param_store.ParamStore`,
it runs the trained weights, whatever T they were trained at (docs/design.md,
"Stepping").
"""

from __future__ import annotations

import numpy as np

from unroll.core.errors import NetError
from unroll.core.proto import NetParameter, read_message
from unroll.engine.host_checks import check_cont
from unroll.engine.layer import LAYERS
from unroll.engine.net import Net
from unroll.engine.param_store import ParamStore
from unroll.frontend.recurrence import first_step_cont, restart_from
from unroll.train.bucketed_model import _input_ties

__all__ = ["Stepper"]


class Stepper:
    """One step of a net per call; the states flow from each call into the next.

    ``source`` is a net unrolled to ONE step with ``expose_hidden=True`` (a
    NetParameter, prototxt path or text): its state pairs are the inputs
    ``X_0`` whose outputs ``X_T`` it has (``h_0``/``h_T``, ``l1_c_0``/``l1_c_T``,
    ``dec_h_0``/``dec_h_T`` with a scope). ``store`` is the ParamStore of the
    model whose weights it runs. Each call takes the other inputs of one step,
    shaped as the net's inputs at T = 1 (``x`` (1, N, D), ``cont`` (1, N)), and
    returns the outputs of that step (without the states, which :attr:`state`
    holds). cont gates the carried state as in the unrolled net: cont 0 starts
    a sequence from its initial state, zeros after :meth:`reset`.

    :meth:`set_static` sets inputs that every following call reads as they are, such as
    an attention memory: copied into the net once, not on every call, so a call then
    takes only the inputs of its step.

    :meth:`reset` starts every sequence from zeros (sized by the batch of the next
    call), ``reset(state)`` from given states, ``{"h_0": (1, N, H), ...}``, as a
    decoder starts from its encoder's final states. A given state is an initial
    state, as ``initial_state=`` gives one to the unrolled net, and follows the one
    rule of docs/design.md, "State from anywhere"
    (:func:`~unroll.frontend.recurrence.restart_from`): the next call's step takes it
    whatever its cont says, and at every later call a row whose cont is 0 starts again
    from it, not from zeros; so a decoder steps as it was trained. Beam search moves
    the hypotheses with :meth:`reorder`.

    >>> import numpy as np, unroll
    >>> make = lambda T: unroll.expand("lstm", steps=T, batch=2, input_dim=3, hidden=4,
    ...                                expose_hidden=True)
    >>> whole = unroll.Net(make(3), phase="test")
    >>> step = Stepper(make(1), store=whole.store)
    >>> x, cont = np.random.default_rng(0).normal(size=(3, 2, 3)), np.ones((3, 2))
    >>> h = whole.forward(x=x, cont=cont, h_0=np.zeros((1, 2, 4)), c_0=np.zeros((1, 2, 4)))["h"]
    >>> steps = [step(x=x[t:t + 1], cont=cont[t:t + 1])["h"] for t in range(3)]
    >>> bool(np.allclose(np.concatenate(steps), h, atol=1e-6)), sorted(step.state)
    (True, ['c_0', 'h_0'])
    >>> step.reset()                      # the next call starts from zeros again
    """

    def __init__(self, source, store: ParamStore | None = None, phase: str = "test",
                 device: str = "cpu", dtype="float32", keep=()):
        net_param = read_message(source, NetParameter)
        self.net = Net(net_param, phase=phase, device=device, dtype=dtype, keep=keep,
                       param_store=store)
        #: {state input X_0: its final state output X_T}
        self.pairs = {f"{name[:-2]}_0": name for name in self.net.outputs
                      if name.endswith("_T") and f"{name[:-2]}_0" in self.net.inputs}
        if not self.pairs:
            raise NetError(
                f"Stepper: net '{self.net.name}' carries no state (no input X_0 with an output "
                f"X_T); unroll it to one step with expose_hidden=True")
        self.inputs = [name for name in self.net.inputs if name not in self.pairs]
        self._ties = _input_ties(net_param, self.net)
        #: {X_0: the inputs whose values gate it at the step (its recurrence's cont)}
        self.gated_by = _gating_inputs(net_param, self.pairs, self.inputs)
        #: the states the next call starts from ({X_0: (1, N, size)}), None after reset()
        self.state: dict | None = None
        #: the given states every sequence starts from (reset(state)); None: zeros
        self.initial: dict | None = None
        #: {input: its shape as the net declares it} (the batch it was built for)
        self.declared = {name: tuple(self.net.blobs[name].shape) for name in self.net.inputs}
        self._names = frozenset(self.inputs)
        #: the inputs set by :meth:`set_static`, which the calls do not take
        self.static: frozenset = frozenset()
        self._finals = frozenset(self.pairs.values())
        #: the inputs that gate a state, and the cont each reads after reset(state)
        self._conts = sorted({cont for conts in self.gated_by.values() for cont in conts})
        self._checked: list | None = None  # the conts' shapes the last full check passed

    @property
    def store(self) -> ParamStore:
        return self.net.store

    def reset(self, state: dict | None = None) -> None:
        """Start the next call from zeros, or from ``state`` ({X_0: (1, N, size)}, every
        state of the net; its values are copied), the initial state of every sequence."""
        if state is None:
            self.state = self.initial = None
            return
        missing = sorted(set(self.pairs) - set(state))
        unknown = sorted(set(state) - set(self.pairs))
        if missing or unknown:
            raise ValueError(
                f"Stepper.reset: the states are {sorted(self.pairs)}; "
                + (f"missing {missing}" if missing else f"not a state: {unknown}"))
        ungated = sorted(name for name, conts in self.gated_by.items() if len(conts) != 1)
        if ungated:
            raise NetError(
                f"Stepper.reset: no input of net '{self.net.name}' is the cont that gates "
                f"state(s) {ungated} alone (through Slice, Split, Reshape, Flatten or Concat "
                f"into a Scale by cont, or a unit that takes cont), so a given state cannot "
                f"follow the rule of a recurrence with an initial state")
        xp = self.net.xp
        self.initial = {name: xp.array(value, dtype=self.net.dtype) for name, value in
                        state.items()}
        self.state = dict(self.initial)  # the first step carries the initial state itself
        self._checked = None

    def reorder(self, rows) -> None:
        """Row i of the batch continues row ``rows[i]``: its held state and its initial
        state (``rows`` may be shorter or longer than the batch), as beam search moves
        its hypotheses."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.state is not None:  # else zeros, sized by the next call's batch
            self.state = {name: value[:, rows] for name, value in self.state.items()}
        if self.initial is not None:
            self.initial = {name: value[:, rows] for name, value in self.initial.items()}
            self._checked = None

    def set_static(self, **inputs) -> None:
        """Set ``inputs`` (their values are copied) for every following call to read, until
        set again; the calls no longer take them. Neither a state nor a cont that gates one
        is static (each call changes them), nor an input the net writes into in place.

        >>> import unroll
        >>> text = unroll.to_prototxt(unroll.expand("gru", steps=1, batch=2, input_dim=3,
        ...                                         hidden=4, expose_hidden=True))
        >>> step = Stepper(text)
        >>> step.set_static(x=np.ones((1, 2, 3)))
        >>> step(cont=np.ones((1, 2)))["h"].shape, sorted(step.static)
        ((1, 2, 4), ['x'])
        """
        for name in inputs:
            if name in self.pairs:
                raise ValueError(f"Stepper.set_static: '{name}' is a state the stepper "
                                 f"carries; start from it with reset({{{name!r}: ...}})")
            if name not in self.inputs:
                raise ValueError(f"Stepper.set_static: '{name}' is not an input of the step "
                                 f"net '{self.net.name}' (inputs: {self.inputs})")
            if name in self._conts:
                raise ValueError(f"Stepper.set_static: '{name}' gates state(s) "
                                 f"{sorted(s for s, c in self.gated_by.items() if name in c)}"
                                 f", which every call reads anew; give it to each call")
            if len(self.net.blobs.versions(name)) > 1:
                raise ValueError(f"Stepper.set_static: the step net '{self.net.name}' writes "
                                 f"into input '{name}' in place, so a call cannot read it as "
                                 f"it was set; give it to each call")
        for name, value in inputs.items():
            self.net.set_input(name, value)
        self.static = self.static | inputs.keys()
        self._names = frozenset(self.inputs) - self.static

    def __call__(self, blobs=(), **inputs) -> dict:
        """Run one step on ``inputs`` from the held states; returns {output: data} (and the
        blobs named in ``blobs``), and holds the step's final states for the next call."""
        if inputs.keys() != self._names:
            self._name_error(inputs)
        state = self.state if self.state is not None else self._zeros(inputs)
        if self.initial is not None:
            state, inputs = self._from_initial(state, inputs)
        out = self.net.forward(blobs=blobs, **inputs, **state)
        self.state = {initial: out[final].copy() for initial, final in self.pairs.items()}
        return {name: value.copy() for name, value in out.items() if name not in self._finals}

    def _from_initial(self, state: dict, inputs: dict) -> tuple[dict, dict]:
        """The states and inputs of a step of a recurrence with given initial states: each
        state :func:`restart_from` its initial one where its cont is 0, each gating cont
        then read as :func:`~unroll.frontend.recurrence.first_step_cont` says
        (docs/design.md, "State from anywhere"). A cont of ones (every step of a decoder)
        is both already: the inputs go to the net as they are, which checks them."""
        starting = [name for name in self._conts if not np.all(inputs[name])]
        if not starting:
            return state, inputs
        xp, dtype = self.net.xp, self.net.dtype
        for name in starting:  # the net no longer sees them: checked here, as it would
            if xp is np or not isinstance(inputs[name], xp.ndarray):
                check_cont(name, np.asarray(inputs[name]))
        shapes = [np.shape(inputs[name]) for name in self._conts]
        if shapes != self._checked:  # once per batch shape, not every call
            self._check_conts(state, inputs)
            self._checked = shapes
        state = {name: restart_from(self.initial[name], carried,
                                    xp.asarray(inputs[self.gated_by[name][0]], dtype))
                 if self.gated_by[name][0] in starting else carried
                 for name, carried in state.items()}
        return state, {**inputs, **{name: first_step_cont(xp.asarray(inputs[name], dtype))
                                    for name in starting}}

    def _check_conts(self, state: dict, inputs: dict) -> None:
        for name, (cont,) in self.gated_by.items():
            shape, want = np.shape(inputs[cont]), tuple(state[name].shape)
            if shape != want[:len(shape)] or tuple(self.initial[name].shape) != want:
                raise ValueError(
                    f"Stepper: state '{name}' is held as {tuple(self.initial[name].shape)} "
                    f"(given) and {want} (carried), and its cont '{cont}' is {shape}: each "
                    f"row of the batch needs its cont and its given state")

    def _name_error(self, inputs: dict) -> None:
        given = sorted(set(inputs) & set(self.pairs))
        if given:
            raise ValueError(f"Stepper: {given} are states the stepper carries; start from "
                             f"them with reset({{{given[0]!r}: ...}})")
        static = sorted(set(inputs) & self.static)
        if static:
            raise ValueError(f"Stepper: {static} are static inputs (set_static); set them "
                             f"again to change them")
        missing = sorted(self._names - set(inputs))
        if missing:
            raise ValueError(f"Stepper: the step needs inputs {missing} (inputs: "
                             f"{sorted(self._names)})")
        raise ValueError(f"Stepper: {sorted(set(inputs) - self._names)} are not inputs of the "
                         f"step net '{self.net.name}' (inputs: {sorted(self._names)})")

    def _zeros(self, inputs: dict) -> dict:
        """Zero states, each axis that the net ties to a given input sized as that input."""
        zeros = {}
        for name in self.pairs:
            shape = list(self.net.blobs[name].shape)
            for axis, tied in self._ties.get(name, {}).items():
                shapes = [(np.shape(inputs[other]) if other in inputs else
                           self.net.blobs[other].shape, b) for other, b in tied
                          if other in inputs or other in self.static]
                sizes = {shape[b] for shape, b in shapes if b < len(shape)}
                if len(sizes) == 1:
                    shape[axis] = sizes.pop()
            zeros[name] = self.net.xp.zeros(tuple(shape), self.net.dtype)
        return zeros

    def __repr__(self) -> str:
        held = "zeros" if self.state is None else {k: tuple(v.shape) for k, v in
                                                   self.state.items()}
        return f"Stepper(net {self.net.name!r}, states {sorted(self.pairs)}, holding {held})"


#: layers that move a cont's values without changing them: a gate's cont is traced back
#: through these alone, so an input it is computed from (token ids, say) is never taken
#: for a cont
_MOVES_VALUES = frozenset({"Slice", "Split", "Reshape", "Flatten", "Concat"})


def _gating_inputs(net_param: NetParameter, states, inputs: list) -> dict:
    """{state: the inputs its gate's cont comes from}: the layers that read a state first
    gate it (the unroller checks so), a Scale by its second bottom or a recurrent unit by
    its last (its cont role); the cont is traced back to inputs through layers that only
    move values (an empty list: it comes from no input as it is)."""
    made_by = {}
    for lp in net_param.layer:
        for top in lp.top:
            made_by.setdefault(top, lp)

    def sources(blob, seen) -> set:
        if blob in inputs:
            return {blob}
        lp = made_by.get(blob)
        if lp is None or lp.type not in _MOVES_VALUES or id(lp) in seen:
            return set()
        seen.add(id(lp))
        return set().union(*(sources(b, seen) for b in lp.bottom))

    gated = {}
    for state in states:
        gates = []
        for lp in net_param.layer:
            if state not in lp.bottom or lp.type == "Input":
                continue
            if lp.type == "Scale" and len(lp.bottom) == 2 and lp.bottom[0] == state:
                gates.append(lp.bottom[1])
            elif getattr(LAYERS.get(lp.type), "roles", ()) and lp.bottom[-1] != state:
                gates.append(lp.bottom[-1])
        gated[state] = sorted(set().union(*(sources(g, set()) for g in gates)))
    return gated
