"""Update rules: Caffe's ComputeUpdateValue of each solver type, registered by name.

A rule is a function ``rule(diff, history, rate, param, step)``, not a method
of the Solver (as Caffe's ``REGISTER_SOLVER_CLASS`` registers one class per
type): ``diff`` holds the regularized gradient and is left holding the step
(``data -= diff`` follows); ``history`` is the rule's ``slots`` arrays like
``diff``, zero at first and saved in snapshots; ``rate`` is the local learning
rate (``lr * lr_mult``) in the params' dtype, one number or one per element;
``param`` is the SolverParameter; ``step`` is the iteration being applied
(Caffe's ``iter_``, 0 for the first update). The built-ins, with ``g`` the
regularized gradient and ``h`` the history:

- ``SGD``: ``h = momentum * h + rate * g``; step ``h``;
- ``Nesterov``: ``h' = momentum * h + rate * g``; step ``(1 + momentum) * h' - momentum * h``;
- ``AdaGrad``: ``h += g^2``; step ``rate * g / (sqrt(h) + delta)``;
- ``RMSProp``: ``h = rms_decay * h + (1 - rms_decay) * g^2``; step ``rate * g / (sqrt(h) + delta)``;
- ``AdaDelta``: Caffe's, two slots (see :func:`_adadelta`);
- ``Adam``: Caffe's (:func:`_adam`); ``AdamW``: decoupled weight decay (:func:`_adamw`).

>>> sorted(SOLVERS)
['AdaDelta', 'AdaGrad', 'Adam', 'AdamW', 'Nesterov', 'RMSProp', 'SGD']
>>> usual_fields("adamw")
{'momentum': 0.9, 'momentum2': 0.999, 'weight_decay': 0.01}
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from unroll.core.proto import SolverParameter
from unroll.engine.backend import module_of
from unroll.engine.kernels import default_engine, fused_kernels
from unroll.train.solver_param import SolverError, bad

__all__ = ["SOLVERS", "UpdateRule", "register_solver", "rule_for", "usual_fields"]

_LEGACY_TYPES = {  # SolverParameter.solver_type (enum, deprecated in Caffe) -> type
    SolverParameter.SGD: "SGD",
    SolverParameter.NESTEROV: "Nesterov",
    SolverParameter.ADAGRAD: "AdaGrad",
    SolverParameter.RMSPROP: "RMSProp",
    SolverParameter.ADADELTA: "AdaDelta",
    SolverParameter.ADAM: "Adam",
}


@dataclasses.dataclass(frozen=True)
class UpdateRule:
    """A registered solver type: Caffe's ``type`` name, history slots, rule and checks."""

    name: str
    slots: int
    update: Callable
    check: Callable[[SolverParameter], None]
    elementwise: bool = True
    #: fields this type needs given explicitly -> their usual value (for the error and
    #: for callers that want the usual settings: :func:`usual_fields`)
    required: Mapping = dataclasses.field(default_factory=dict)
    #: weight decay applied after the rule, scaled by the rate (``diff += rate *
    #: weight_decay * decay_mult * data``), instead of added to the gradient before it
    decoupled_decay: bool = False


#: Registered solver types by Caffe's ``type`` string (see :func:`register_solver`).
SOLVERS: dict[str, UpdateRule] = {}


def register_solver(name: str, slots: int, check: Callable[[SolverParameter], None] = None,
                    elementwise: bool = True, required: Mapping | None = None,
                    decoupled_decay: bool = False):
    """Register an update rule as solver type ``name`` (Caffe's REGISTER_SOLVER_CLASS).

    ``update(diff, history, rate, param, step)`` is described in this module's
    docstring. An ``elementwise`` rule (each element's step depends on that
    element only, as in every built-in) gets whole runs of adjacent params of
    the flat buffers at once, flat, with ``rate`` an array where their
    ``lr_mult`` differ; give ``elementwise=False`` for a rule that needs each
    param whole (a per-param norm), which then gets one param at a time in its
    shape. ``check(param)`` raises :class:`SolverError` for settings the type
    cannot use. ``required`` maps the fields the type needs given explicitly
    to their usual value: where Caffe's default for an unset field would
    silently change the method (Adam's ``momentum`` is beta1; unset it is 0),
    leaving it unset is an error naming the field and that value.
    ``decoupled_decay`` moves weight decay out of the gradient (as AdamW).
    Names are matched in any case.

    >>> @register_solver("SignSGD", slots=0)
    ... def sign_sgd(diff, history, rate, param, step):
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
        SOLVERS[name] = UpdateRule(name, slots, update, check or (lambda param: None),
                                   elementwise, dict(required or {}), decoupled_decay)
        return update

    return register


def rule_for(param: SolverParameter) -> UpdateRule:
    """The rule ``param`` names by ``type`` (any case) or by Caffe's deprecated ``solver_type``."""
    if param.HasField("solver_type"):
        if param.HasField("type"):
            raise SolverError(
                "solver fields 'type' and 'solver_type' are both set; give only 'type' "
                "(solver_type is Caffe's deprecated enum)"
            )
        return SOLVERS[_LEGACY_TYPES[param.solver_type]]
    for name, rule in SOLVERS.items():
        if name.lower() == param.type.lower():
            return rule
    raise bad("type", f"one of the registered solvers {list(SOLVERS)}", param.type)


