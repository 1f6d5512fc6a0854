"""Solvers: Caffe's SGD, Nesterov, AdaGrad, RMSProp, AdaDelta and Adam, with snapshots.

One :class:`Solver` runs every solver type with BVLC Caffe's update math,
step for step (``sgd_solver.cpp``, ``nesterov_solver.cpp``, ``adam_solver.cpp``,
...). One update (Caffe's ``ApplyUpdate``) is, in this order:

1. the learning rate of the current iteration (``lr_policy``: fixed, step, exp,
   inv, multistep, poly, sigmoid);
2. ``clip_gradients``: if the global L2 norm of every learnable diff exceeds
   it, all diffs are scaled in place to that norm. As in Caffe this sees the
   diffs summed over ``iter_size`` passes, before they are averaged;
3. per param: average over ``iter_size`` (``diff *= 1 / iter_size``), weight
   decay (L2: ``diff += weight_decay * decay_mult * data``; L1 with
   ``sign(data)``), then the type's update value with ``local_lr = rate *
   lr_mult``; e.g. SGD: ``h = momentum * h + local_lr * diff; diff = h``;
4. ``data -= diff`` and ``iter += 1``.

Solver types live in a registry, as Caffe's ``REGISTER_SOLVER_CLASS``: each is
an update function registered with :func:`register_solver`, with its number of
history slots and its parameter checks, so a new one can be added from
outside the package.

Params and diffs live in the net's :class:`~unroll.engine.param_store.ParamStore`,
packed into one buffer each, and the history in one buffer per slot: clearing
and clipping are whole-buffer operations, step 3 runs once per run of adjacent
params (``lr_mult`` and ``decay_mult`` become per-element arrays where they
differ, with the same arithmetic, so the same bits), and with a communicator (``comm=``,
see :mod:`unroll.train.distributed`) the gradients of all ranks are summed in ONE
all-reduce before each update. The sum is divided by the number of ranks in
step 3 together with ``iter_size`` (after clipping), so N ranks on N different
batches equal one process with ``iter_size: N`` over the same batches, as in
Caffe's multi-GPU training. Rank 0 broadcasts the params at the start and
after a restore, and writes the snapshots.

Only the net's ``learnable_params`` are updated: the owners of shared params,
each exactly once, in place (sharers hold views of the owner's memory). A
param with ``lr_mult: 0`` is left alone entirely (its history stays zero).
After an update the diffs hold the applied step, not the gradient, as in Caffe.

Hyper-parameters live in a ``SolverParameter`` (``solver.param``), so they have
caffe.proto's float32 precision, as in Caffe: ``base_lr=0.01`` is
``0.009999999776482582``. Scalars enter the update in the net's dtype.

Snapshots are Caffe's binary files: ``{prefix}_iter_{N}.caffemodel`` (a
NetParameter with the weights) and ``{prefix}_iter_{N}.solverstate`` (a
SolverState: iter, the model's file name, the history blobs -- Adam's and
AdaDelta's 2 x N of them in Caffe's order -- and the multistep position).
History is stored in the net's dtype (float64 in ``double_data``), so
restoring and continuing gives bit-identical weights to an uninterrupted run.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import logging
import math
import operator
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np

from unroll.core.atomic import write_files_atomic
from unroll.core.proto import (
    NetParameter,
    SolverParameter,
    SolverState,
    array_from_blob_proto,
    blob_proto_from_array,
    read_binary,
    read_message,
)
from unroll.engine.backend import device_of, module_of, to_numpy
from unroll.engine.kernels import default_engine, fused_kernels
from unroll.engine.param_store import LearnableParam, ParamStore
from unroll.train.distributed import Comm

__all__ = ["LR_POLICIES", "LR_POLICY_FIELDS", "NONFINITE_POLICIES", "NonFiniteError", "SOLVERS",
           "SkippedStep", "Solver", "SolverError", "SolverType", "TrainableNet", "register_solver",
           "usual_fields"]

log = logging.getLogger(__name__)

_LEGACY_TYPES = {  # SolverParameter.solver_type (enum, deprecated in Caffe) -> type
    SolverParameter.SGD: "SGD",
    SolverParameter.NESTEROV: "Nesterov",
    SolverParameter.ADAGRAD: "AdaGrad",
    SolverParameter.RMSPROP: "RMSProp",
    SolverParameter.ADADELTA: "AdaDelta",
    SolverParameter.ADAM: "Adam",
}

#: Caffe's learning-rate policies (``lr_policy``); an unset policy means "fixed".
LR_POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")

#: the fields each lr policy needs given explicitly -> an example value: Caffe's default (0,
#: none) would silently make the rate 0 after the first step ("step", "exp", "multistep") or
#: constant ("inv", "poly", "sigmoid", "multistep" without steps)
LR_POLICY_FIELDS = {
    "step": {"gamma": 0.1},
    "exp": {"gamma": 0.999},
    "inv": {"gamma": 1e-4, "power": 0.75},
    "multistep": {"gamma": 0.1, "stepvalue": [10000, 20000]},
    "poly": {"power": 1.0},
    "sigmoid": {"gamma": 0.01},
}

# Fields of a Caffe solver file that concern what the caller owns here: the net
# (passed in), test nets, and the device (the net's). Set, they draw a warning.
_IGNORED_FIELDS = (
    "net", "net_param", "train_net", "train_net_param", "train_state", "test_net",
    "test_net_param", "test_state", "test_iter", "test_interval", "test_compute_loss",
    "test_initialization", "solver_mode", "device_id", "snapshot_diff", "layer_wise_reduce",
    "debug_info",
)



class SolverError(ValueError):
    """A solver setting, snapshot or net that the solver cannot use; says which and why."""


#: what a Solver does with an iteration whose loss or gradient is not finite: None applies
#: it (Caffe's behaviour, no read), "stop" raises, "skip" leaves it out (up to max_skipped)
NONFINITE_POLICIES = (None, "stop", "skip")


@dataclasses.dataclass(frozen=True)
class SkippedStep:
    """An iteration whose update was not applied: its loss or a gradient was not finite."""

    iter: int
    loss: float
    gradient_norm: float


class NonFiniteError(SolverError):
    """A non-finite loss or gradient that the solver's ``nonfinite`` policy does not allow
    (``"stop"``, or one more skip than ``max_skipped``); raised before the update, so the
    weights are those of the last good iteration. ``step`` says which iteration and why."""

    def __init__(self, message: str, step: SkippedStep):
        super().__init__(message)
        self.step = step


class TrainableNet(Protocol):
    """The net interface a :class:`Solver` drives: a Net, a BucketedModel, or your own.

    ``forward(**inputs)`` sets ``loss`` (a net may also offer ``device_loss``, the
    same value left on its device: the solver then reads losses back only when
    they are displayed or asked for); ``backward()`` ADDS the gradients into
    the param diffs; ``learnable_params`` are the owners the solver updates,
    all held by ``store`` (the solver clears and reduces the store's diffs);
    ``to_proto()``/``copy_from()`` write and read the weights as a .caffemodel.
    """

    loss: float
    learnable_params: list[LearnableParam]
    store: ParamStore

    def forward(self, **inputs) -> dict: ...

    def backward(self) -> None: ...

    def to_proto(self) -> NetParameter: ...

    def copy_from(self, source, strict: bool = False) -> None: ...


_NET_MEMBERS = tuple(TrainableNet.__annotations__) + tuple(
    name for name, value in vars(TrainableNet).items()
    if callable(value) and not name.startswith("_")
)


def _bad(field: str, expected: str, found) -> SolverError:
    return SolverError(f"solver field '{field}': expected {expected}, found {found!r}")


def _pow(base: float, exponent: float) -> float:
    """``base ** exponent`` that gives inf on overflow, as C's pow does."""
    try:
        return float(base) ** exponent
    except OverflowError:
        return math.inf


# -- the registry of solver types ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SolverType:
    """A registered solver type: Caffe's ``type`` name, history slots, update and checks."""

    name: str
    slots: int
    update: Callable
    check: Callable[[SolverParameter], None]
    elementwise: bool = True
    #: fields this type needs given explicitly -> their usual value (for the error and
    #: for callers that want the usual settings: :func:`usual_fields`)
    required: Mapping = dataclasses.field(default_factory=dict)


#: Registered solver types by Caffe's ``type`` string (see :func:`register_solver`).
SOLVERS: dict[str, SolverType] = {}


def register_solver(name: str, slots: int, check: Callable[[SolverParameter], None] = None,
                    elementwise: bool = True, required: Mapping | None = None):
    """Register an update function as solver type ``name`` (Caffe's REGISTER_SOLVER_CLASS).

    ``update(diff, history, rate, solver)`` is Caffe's ComputeUpdateValue:
    ``diff`` holds the regularized gradient and must be left holding the step
    (``data -= diff`` follows); ``history`` is ``slots`` arrays like ``diff``,
    zero at first and saved in snapshots; ``rate`` is the local learning rate
    (``lr * lr_mult``) in the params' dtype; ``solver`` gives ``param`` (the
    SolverParameter), ``iter`` and ``scratch(like)``, a reusable work array.
    An ``elementwise`` rule (each element's step depends on that element only,
    as in every built-in) gets whole runs of adjacent params of the flat
    buffers at once, flat, with ``rate`` an array where their ``lr_mult``
    differ; give ``elementwise=False`` for a rule that needs each param whole
    (a per-param norm), which then gets one param at a time in its shape.
    ``check(param)`` raises :class:`SolverError` for settings the type cannot use.
    ``required`` maps the fields the type needs given explicitly to their usual
    value: where Caffe's default for an unset field would silently change the
    method (Adam's ``momentum`` is beta1; unset it is 0), leaving it unset is
    an error naming the field and that value. Names are matched in any case.

    >>> @register_solver("SignSGD", slots=0)
    ... def sign_sgd(diff, history, rate, solver):
    ...     diff[...] = rate * module_of(diff).sign(diff)
    >>> "SignSGD" in SOLVERS
    True
    >>> del SOLVERS["SignSGD"]
    """
    if not isinstance(slots, int) or slots < 0:
        raise ValueError(f"register_solver('{name}'): slots must be an integer >= 0, not {slots!r}")

    def register(update: Callable) -> Callable:
        if any(known.lower() == name.lower() for known in SOLVERS):
            raise ValueError(f"a solver type named '{name}' is already registered")
        SOLVERS[name] = SolverType(name, slots, update, check or (lambda param: None),
                                   elementwise, dict(required or {}))
        return update

    return register


def _momentum_below_one(kind: str, *names: str):
    def check(p: SolverParameter) -> None:
        for name in names:
            if not 0 <= getattr(p, name) < 1:
                raise _bad(name, f"a number in [0, 1) for {kind}", getattr(p, name))
    return check


def _adaptive(kind: str, *extra):
    """Checks of the types that divide by a running magnitude: ``delta > 0``, then ``extra``."""
    def check(p: SolverParameter) -> None:
        if p.delta <= 0:
            raise _bad("delta", f"a number > 0 for {kind}", p.delta)
        for more in extra:
            more(p)
    return check


def _no_momentum(kind: str):
    def check(p: SolverParameter) -> None:
        if p.momentum != 0:
            raise _bad("momentum", f"0: momentum cannot be used with {kind}", p.momentum)
    return check


@register_solver("SGD", slots=1, check=_momentum_below_one("SGD", "momentum"))
def _sgd(diff, history, rate, solver) -> None:
    (h,) = history
    h *= diff.dtype.type(solver.param.momentum)
    h += rate * diff
    diff[...] = h


@register_solver("Nesterov", slots=1, check=_momentum_below_one("Nesterov", "momentum"),
                 required={"momentum": 0.9})
def _nesterov(diff, history, rate, solver) -> None:
    (h,) = history
    dt = diff.dtype.type
    momentum = dt(solver.param.momentum)
    previous = h.copy()
    h *= momentum
    h += rate * diff
    diff[...] = (dt(1) + momentum) * h
    diff -= momentum * previous


@register_solver("AdaGrad", slots=1, check=_adaptive("AdaGrad", _no_momentum("AdaGrad")))
def _adagrad(diff, history, rate, solver) -> None:
    (h,) = history
    dt = diff.dtype.type
    h += diff * diff
    diff /= (h ** dt(0.5)) + dt(solver.param.delta)
    diff *= rate


@register_solver("RMSProp", slots=1, check=_adaptive(
    "RMSProp", _no_momentum("RMSProp"), _momentum_below_one("RMSProp", "rms_decay")),
    required={"rms_decay": 0.99})
def _rmsprop(diff, history, rate, solver) -> None:
    (h,) = history
    dt = diff.dtype.type
    decay = dt(solver.param.rms_decay)
    h *= decay
    h += (dt(1) - decay) * (diff * diff)
    diff /= (h ** dt(0.5)) + dt(solver.param.delta)
    diff *= rate


@register_solver("AdaDelta", slots=2,
                 check=_adaptive("AdaDelta", _momentum_below_one("AdaDelta", "momentum")),
                 required={"momentum": 0.95, "delta": 1e-6})
def _adadelta(diff, history, rate, solver) -> None:
    h_grad, h_step = history
    dt = diff.dtype.type
    momentum, delta = dt(solver.param.momentum), dt(solver.param.delta)
    h_grad *= momentum
    h_grad += (dt(1) - momentum) * (diff * diff)
    diff *= ((h_step + delta) / (h_grad + delta)) ** dt(0.5)
    h_step *= momentum
    h_step += (dt(1) - momentum) * (diff * diff)
    diff *= rate


@register_solver("Adam", slots=2, check=_adaptive(
    "Adam", _momentum_below_one("Adam (its beta1, beta2)", "momentum", "momentum2")),
    required={"momentum": 0.9, "momentum2": 0.999})
def _adam(diff, history, rate, solver) -> None:
    m, v = history
    xp, dt = module_of(diff), diff.dtype.type
    beta1, beta2 = dt(solver.param.momentum), dt(solver.param.momentum2)
    t = solver.iter + 1
    correction = dt(math.sqrt(1.0 - _pow(beta2, t)) / (1.0 - _pow(beta1, t)))
    kernels = fused_kernels(xp) if default_engine() == "fused" else None
    if kernels is not None and all(a.flags.c_contiguous for a in (diff, m, v)):
        # one pass over the span (one launch on a GPU) instead of eleven
        kernels.adam_update(diff, m, v, beta1, beta2, solver.param.delta, rate * correction)
        return
    # in place, through one scratch buffer: an embedding table's update would
    # otherwise allocate several table-sized temporaries per iteration
    scratch = solver.scratch(diff)
    xp.multiply(diff, diff, out=scratch)
    scratch *= dt(1) - beta2
    v *= beta2
    v += scratch
    m *= beta1
    diff *= dt(1) - beta1
    m += diff
    xp.sqrt(v, out=scratch)
    scratch += dt(solver.param.delta)
    xp.divide(m, scratch, out=diff)
    diff *= rate * correction


# -- spans of the flat buffers -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Span:
    """Params adjacent in the flat buffers that one pass of array operations updates.

    ``lr_mult`` and ``decay_mult`` are scalars of the buffers' dtype, or arrays
    with one value per element where the params differ; ``decay_mult`` is None
    when no param of the span decays (Caffe skips those, so they stay apart).
    """

    start: int
    stop: int
    shape: tuple
    lr_mult: object
    decay_mult: object


def _spans(params, elementwise: bool, weight_decay: float, like) -> list[_Span]:
    """The spans over ``params`` that an update visits; params with ``lr_mult`` 0 are left out."""
    dt, xp = like.dtype.type, module_of(like)

    def decays(p) -> bool:
        return bool(dt(weight_decay) * dt(p.decay_mult))

    def per_element(run, attr):
        values = [dt(getattr(p, attr)) for p in run]
        if all(v == values[0] for v in values):
            return values[0]
        return xp.concatenate([xp.full(p.blob.count, v, like.dtype) for p, v in zip(run, values)])

    runs: list[list] = []
    for p in sorted((p for p in params if p.lr_mult != 0), key=lambda p: p.offset):
        last = runs[-1][-1] if runs else None
        if (elementwise and last is not None and last.offset + last.blob.count == p.offset
                and decays(last) == decays(p)):
            runs[-1].append(p)
        else:
            runs.append([p])
    spans = []
    for run in runs:
        start, stop = run[0].offset, run[-1].offset + run[-1].blob.count
        shape = (stop - start,) if elementwise else run[0].blob.shape
        decay = per_element(run, "decay_mult") if decays(run[0]) else None
        spans.append(_Span(start, stop, shape, per_element(run, "lr_mult"), decay))
    return spans


# -- building the SolverParameter --------------------------------------------------


def _set_field(param: SolverParameter, name: str, value) -> None:
    fd = param.DESCRIPTOR.fields_by_name.get(name)
    if fd is None:
        close = difflib.get_close_matches(name, param.DESCRIPTOR.fields_by_name, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise TypeError(f"Solver() got an unknown SolverParameter field '{name}'{hint}")
    try:
        if fd.is_repeated:
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                value = [value]
            container = getattr(param, name)
            del container[:]
            if fd.message_type is not None:
                for v in value:
                    container.add().CopyFrom(v)
            else:
                container.extend(value)
        elif fd.message_type is not None:
            getattr(param, name).CopyFrom(value)
        else:
            if (fd.cpp_type in (fd.CPPTYPE_INT32, fd.CPPTYPE_INT64)
                    and isinstance(value, float) and value.is_integer()):
                value = int(value)
            setattr(param, name, value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"Solver() field '{name}': cannot take {value!r}: {e}") from None


def _solver_type(param: SolverParameter) -> SolverType:
    if param.HasField("solver_type"):
        if param.HasField("type"):
            raise SolverError(
                "solver fields 'type' and 'solver_type' are both set; give only 'type' "
                "(solver_type is Caffe's deprecated enum)"
            )
        return SOLVERS[_LEGACY_TYPES[param.solver_type]]
    for name, kind in SOLVERS.items():
        if name.lower() == param.type.lower():
            return kind
    raise _bad("type", f"one of the registered solvers {list(SOLVERS)}", param.type)


def _check_param(param: SolverParameter, kind: SolverType) -> str:
    """Validate ``param`` for solver ``kind``; returns the lr policy ("fixed" if unset)."""
    p = param
    if not p.HasField("base_lr"):
        raise SolverError("solver field 'base_lr' is not set; give the base learning rate")
    for name in ("base_lr", "gamma", "power", "momentum", "momentum2", "weight_decay", "delta",
                 "rms_decay", "clip_gradients"):
        if not math.isfinite(getattr(p, name)):
            raise _bad(name, "a finite number", getattr(p, name))
    for name in ("base_lr", "weight_decay", "momentum", "gamma", "delta"):
        if getattr(p, name) < 0:
            raise _bad(name, "a number >= 0", getattr(p, name))
    for name, minimum in (("iter_size", 1), ("average_loss", 1), ("max_iter", 0),
                          ("display", 0), ("snapshot", 0), ("stepsize", 0)):
        if getattr(p, name) < minimum:
            raise _bad(name, f"an integer >= {minimum}", getattr(p, name))
    if p.regularization_type not in ("L1", "L2"):
        raise _bad("regularization_type", '"L2" or "L1"', p.regularization_type)
    policy = p.lr_policy or "fixed"
    if policy not in LR_POLICIES:
        raise _bad("lr_policy", f"one of {list(LR_POLICIES)}", p.lr_policy)
    if policy in ("step", "sigmoid") and p.stepsize <= 0:
        raise _bad("stepsize", f"an integer > 0 for lr_policy \"{policy}\"", p.stepsize)
    if policy == "poly":
        if p.max_iter <= 0:
            raise _bad("max_iter", 'an integer > 0 for lr_policy "poly"', p.max_iter)
        if p.power < 0:
            raise _bad("power", 'a number >= 0 for lr_policy "poly"', p.power)
    if policy == "multistep":
        values = list(p.stepvalue)
        if any(b <= a for a, b in zip(values, values[1:])) or any(v < 0 for v in values):
            raise _bad("stepvalue", "increasing iterations >= 0", values)
    if p.HasField("clip_gradients") and p.clip_gradients <= 0:
        raise _bad("clip_gradients", "a norm > 0 (leave it unset for no clipping)",
                   p.clip_gradients)
    kind.check(p)
    _require_set(p, kind.required, kind.name, "usually")
    _require_set(p, LR_POLICY_FIELDS.get(policy, {}), f'lr_policy "{policy}"', "e.g.")
    if p.snapshot_format != SolverParameter.BINARYPROTO:
        raise _bad("snapshot_format", "BINARYPROTO (unroll writes no HDF5)",
                   SolverParameter.SnapshotFormat.Name(p.snapshot_format))
    if p.snapshot and not p.snapshot_prefix:
        raise SolverError(
            f"solver field 'snapshot' is {p.snapshot} but 'snapshot_prefix' is not set; "
            f"give the prefix of the snapshot files"
        )
    return policy


def _is_set(p: SolverParameter, name: str) -> bool:
    fd = p.DESCRIPTOR.fields_by_name[name]
    return len(getattr(p, name)) > 0 if fd.is_repeated else p.HasField(name)


def _require_set(p: SolverParameter, fields: Mapping, what: str, hint: str) -> None:
    """Each of ``fields`` is set, to any value, 0 included (presence, not value, tells): an
    unset one is an error naming it, Caffe's default for it and a value to give."""
    for name, value in fields.items():
        if not _is_set(p, name):
            fd = p.DESCRIPTOR.fields_by_name[name]
            default = "none" if fd.is_repeated else f"{fd.default_value:g}"
            raise SolverError(
                f"solver field '{name}' is not set, and {what} needs it: Caffe would use its "
                f"default ({default}) without a word; give it explicitly ({hint} "
                f"{name}={value!r}); a value given is used as given, 0 included"
            )


def usual_fields(type: str) -> dict:
    """The fields solver ``type`` needs given explicitly, at their usual values.

    >>> usual_fields("adam")
    {'momentum': 0.9, 'momentum2': 0.999}
    """
    return dict(_solver_type(SolverParameter(type=type)).required)


# -- atomic files --------------------------------------------------------------------


# -- the solver ------------------------------------------------------------------------


class Solver:
    """Trains ``net`` with one of Caffe's solvers; snapshots and restores exactly.

    ``solver_param`` is a SolverParameter, a solver prototxt path or prototxt
    text (a Caffe ``solver.prototxt``); keywords set SolverParameter fields on
    top of it (``type``, ``base_lr``, ``momentum``, ``momentum2``, ``delta``,
    ``weight_decay``, ``regularization_type``, ``lr_policy``, ``gamma``,
    ``power``, ``stepsize``, ``stepvalue``, ``max_iter``, ``clip_gradients``,
    ``iter_size``, ``average_loss``, ``snapshot``, ``snapshot_prefix``, ...).
    ``type`` is one of ``SOLVERS`` (any case); an unset ``lr_policy`` is
    "fixed". Fields about test nets and devices are ignored with a warning:
    the solver trains the net it is given, on that net's device. ``weights``
    are loaded into the net at construction, as Caffe does.

    Fields whose Caffe default would silently change the method must be
    given (Adam's ``momentum`` and ``momentum2``, the ``gamma`` of a decaying
    ``lr_policy``, ...: :func:`usual_fields`, :data:`LR_POLICY_FIELDS`); a value
    given is used as given, 0 included.

    ``nonfinite`` says what an iteration whose loss or gradient is not finite
    does (checked after the gradients of every pass and rank are summed, so
    every rank decides alike): None applies it, as Caffe does; ``"stop"``
    raises :class:`NonFiniteError` before the update; ``"skip"`` leaves the
    weights and history as they are, counts the iteration (``iter`` and the
    lr schedule move on, so ``feed(k)`` asks for the next batch) and records
    it in ``skipped``, a list of :class:`SkippedStep`; skip number
    ``max_skipped + 1`` raises. A policy costs one read from the device per
    iteration (the loss, made NaN there when a gradient is not finite).

    ``net`` is a :class:`TrainableNet`: a :class:`unroll.engine.net.Net` or a
    bucketed model. The solver packs its store into flat buffers
    (:meth:`~unroll.engine.param_store.ParamStore.pack`). ``comm`` (from
    :func:`unroll.train.distributed.init`) trains data-parallel: every rank runs
    its own batches, the gradients are summed across ranks before each update,
    and only rank 0 writes snapshots.

    Attributes: ``iter`` (updates done), ``loss`` (mean of the last
    ``average_loss`` iteration losses), ``rate`` (learning rate of the last
    update), ``param`` (the SolverParameter), ``type``, ``history`` (Caffe's
    history blobs: for Adam the N first moments, then the N second moments).

    >>> import numpy as np
    >>> from unroll.engine.net import Net
    >>> net = Net('''
    ...   layer { name: "in" type: "Input" top: "x" top: "y"
    ...           input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
    ...   layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p"
    ...           inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
    ...   layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }''')
    >>> solver = Solver(net, type="Adam", base_lr=0.01, momentum=0.9, momentum2=0.999,
    ...                 lr_policy="step", gamma=0.5, stepsize=100, nonfinite="stop")
    >>> x, y = np.ones((4, 3)), np.zeros((4, 2))
    >>> loss = solver.step(3, feed=lambda i: {"x": x, "y": y})
    >>> solver.iter
    3
    """

    def __init__(self, net: TrainableNet, solver_param=None, comm: Comm | None = None,
                 nonfinite: str | None = None, max_skipped: int | None = None, **fields):
        if nonfinite not in NONFINITE_POLICIES:
            raise SolverError(f"nonfinite: expected one of {list(NONFINITE_POLICIES)}, found "
                              f"{nonfinite!r}")
        if (nonfinite == "skip") != (max_skipped is not None):
            raise SolverError(
                f"max_skipped goes with nonfinite=\"skip\" (how many iterations may be "
                f"skipped in all); found nonfinite={nonfinite!r}, max_skipped={max_skipped!r}"
            )
        if max_skipped is not None and (not isinstance(max_skipped, int) or max_skipped < 0):
            raise SolverError(f"max_skipped: expected an integer >= 0, found {max_skipped!r}")
        self.nonfinite = nonfinite
        self.max_skipped = max_skipped
        #: the iterations skipped under nonfinite="skip", oldest first
        self.skipped: list[SkippedStep] = []
        missing = [name for name in _NET_MEMBERS if not hasattr(net, name)]
        if missing:
            raise TypeError(
                f"Solver needs a net with {', '.join(_NET_MEMBERS)}; "
                f"{type(net).__name__} lacks {', '.join(missing)}"
            )
        param = SolverParameter()
        if solver_param is not None:
            param.CopyFrom(read_message(solver_param, SolverParameter))
        if "type" in fields and "solver_type" in fields:
            raise SolverError("give 'type' or 'solver_type', not both ('type' is Caffe's current)")
        for name, value in fields.items():
            _set_field(param, name, value)
        if "type" in fields:  # a keyword overrides the file's type, whichever way it gave it
            param.ClearField("solver_type")
        elif "solver_type" in fields:
            param.ClearField("type")
        self._kind = _solver_type(param)
        self.type = self._kind.name
        param.ClearField("solver_type")
        param.type = self.type
        self.lr_policy = _check_param(param, self._kind)
        self.param = param
        self.net = net
        self.comm = comm if comm is not None else Comm()
        self._store = net.store
        self.iter = 0
        self._scratch_arrays: dict = {}
        self._span_key: tuple = ()
        self._span_list: list[_Span] = []
        self.current_step = 0
        self.rate = float("nan")
        self._losses: collections.deque = collections.deque(maxlen=param.average_loss)
        #: None, or a :class:`unroll.engine.cuda_graph.StepGraphs` that replays each step's
        #: clear, forward and backward as one CUDA graph (iter_size 1)
        self.graphs = None
        self._names: list[str] = []
        self._history_buffers: list = []  # per slot: one buffer laid out as the store's
        self._history: list[list] = []  # per learnable param: views of its history slots
        ignored = [
            name for name in _IGNORED_FIELDS
            if (len(getattr(param, name)) if param.DESCRIPTOR.fields_by_name[name].is_repeated
                else param.HasField(name))
        ]
        if ignored:
            warnings.warn(
                f"Solver ignores the SolverParameter fields {ignored}: it trains the net it is "
                f"given, on that net's device, and runs no test nets",
                stacklevel=2,
            )
        if param.random_seed >= 0:
            if callable(getattr(net, "seed", None)):
                net.seed(param.random_seed)
            else:
                warnings.warn(
                    f"solver field 'random_seed' ({param.random_seed}) is ignored: "
                    f"{type(net).__name__} has no seed() method; seed the net when you build it",
                    stacklevel=2,
                )
        for weights in param.weights:
            net.copy_from(weights)
        self._sync_history()
        if self._store.data is not None and self.comm.device not in (
            None, device_of(module_of(self._store.data))
        ):
            raise SolverError(
                f"the net's params are on the {device_of(module_of(self._store.data))}, but "
                f"{self.comm!r} reduces arrays on the {self.comm.device}: get the communicator "
                f"with unroll.train.distributed.init(device) for the net's device"
            )
        self._broadcast()

    def __repr__(self) -> str:
        return (f"Solver(type={self.type!r}, iter={self.iter}, lr_policy={self.lr_policy!r}, "
                f"base_lr={self.param.base_lr:g})")

    # -- history ----------------------------------------------------------------------
    def _sync_history(self) -> list:
        """The learnable params, packed, with zero history for any that appeared since."""
        params = list(self.net.learnable_params)
        if len(params) < len(self._names) or any(
            p.name != name for p, name in zip(params, self._names)
        ):
            raise SolverError(
                f"the net's learnable params changed under the solver: it had "
                f"{self._names}, now has {[p.name for p in params]}"
            )
        if self._store.pack():
            self._grow_history()
        for p in params[len(self._history):]:
            if p.offset < 0:
                raise SolverError(
                    f"learnable param '{p.name}' is not in the net's store: a net must keep "
                    f"every learnable param in its ParamStore"
                )
            self._names.append(p.name)
            self._history.append([])
        for p, hist in zip(params, self._history):
            if not hist:
                hist.extend(self._history_view(p, slot) for slot in range(self._kind.slots))
        return params

    def _history_view(self, p: LearnableParam, slot: int):
        end = p.offset + p.blob.count
        return self._history_buffers[slot][p.offset:end].reshape(p.blob.shape)

    def _grow_history(self) -> None:
        """Buffers for the store's new size: old values kept (packing only appends)."""
        xp, size = module_of(self._store.data), self._store.data.size
        grown = []
        for old in self._history_buffers or [None] * self._kind.slots:
            new = xp.zeros(size, self._store.data.dtype)
            if old is not None:
                new[: old.size] = old
            grown.append(new)
        self._history_buffers = grown
        for hist in self._history:
            hist.clear()

    @property
    def history(self) -> list:
        """The history arrays in Caffe's order: slot 0 of every param, then slot 1 (Adam: m, v)."""
        self._sync_history()
        return [h[s] for s in range(self._kind.slots) for h in self._history]

    def _broadcast(self) -> None:
        """Rank 0's params and history on every rank."""
        if self._store.data is None:
            return
        for buffer in (self._store.data, *self._history_buffers):
            self.comm.broadcast(buffer)

    # -- learning rate ------------------------------------------------------------------
    def _learning_rate(self, it: int, current_step: int) -> tuple[float, int]:
        """Caffe's GetLearningRate at iteration ``it``: (rate, new multistep position)."""
        p = self.param
        policy = self.lr_policy
        if policy == "fixed":
            rate = p.base_lr
        elif policy == "step":
            current_step = it // p.stepsize
            rate = p.base_lr * _pow(p.gamma, current_step)
        elif policy == "exp":
            rate = p.base_lr * _pow(p.gamma, it)
        elif policy == "inv":
            rate = p.base_lr * _pow(1.0 + p.gamma * it, -p.power)
        elif policy == "multistep":
            if current_step < len(p.stepvalue) and it >= p.stepvalue[current_step]:
                current_step += 1
            rate = p.base_lr * _pow(p.gamma, current_step)
        elif policy == "poly":  # clamped at 0 past max_iter, where Caffe's formula breaks down
            rate = p.base_lr * _pow(max(0.0, 1.0 - it / p.max_iter), p.power)
        else:  # sigmoid
            z = -p.gamma * (it - p.stepsize)
            rate = 0.0 if z > 700 else p.base_lr / (1.0 + math.exp(z))
        if not math.isfinite(rate):
            raise SolverError(
                f"lr_policy \"{policy}\" gives learning rate {rate} at iteration {it} "
                f"(base_lr {p.base_lr:g}, gamma {p.gamma:g}, power {p.power:g})"
            )
        return rate, current_step

    def get_learning_rate(self) -> float:
        """The learning rate the next update will use (at ``self.iter``); changes nothing."""
        return self._learning_rate(self.iter, self.current_step)[0]

    # -- one update ---------------------------------------------------------------------
    def update(self) -> bool:
        """Apply one update from the gradients now in the net's diffs (Caffe's ApplyUpdate).

        For loops that run forward and backward themselves; :meth:`step` calls
        it. Increments ``iter``. Returns whether the update was applied: False
        for an iteration skipped by ``nonfinite="skip"`` (the net's last loss is
        the one checked).
        """
        return self._update(_unread_loss(self.net) if self.nonfinite is not None else None)[0]

    def _update(self, loss) -> tuple[bool, float | None]:
        """The update after a pass whose (summed) loss is ``loss``: (applied, the loss read
        back by the non-finite check, or None when there is no policy)."""
        params = self._sync_history()
        rate, current_step = self._learning_rate(self.iter, self.current_step)
        self.rate = rate
        if self.param.display and self.iter % self.param.display == 0 and self.comm.rank == 0:
            log.info("Iteration %d, lr = %g", self.iter, rate)
        if self._store.diff is not None:
            self.comm.allreduce_sum(self._store.diff)
        checked = None
        if self.nonfinite is not None:
            checked = self._checked_loss(loss)
            if not math.isfinite(checked):
                self._skip(loss)
                self.current_step = current_step
                self.iter += 1
                return False, checked
        self.current_step = current_step
        if self._store.diff is not None:
            self.clip_gradients()
        passes = self.param.iter_size * self.comm.size  # gradients summed so far
        data, diff = self._store.data, self._store.diff
        for span in self._spans(params):
            where = slice(span.start, span.stop)
            d, w = diff[where].reshape(span.shape), data[where].reshape(span.shape)
            dt = d.dtype.type
            if passes != 1:  # Normalize
                d *= dt(1) / dt(passes)
            if span.decay_mult is not None:  # Regularize
                local_decay = dt(self.param.weight_decay) * span.decay_mult
                d += local_decay * (w if self.param.regularization_type == "L2"
                                    else module_of(w).sign(w))
            history = [h[where].reshape(span.shape) for h in self._history_buffers]
            self._kind.update(d, history, dt(rate) * span.lr_mult, self)
            w -= d
        self.iter += 1
        return True, checked

    def _checked_loss(self, loss) -> float:
        """One read: ``loss``, or NaN where it or any gradient is not finite (a float64 sum
        of the diffs is finite exactly when they all are, short of overflowing it)."""
        diff = self._store.diff
        if diff is None:
            return float(loss)
        xp = module_of(diff)
        return float(xp.where(xp.isfinite(xp.sum(diff, dtype=xp.float64)), loss, xp.nan))

    def _skip(self, loss) -> None:
        """Record a non-finite iteration, or raise where the policy does not allow it."""
        diff = self._store.diff
        with np.errstate(over="ignore", invalid="ignore"):
            norm = math.nan if diff is None else float(module_of(diff).sqrt(diff @ diff))
        step = SkippedStep(self.iter, float(loss), norm)
        what = (f"iteration {step.iter}: loss {step.loss:g}, gradient norm {step.gradient_norm:g}"
                f"; not updated, the weights are those of the iteration before")
        if self.nonfinite == "stop":
            raise NonFiniteError(f"{what} (nonfinite=\"stop\")", step)
        if len(self.skipped) >= self.max_skipped:
            raise NonFiniteError(
                f"{what}: one skip more than max_skipped={self.max_skipped} (skipped before: "
                f"iterations {[s.iter for s in self.skipped]})", step)
        self.skipped.append(step)
        log.warning("Skipped %s (%d of at most %d)", what, len(self.skipped), self.max_skipped)

    def _spans(self, params) -> list[_Span]:
        """The spans of the flat buffers one update goes over, rebuilt when a param changes."""
        key = (self.param.weight_decay,
               *((p.offset, p.blob.count, p.lr_mult, p.decay_mult) for p in params))
        if self._store.data is None:  # a net without params
            return []
        if key != self._span_key:
            self._span_key = key
            self._span_list = _spans(params, self._kind.elementwise, self.param.weight_decay,
                                     self._store.data)
        return self._span_list

    def clip_gradients(self) -> None:
        """Caffe's ClipGradients, on the device: diff *= clip / max(norm, clip) (a step
        calls it after backward).

        The scale is 1 (bit for bit) while the norm is within ``clip``, and a NaN
        norm scales nothing (``fmax`` ignores it), as Caffe's ``norm > clip`` test;
        nothing is read back unless INFO logging wants the norm.
        """
        clip = self.param.clip_gradients
        if clip < 0:
            return
        diff = self._store.diff
        xp = module_of(diff)
        norm = xp.sqrt(diff @ diff, dtype=xp.float64)
        diff *= (clip / xp.fmax(norm, clip)).astype(diff.dtype)
        if log.isEnabledFor(logging.INFO) and float(norm) > clip:
            log.info("Gradient clipping: scaling down gradients (L2 norm %g > %g) by %g",
                     float(norm), clip, clip / float(norm))

    def scratch(self, like):
        """A work array of ``like``'s shape and dtype, kept between iterations (for updates)."""
        key = (like.shape, like.dtype)
        if key not in self._scratch_arrays:
            self._scratch_arrays[key] = module_of(like).empty(like.shape, like.dtype)
        return self._scratch_arrays[key]

    # -- iterations ---------------------------------------------------------------------
    def step(self, iters: int = 1, feed=None) -> float | None:
        """Run ``iters`` iterations; returns the last one's loss (None if ``iters`` is 0),
        the one loss this call reads back from the device.

        Each iteration zeroes the param diffs, runs ``iter_size`` forward and
        backward passes (accumulating gradients and loss), then updates. The
        inputs are whatever the net's input blobs hold, unless ``feed`` gives
        them for each pass: a callable ``feed(k) -> {input name: array}`` with
        ``k = iter * iter_size + pass`` (so ``k == iter`` when ``iter_size`` is
        1, and a restored solver asks for the batches it would have seen), an
        iterator of such dicts, or one dict used for every pass.
        ``solver.loss`` is the mean loss of the last ``average_loss`` iterations.
        Under ``nonfinite="skip"`` a skipped iteration still counts (and its loss,
        returned if it is the last, is the one checked); ``solver.skipped`` says
        which were.

        For example, ``solver.step(100, feed=lambda k: batches[k % len(batches)])``.
        """
        iters = operator.index(iters)
        if iters < 0:
            raise ValueError(f"step(iters): expected an integer >= 0, found {iters}")
        inputs_for = self._feeder(feed)
        iter_size = self.param.iter_size
        # under a policy, overflow and NaN in the pass are reported once, by the check
        quiet = dict(over="ignore", invalid="ignore") if self.nonfinite is not None else {}
        last = None
        for _ in range(iters):
            self._sync_history()
            with np.errstate(**quiet):
                loss = self._gradients(inputs_for, iter_size)
            # several ranks sum their losses on the host: one read per iteration
            loss = self.comm.sum(loss) / (iter_size * self.comm.size)
            at = self.iter
            applied, checked = self._update(loss)
            if checked is not None:
                loss = checked if applied else loss  # read once already: keep the host value
            if applied:
                self._losses.append(loss)
            if self.param.display and at % self.param.display == 0 and self.comm.rank == 0:
                log.info("Iteration %d, loss = %g (last %g)", at, self.loss, float(loss))
            if self.param.snapshot and self.iter % self.param.snapshot == 0:
                self.snapshot()
            last = loss
        return None if last is None else float(last)

    def _gradients(self, inputs_for, iter_size: int):
        """One iteration's passes: the param diffs cleared and summed; returns the loss sum."""
        if self.graphs is not None:
            if iter_size != 1:
                raise SolverError(f"graphs replay one pass per iteration; iter_size is "
                                  f"{iter_size}")
            return self.graphs.gradients(inputs_for(self.iter, 0))
        if self._store.diff is not None:
            self._store.diff.fill(0)
        loss = 0.0
        for i in range(iter_size):
            self.net.forward(**inputs_for(self.iter * iter_size + i, i))
            loss = loss + _unread_loss(self.net)
            self.net.backward()
        return loss

    @property
    def loss(self) -> float:
        """The mean loss of the last ``average_loss`` iterations (NaN before any; skipped
        iterations are left out).

        The iterations' losses stay on the device until this is read.
        """
        if not self._losses:
            return float("nan")
        return float(sum(self._losses)) / len(self._losses)

    def _feeder(self, feed) -> Callable[[int, int], Mapping]:
        if feed is None:
            return lambda k, i: {}
        if isinstance(feed, Mapping):
            return lambda k, i: feed
        if isinstance(feed, Iterator):
            def from_iterator(k, i):
                try:
                    inputs = next(feed)
                except StopIteration:
                    raise SolverError(
                        f"feed ran out of batches at iteration {self.iter} (pass {i + 1} of "
                        f"iter_size {self.param.iter_size})"
                    ) from None
                return _check_inputs(inputs, k)
            return from_iterator
        if callable(feed):
            return lambda k, i: _check_inputs(feed(k), k)
        raise TypeError(
            f"feed: expected a callable k -> inputs dict, an iterator of dicts or a dict, "
            f"found {type(feed).__name__}"
        )

    def solve(self, feed=None, resume=None) -> float:
        """Train to ``max_iter`` (from ``resume``, a .solverstate, if given); returns ``loss``.

        Snapshots every ``snapshot`` iterations and, with ``snapshot_after_train``
        and a ``snapshot_prefix``, once at the end, as Caffe's Solve does.
        """
        if resume is not None:
            self.restore(resume)
        self.step(max(0, self.param.max_iter - self.iter), feed)
        p = self.param
        if p.snapshot_after_train and p.snapshot_prefix and (
            not p.snapshot or self.iter % p.snapshot != 0
        ):
            self.snapshot()
        return self.loss

    # -- snapshots ----------------------------------------------------------------------
    def snapshot_paths(self, prefix=None) -> tuple[Path, Path]:
        """The (caffemodel, solverstate) paths a snapshot now would write."""
        prefix = prefix if prefix is not None else self.param.snapshot_prefix
        if not prefix:
            raise SolverError("snapshot needs a prefix: pass one or set 'snapshot_prefix'")
        base = f"{os.fspath(prefix)}_iter_{self.iter}"
        return Path(base + ".caffemodel"), Path(base + ".solverstate")

    def snapshot(self, prefix=None) -> tuple[Path, Path]:
        """Write the weights and the solver state; returns their two paths.

        Files, as Caffe names them: ``{prefix}_iter_{iter}.caffemodel`` (binary
        NetParameter, via ``net.to_proto()``) and ``{prefix}_iter_{iter}.solverstate``
        (binary SolverState whose ``learned_net`` is the caffemodel's file
        name). ``prefix`` defaults to ``snapshot_prefix``; a prefix ending in a
        separator puts ``_iter_N.*`` files in that folder. Both are written to
        temp files first and renamed into place, so a crash never leaves a
        half-written snapshot and an older snapshot of the same name survives.
        Under several ranks only rank 0 writes, and every rank returns once the
        files are in place. For example, at iteration 1000::

            solver.snapshot("runs/tagger")
            # -> (Path('runs/tagger_iter_1000.caffemodel'),
            #     Path('runs/tagger_iter_1000.solverstate'))
            Solver(fresh_net, same_settings).restore("runs/tagger_iter_1000.solverstate")
        """
        model_path, state_path = self.snapshot_paths(prefix)
        if self.comm.rank == 0:
            state = SolverState(iter=self.iter, learned_net=model_path.name,
                                current_step=self.current_step)
            for h in self.history:
                state.history.add().CopyFrom(blob_proto_from_array(to_numpy(h)))
            model = self.net.to_proto().SerializeToString()
            write_files_atomic([(model_path, model), (state_path, state.SerializeToString())])
            log.info("Snapshot at iteration %d: %s, %s", self.iter, model_path, state_path)
        self.comm.barrier()
        return model_path, state_path

    def restore(self, state_path) -> None:
        """Load a .solverstate and the weights it names: iter, history, weights, all exactly.

        ``learned_net`` is looked up in the state file's folder; a Caffe-written
        path relative to the working directory is accepted too. The solver
        must have the type of the one that wrote the state (same history size).
        Under several ranks every rank reads the files (a shared folder, or a
        copy on each host), then rank 0's values are broadcast.
        """
        state_path = Path(state_path)
        if state_path.name.endswith(".h5"):
            raise SolverError(f"{state_path}: HDF5 solver states are not supported")
        state = read_binary(state_path, SolverState, "solver state")
        if not state.HasField("iter") or state.iter < 0:
            raise SolverError(f"{state_path}: not a solver state (no valid 'iter' field)")
        params = self._sync_history()
        slots = self._kind.slots
        if len(state.history) != slots * len(params):
            raise SolverError(
                f"{state_path}: holds {len(state.history)} history blobs; a {self.type} solver "
                f"over {len(params)} learnable params needs {slots * len(params)} (was it "
                f"written by another solver type or for another net?)"
            )
        values = []
        for k, bp in enumerate(state.history):
            p = params[k % len(params)]
            value = array_from_blob_proto(bp)
            if value.size != p.blob.data.size:
                raise SolverError(
                    f"{state_path}: history blob {k} has shape {value.shape}; learnable param "
                    f"'{p.name}' has shape {p.blob.data.shape}"
                )
            values.append(value.reshape(p.blob.data.shape))
        if state.learned_net:
            weights = read_binary(self._find_model(state_path, state.learned_net),
                                  NetParameter, "caffemodel")
            self.net.copy_from(weights)
        for h, value in zip(self.history, values):
            h[...] = module_of(h).asarray(value, h.dtype)
        self._broadcast()
        self.iter = state.iter
        self.current_step = state.current_step
        self._losses.clear()

    @staticmethod
    def _find_model(state_path: Path, learned_net: str) -> Path:
        named = Path(learned_net)
        candidates = [named] if named.is_absolute() else [
            state_path.parent / named, named, state_path.parent / named.name
        ]
        for path in candidates:
            if path.is_file():
                return path
        raise FileNotFoundError(
            f"{state_path}: its learned_net '{learned_net}' is not at "
            f"{', '.join(str(c) for c in dict.fromkeys(candidates))}"
        )


def _unread_loss(net):
    """The loss of the net's last forward, on its device if it keeps it there (``device_loss``)."""
    return net.device_loss if hasattr(net, "device_loss") else net.loss


def _check_inputs(inputs, k: int) -> Mapping:
    if not isinstance(inputs, Mapping):
        raise TypeError(
            f"feed for pass {k}: expected a dict of input name -> array, "
            f"found {type(inputs).__name__}"
        )
    return inputs
