"""Learning-rate policies (``lr_policy``): each one's fields, checks and formula in one place.

A policy is registered with :func:`register_lr_policy` as a function
``rate(param, it, current_step) -> (rate, current_step)``, Caffe's
``GetLearningRate`` at iteration ``it`` (0 for the first update);
``current_step`` is Caffe's ``current_step_``, the position ``multistep`` keeps
(saved in the .solverstate). Caffe's seven, with ``lr = base_lr``:

- ``fixed``: ``lr``;
- ``step``: ``lr * gamma ^ floor(it / stepsize)``;
- ``exp``: ``lr * gamma ^ it``;
- ``inv``: ``lr * (1 + gamma * it) ^ -power``;
- ``multistep``: ``lr * gamma ^ k``, ``k`` the number of ``stepvalue`` entries reached;
- ``poly``: ``lr * max(0, 1 - it / max_iter) ^ power`` (the base clamped at 0 past
  ``max_iter``, where Caffe's formula breaks down);
- ``sigmoid``: ``lr / (1 + exp(-gamma * (it - stepsize)))``;

and beyond Caffe:

- ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * it / max_iter)) / 2``, then
  ``min_lr`` from ``max_iter`` on (SGDR, Loshchilov & Hutter 2017, without restarts).

Any policy composes with a linear **warmup**: with ``warmup_iter: W > 0`` the
rate of iteration ``it < W`` is the policy's times ``warmup_start + (1 -
warmup_start) * it / W``, so it climbs from ``warmup_start`` times the policy's
rate to the policy's own at ``W``; the policy's clock is not shifted.

>>> from unroll.core.proto import SolverParameter
>>> p = SolverParameter(base_lr=1.0, lr_policy="cosine", max_iter=100, warmup_iter=10,
...                     warmup_start=0.5)
>>> [round(learning_rate(p, it, 0)[0], 4) for it in (0, 5, 10, 50, 100)]
[0.5, 0.7454, 0.9755, 0.5, 0.0]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from unroll.core.proto import SolverParameter
from unroll.train.solver_param import SolverError, bad, is_set, require_set

__all__ = ["LR_POLICIES", "LrPolicy", "check_lr_policy", "learning_rate", "register_lr_policy"]


@dataclasses.dataclass(frozen=True)
class LrPolicy:
    """A registered lr policy: its name, its rate function, its checks and required fields."""

    name: str
    rate: Callable[[SolverParameter, int, int], tuple[float, int]]
    check: Callable[[SolverParameter], None]
    #: fields it needs given explicitly -> an example value: Caffe's default for them (0,
    #: none) would silently make the rate 0 after the first step or constant
    required: Mapping = dataclasses.field(default_factory=dict)
    #: fields beyond Caffe's that only this policy reads (set with another: an error)
    own: tuple = ()


#: Registered policies by name (see :func:`register_lr_policy`); an unset ``lr_policy``
#: is "fixed".
LR_POLICIES: dict[str, LrPolicy] = {}


def register_lr_policy(name: str, check: Callable[[SolverParameter], None] | None = None,
                       required: Mapping | None = None, own: tuple = ()):
    """Register ``rate(param, it, current_step) -> (rate, current_step)`` as ``lr_policy:
    name``; ``check(param)`` raises :class:`SolverError` for settings it cannot use;
    ``required`` fields must be given (to any value) and name an example in the error;
    ``own`` names the fields only this policy reads.

    >>> @register_lr_policy("halving", check=lambda p: None)
    ... def halving(p, it, current_step):
    ...     return p.base_lr / 2 ** it, current_step
    >>> learning_rate(SolverParameter(base_lr=1, lr_policy="halving"), 3, 0)
    (0.125, 0)
    >>> del LR_POLICIES["halving"]
    """
    def register(rate: Callable) -> Callable:
        if name in LR_POLICIES:
            raise ValueError(f"an lr policy named '{name}' is already registered")
        LR_POLICIES[name] = LrPolicy(name, rate, check or (lambda p: None),
                                     dict(required or {}), tuple(own))
        return rate
    return register


def _pow(base: float, exponent: float) -> float:
    """``base ** exponent`` that gives inf on overflow, as C's pow does."""
    try:
        return float(base) ** exponent
    except OverflowError:
        return math.inf


def _positive(name: str, policy: str):
    def check(p: SolverParameter) -> None:
        if getattr(p, name) <= 0:
            raise bad(name, f"an integer > 0 for lr_policy \"{policy}\"", getattr(p, name))
    return check


@register_lr_policy("fixed")
def _fixed(p, it, current_step):
    return p.base_lr, current_step