def usual_fields(type: str) -> dict:
    """The fields solver ``type`` needs given explicitly, at their usual values.

    >>> usual_fields("adam")
    {'momentum': 0.9, 'momentum2': 0.999}
    """
    return dict(rule_for(SolverParameter(type=type)).required)


def _pow(base: float, exponent: float) -> float:
    """``base ** exponent`` that gives inf on overflow, as C's pow does."""
    try:
        return float(base) ** exponent
    except OverflowError:
        return math.inf


# -- checks ---------------------------------------------------------------------------


def _momentum_below_one(kind: str, *names: str):
    def check(p: SolverParameter) -> None:
        for name in names:
            if not 0 <= getattr(p, name) < 1:
                raise bad(name, f"a number in [0, 1) for {kind}", getattr(p, name))
    return check


def _adaptive(kind: str, *extra):
    """Checks of the types that divide by a running magnitude: ``delta > 0``, then ``extra``."""
    def check(p: SolverParameter) -> None:
        if p.delta <= 0:
            raise bad("delta", f"a number > 0 for {kind}", p.delta)
        for more in extra:
            more(p)
    return check


def _no_momentum(kind: str):
    def check(p: SolverParameter) -> None:
        if p.momentum != 0:
            raise bad("momentum", f"0: momentum cannot be used with {kind}", p.momentum)
    return check


# -- the rules ------------------------------------------------------------------------


@register_solver("SGD", slots=1, check=_momentum_below_one("SGD", "momentum"))
def _sgd(diff, history, rate, param, step) -> None:
    (h,) = history
    h *= diff.dtype.type(param.momentum)
    h += rate * diff
    diff[...] = h


@register_solver("Nesterov", slots=1, check=_momentum_below_one("Nesterov", "momentum"),
                 required={"momentum": 0.9})
def _nesterov(diff, history, rate, param, step) -> None:
    (h,) = history
    dt = diff.dtype.type
    momentum = dt(param.momentum)
    previous = h.copy()
    h *= momentum
    h += rate * diff
    diff[...] = (dt(1) + momentum) * h
    diff -= momentum * previous


@register_solver("AdaGrad", slots=1, check=_adaptive("AdaGrad", _no_momentum("AdaGrad")))
def _adagrad(diff, history, rate, param, step) -> None:
    (h,) = history
    dt = diff.dtype.type
    h += diff * diff
    diff /= (h ** dt(0.5)) + dt(param.delta)
    diff *= rate


@register_solver("RMSProp", slots=1, check=_adaptive(
    "RMSProp", _no_momentum("RMSProp"), _momentum_below_one("RMSProp", "rms_decay")),
    required={"rms_decay": 0.99})
def _rmsprop(diff, history, rate, param, step) -> None:
    (h,) = history
    dt = diff.dtype.type
    decay = dt(param.rms_decay)
    h *= decay
    h += (dt(1) - decay) * (diff * diff)
    diff /= (h ** dt(0.5)) + dt(param.delta)
    diff *= rate


@register_solver("AdaDelta", slots=2,
                 check=_adaptive("AdaDelta", _momentum_below_one("AdaDelta", "momentum")),
                 required={"momentum": 0.95, "delta": 1e-6})
def _adadelta(diff, history, rate, param, step) -> None:
    """Caffe's AdaDelta, ``rho = momentum``: ``hg = rho * hg + (1 - rho) * g^2``; ``u = g *
    sqrt((hs + delta) / (hg + delta))``; ``hs = rho * hs + (1 - rho) * u^2``; step ``rate * u``."""
    h_grad, h_step = history
    dt = diff.dtype.type
    momentum, delta = dt(param.momentum), dt(param.delta)
    h_grad *= momentum
    h_grad += (dt(1) - momentum) * (diff * diff)
    diff *= ((h_step + delta) / (h_grad + delta)) ** dt(0.5)
    h_step *= momentum
    h_step += (dt(1) - momentum) * (diff * diff)
    diff *= rate


