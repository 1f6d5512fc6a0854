"""The checks of an expansion: each step's wiring and gating, then the net's declared shapes.

A step is checked as it is rendered (:func:`check_step`): it makes its states
and outputs, reads every state, lets cont reach every state, and gates each
incoming state by cont before any other layer reads it (docs/design.md, 3.
Unrolling, "Checks at expansion"). The whole net is checked after expansion
(:func:`check_net`): the blobs states start from are made above their
recurrence, the net builds at the T asked for, each declared state and output
comes out in its declared shape, and every param of a shared module is named.

>>> from unroll.core.proto import LayerParameter
>>> gates(LayerParameter(type="Scale", bottom=["h_0", "cont_t0"]), "h_0", "cont_t0")
True
"""

from __future__ import annotations

from unroll.core.errors import NetError, TemplateError, UngatedStateError
from unroll.core.proto import LayerParameter, NetParameter
from unroll.engine.layer import LAYERS
from unroll.engine.net import Net

__all__ = ["check_net", "check_step", "gates", "require"]


def require(template_name: str, blobs: dict, found: set, problem) -> None:
    """Each of ``blobs`` (local name -> blob) is in ``found``; else ``problem(local, blob)``."""
    for local, blob in blobs.items():
        if blob not in found:
            raise TemplateError(f"{template_name}: {problem(local, blob)}")


def gates(lp: LayerParameter, blob: str, cont: str) -> bool:
    """Whether layer ``lp``, reading state ``blob``, multiplies it by ``cont`` or resets it:
    a Scale of it by cont, or a recurrent unit whose roles say it takes a state first and
    cont last (Caffe's LSTMUnit: c = cont * f * c_prev + i * g)."""
    if lp.type == "Scale":
        return list(lp.bottom) == [blob, cont]
    layer = LAYERS.get(lp.type)
    roles = layer.roles if layer is not None else ()
    return (len(roles) == len(lp.bottom) > 1 and roles[0].endswith("_prev")
            and roles[-1] == "cont" and lp.bottom[0] == blob and lp.bottom[-1] == cont
            and blob not in lp.bottom[1:])


def _check_gated(name: str, layers, s, prev: dict, t: int) -> None:
    """Each state entering the step is multiplied by s.cont, or reset by it, before any
    other layer reads it: else a sequence that starts here inherits the last one's state."""
    ungated = {blob: local for local, blob in prev.items()}
    for lp in layers:
        for blob in [b for b in lp.bottom if b in ungated]:
            if not gates(lp, blob, s.cont):
                local = ungated[blob]
                raise UngatedStateError(
                    f"{name}: state '{local}' (s.prev.{local}, '{blob}') is read by "
                    f"layer '{lp.name}' ({lp.type}) at step {t} before s.cont gates it, so a "
                    f"sequence starting there would carry the previous sequence's {local}; "
                    f"multiply it by cont first and read that instead: layer {{ type: "
                    f"\"Scale\" bottom: \"{{{{ s.prev.{local} }}}}\" bottom: \"{{{{ s.cont }}}}\" "
                    f"top: \"{{{{ s.blob('{local}_cont') }}}}\" scale_param {{ axis: 0 }} }} (or "
                    f"hand it, with s.cont, to a unit that resets it: LSTMUnit, GRUUnit)", local)
            if blob in lp.top:  # gated in place: later readers see the gated state
                del ungated[blob]


def check_step(name: str, layers, s, prev: dict, state: dict, extra: dict, t: int) -> None:
    """Step ``t`` of template ``name`` makes its states and outputs, reads every state, and
    lets cont reach them, gated before anything else reads them."""
    tops = {top for lp in layers for top in lp.top}
    for kind, blobs in (("state", state), ("output", extra)):
        require(name, blobs, tops, lambda local, blob, kind=kind: (
            f"step {t} must produce {kind} '{local}' (s.{kind}.{local}, '{blob}'), but no "
            f"layer tops it"))
    require(name, prev, {b for lp in layers for b in lp.bottom}, lambda local, blob: (
        f"step {t} never reads state '{local}' (s.prev.{local}, '{blob}'); every declared "
        f"state must feed the next step"))
    reached = {s.cont}
    for lp in layers:  # rendered in order, so one pass follows every path
        if reached.intersection(lp.bottom):
            reached.update(lp.top)
    require(name, state, reached, lambda local, blob: (
        f"state '{local}' ('{blob}') does not depend on s.cont at step {t}; a step must "
        f"restart its state where a sequence starts (cont 0), e.g. with a Scale of "
        f"s.prev.{local} by s.cont"))
    _check_gated(name, layers, s, prev, t)


# -- the expanded net ---------------------------------------------------------------------


def _initial_blobs(template, net: NetParameter, builder) -> None:
    """Each blob a recurrent layer starts from is made by a layer above it, or an input."""
    for where, state, blob in builder.initial_blobs:
        first = next((lp for lp in net.layer if blob in lp.bottom or blob in lp.top), None)
        if first is None or blob not in first.top:
            raise TemplateError(
                f"{template.name}: {where} starts state '{state}' from blob '{blob}', which no "
                f"layer above the recurrence makes; it must be a (1, N, size) blob made by a "
                f"layer before the recurrent() call, or an input of the net"
            )


def _net_of(net_param: NetParameter, builder):
    """(the Net of ``net_param``, keeping the declared blobs, None), or (None, its NetError)."""
    try:
        return Net(net_param, keep=[blob for _, blob, _, _ in builder.declared]), None
    except NetError as e:
        return None, e


def _declared(net, builder) -> None:
    """Each declared state and output comes out of its step in the declared shape."""
    for where, blob, want, what in builder.declared:
        found = tuple(net.blobs[blob].shape)
        if len(found) != len(want) or any(w is not None and w != f for w, f in zip(want, found)):
            shape = "(" + ", ".join("..." if w is None else str(w) for w in want) + ")"
            raise TemplateError(
                f"{where}: {what} ('{blob}') comes out {found}, but must be {shape}: "
                f"(1, N, size) per step (an InnerProduct without axis: 2 flattens N away)"
            )


def _initial_shapes(net_param: NetParameter, builder) -> None:
    """Each blob a recurrence starts from is (1, N, size), built up to its first reader: a
    wrong one would break the recurrence's first step, which says less."""
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


def _shared_params(net, builder) -> None:
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


def check_net(template, net_param: NetParameter, builder, one_step=None) -> None:
    """Check the expanded ``net_param``: its initial blobs, then build it at the T it was
    unrolled to and check its declared shapes and its modules' params.

    Where it does not build, ``one_step()`` (the same unrolled to one step: net, builder)
    may say why better: a state of the wrong shape breaks the step after it, far from the
    mistake."""
    _initial_blobs(template, net_param, builder)
    net, error = _net_of(net_param, builder)
    if error is not None:
        _initial_shapes(net_param, builder)
        try:  # T-dependent structure may not unroll to one step: then T's error stands
            small_param, small_builder = one_step() if one_step is not None else (None, None)
        except TemplateError:
            small_param = None
        if small_param is not None:
            small, _ = _net_of(small_param, small_builder)
            if small is not None:
                _declared(small, small_builder)
        raise TemplateError(f"{template.name}: the net unrolled to {builder.T} step(s) does not "
                            f"build: {error}") from None
    _declared(net, builder)
    _shared_params(net, builder)