@register_lr_policy("step", check=_positive("stepsize", "step"), required={"gamma": 0.1})
def _step(p, it, current_step):
    current_step = it // p.stepsize
    return p.base_lr * _pow(p.gamma, current_step), current_step


@register_lr_policy("exp", required={"gamma": 0.999})
def _exp(p, it, current_step):
    return p.base_lr * _pow(p.gamma, it), current_step


@register_lr_policy("inv", required={"gamma": 1e-4, "power": 0.75})
def _inv(p, it, current_step):
    return p.base_lr * _pow(1.0 + p.gamma * it, -p.power), current_step


def _check_stepvalue(p: SolverParameter) -> None:
    values = list(p.stepvalue)
    if any(b <= a for a, b in zip(values, values[1:])) or any(v < 0 for v in values):
        raise bad("stepvalue", "increasing iterations >= 0", values)


@register_lr_policy("multistep", check=_check_stepvalue,
                    required={"gamma": 0.1, "stepvalue": [10000, 20000]})
def _multistep(p, it, current_step):
    if current_step < len(p.stepvalue) and it >= p.stepvalue[current_step]:
        current_step += 1
    return p.base_lr * _pow(p.gamma, current_step), current_step


def _check_poly(p: SolverParameter) -> None:
    _positive("max_iter", "poly")(p)
    if p.power < 0:
        raise bad("power", 'a number >= 0 for lr_policy "poly"', p.power)


@register_lr_policy("poly", check=_check_poly, required={"power": 1.0})
def _poly(p, it, current_step):
    return p.base_lr * _pow(max(0.0, 1.0 - it / p.max_iter), p.power), current_step


@register_lr_policy("sigmoid", check=_positive("stepsize", "sigmoid"), required={"gamma": 0.01})
def _sigmoid(p, it, current_step):
    z = -p.gamma * (it - p.stepsize)
    return (0.0 if z > 700 else p.base_lr / (1.0 + math.exp(z))), current_step


def _check_cosine(p: SolverParameter) -> None:
    _positive("max_iter", "cosine")(p)
    if not 0 <= p.min_lr <= p.base_lr:
        raise bad("min_lr", f'a number in [0, base_lr {p.base_lr:g}] for lr_policy "cosine"',
                  p.min_lr)


@register_lr_policy("cosine", check=_check_cosine, own=("min_lr",))
def _cosine(p, it, current_step):
    if it >= p.max_iter:
        return p.min_lr, current_step
    return (p.min_lr + (p.base_lr - p.min_lr) * 0.5 * (1.0 + math.cos(math.pi * it / p.max_iter)),
            current_step)


def check_lr_policy(p: SolverParameter) -> LrPolicy:
    """The policy ``p`` names ("fixed" if unset), its fields and the warmup's checked."""
    name = p.lr_policy or "fixed"
    if name not in LR_POLICIES:
        raise bad("lr_policy", f"one of {list(LR_POLICIES)}", p.lr_policy)
    policy = LR_POLICIES[name]
    if p.warmup_iter < 0:
        raise bad("warmup_iter", "an integer >= 0 (0: no warmup)", p.warmup_iter)
    if not 0 <= p.warmup_start <= 1:
        raise bad("warmup_start", "a fraction of the rate in [0, 1]", p.warmup_start)
    if is_set(p, "warmup_start") and p.warmup_iter == 0:
        raise SolverError("solver field 'warmup_start' is set but 'warmup_iter' is not: give "
                          "the number of warmup iterations, or leave warmup_start unset")
    for other in LR_POLICIES.values():
        for field in other.own:
            if other is not policy and is_set(p, field) and field not in policy.own:
                raise SolverError(f"solver field '{field}' is set, but lr_policy \"{name}\" "
                                  f"does not use it (lr_policy \"{other.name}\" does)")
    policy.check(p)
    require_set(p, policy.required, f'lr_policy "{name}"', "e.g.")
    return policy


def learning_rate(p: SolverParameter, it: int, current_step: int) -> tuple[float, int]:
    """The rate of iteration ``it`` under ``p``'s policy and warmup, and the new
    ``current_step``; a rate that is not finite is an error naming the policy's fields."""
    policy = LR_POLICIES[p.lr_policy or "fixed"]
    rate, current_step = policy.rate(p, it, current_step)
    if it < p.warmup_iter:
        rate *= p.warmup_start + (1.0 - p.warmup_start) * it / p.warmup_iter
    if not math.isfinite(rate):
        raise SolverError(
            f"lr_policy \"{policy.name}\" gives learning rate {rate} at iteration {it} "
            f"(base_lr {p.base_lr:g}, gamma {p.gamma:g}, power {p.power:g})"
        )
    return rate, current_step