_ADAM_CHECK = _adaptive("Adam (its beta1, beta2)",
                        _momentum_below_one("Adam (its beta1, beta2)", "momentum", "momentum2"))


@register_solver("Adam", slots=2, check=_ADAM_CHECK,
                 required={"momentum": 0.9, "momentum2": 0.999})
def _adam(diff, history, rate, param, step) -> None:
    """Caffe's Adam (``adam_solver.cpp``), ``b1 = momentum``, ``b2 = momentum2``, ``eps =
    delta``, ``t = step + 1``, with the bias correction folded into the rate::

        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g^2
        step = rate * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)

    This is Kingma & Ba's "more efficient" form, not ``torch.optim.Adam``'s
    ``rate * m_hat / (sqrt(v_hat) + eps)`` (``m_hat = m / (1 - b1^t)``, ``v_hat = v /
    (1 - b2^t)``): Caffe's step is torch's with ``eps`` replaced by ``eps /
    sqrt(1 - b2^t)``; torch's is Caffe's with ``delta`` scaled by ``sqrt(1 - b2^t)``.
    The two differ where ``sqrt(v_hat)`` is not far above ``eps``, mostly in the
    first iterations.
    """
    _adam_step(diff, history, rate, param, step, scale_delta=False)


def _check_adamw(p: SolverParameter) -> None:
    _ADAM_CHECK(p)
    if p.regularization_type != "L2":
        raise bad("regularization_type", '"L2" for AdamW (its decay is decoupled, on the '
                  'weights)', p.regularization_type)


@register_solver("AdamW", slots=2, check=_check_adamw, decoupled_decay=True,
                 required={"momentum": 0.9, "momentum2": 0.999, "weight_decay": 0.01})
def _adamw(diff, history, rate, param, step) -> None:
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019), torch's bias correction::

        m = b1 * m + (1 - b1) * g;  m_hat = m / (1 - b1^t)
        v = b2 * v + (1 - b2) * g^2;  v_hat = v / (1 - b2^t)
        p -= rate * m_hat / (sqrt(v_hat) + eps) + rate * weight_decay * decay_mult * p

    in Caffe's rate conventions: ``rate = lr * lr_mult``, ``lr`` the policy's rate
    of ``base_lr`` at ``iter`` (so the decay follows the schedule, as the paper's
    ``eta_t``, and ``lr_mult`` too); ``g`` is the gradient averaged over
    ``iter_size`` (and ranks) with no weight decay in it. The same ``b1, b2, eps,
    t`` as :func:`_adam`; unlike Caffe's Adam, ``eps`` is added to ``sqrt(v_hat)``.
    The decay term is added by the solver after this rule (``decoupled_decay``).
    """
    _adam_step(diff, history, rate, param, step, scale_delta=True)


def _adam_step(diff, history, rate, param, step, scale_delta: bool) -> None:
    """Caffe's Adam; ``scale_delta`` gives torch's ``eps`` on ``sqrt(v_hat)``: the same form
    with ``delta * sqrt(1 - b2^t)`` (see :func:`_adam`)."""
    m, v = history
    xp, dt = module_of(diff), diff.dtype.type
    beta1, beta2 = dt(param.momentum), dt(param.momentum2)
    t = step + 1
    root = math.sqrt(1.0 - _pow(beta2, t))
    correction = dt(root / (1.0 - _pow(beta1, t)))
    delta = param.delta * root if scale_delta else param.delta
    kernels = fused_kernels(xp) if default_engine() == "fused" else None
    if kernels is not None and all(a.flags.c_contiguous for a in (diff, m, v)):
        # one pass over the span (one launch on a GPU) instead of eleven
        kernels.adam_update(diff, m, v, beta1, beta2, delta, rate * correction)
        return
    # the reference engine's: in place, through one work array
    scratch = xp.empty_like(diff)
    xp.multiply(diff, diff, out=scratch)
    scratch *= dt(1) - beta2
    v *= beta2
    v += scratch
    m *= beta1
    diff *= dt(1) - beta1
    m += diff
    xp.sqrt(v, out=scratch)
    scratch += dt(delta)
    xp.divide(m, scratch, out=diff)
    diff *= rate * correction
