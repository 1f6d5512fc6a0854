"""Learning-rate policies: every one, and the warmup composed with them, against schedules
written out here by hand over many iterations (docs/design.md, Solver)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unroll.core.proto import NetParameter
from unroll.engine.param_store import ParamStore
from unroll.train.lr_policies import LR_POLICIES, register_lr_policy
from unroll.train.solver import Solver, SolverError

ITERS = 80


class NoParams:
    """A net without params: the solver's schedule runs alone."""

    learnable_params: list = []

    def __init__(self):
        self.store, self.loss = ParamStore(), 0.0

    def forward(self, **inputs):
        return {}

    def backward(self):
        pass

    def to_proto(self):
        return NetParameter(name="none")

    def copy_from(self, source):
        pass


def rates(**fields) -> tuple[list[float], object]:
    """The rate of each of ITERS updates, and the SolverParameter (float32 values)."""
    solver = Solver(NoParams(), **fields)
    seen = []
    for _ in range(ITERS):
        ahead = solver.get_learning_rate()
        solver.step(1)
        assert solver.rate == ahead  # the rate asked for is the one the update uses
        seen.append(solver.rate)
    return seen, solver.param


def by_hand(policy: str, p, it: int) -> float:
    """Caffe's GetLearningRate, and unroll's cosine, written out independently."""
    lr = p.base_lr
    if policy == "fixed":
        return lr
    if policy == "step":
        return lr * p.gamma ** (it // p.stepsize)
    if policy == "exp":
        return lr * p.gamma ** it
    if policy == "inv":
        return lr * (1 + p.gamma * it) ** -p.power
    if policy == "multistep":
        return lr * p.gamma ** sum(1 for v in p.stepvalue if it >= v)
    if policy == "poly":
        return lr * max(0.0, 1 - it / p.max_iter) ** p.power  # the base clamped at 0
    if policy == "sigmoid":
        return lr / (1 + math.exp(-p.gamma * (it - p.stepsize)))
    assert policy == "cosine"
    if it >= p.max_iter:
        return p.min_lr
    return p.min_lr + (lr - p.min_lr) * (1 + math.cos(math.pi * it / p.max_iter)) / 2


def warmed(rate: float, p, it: int) -> float:
    if it >= p.warmup_iter:
        return rate
    return rate * (p.warmup_start + (1 - p.warmup_start) * it / p.warmup_iter)


base_lr = st.floats(1e-4, 1.0)
fraction = st.floats(0.05, 0.99)
POLICY_FIELDS = {
    "fixed": st.fixed_dictionaries({}),
    "step": st.fixed_dictionaries({"gamma": fraction, "stepsize": st.integers(1, 30)}),
    "exp": st.fixed_dictionaries({"gamma": st.floats(0.9, 1.0)}),
    "inv": st.fixed_dictionaries({"gamma": st.floats(1e-4, 0.5), "power": st.floats(0, 2)}),
    "multistep": st.fixed_dictionaries({
        "gamma": fraction,
        "stepvalue": st.lists(st.integers(0, ITERS + 5), min_size=1, max_size=5, unique=True)
        .map(sorted)}),
    "poly": st.fixed_dictionaries({"power": st.floats(0, 3),
                                   "max_iter": st.integers(1, ITERS + 20)}),
    "sigmoid": st.fixed_dictionaries({"gamma": st.floats(0, 0.5),
                                      "stepsize": st.integers(1, ITERS)}),
    "cosine": st.fixed_dictionaries({"max_iter": st.integers(1, ITERS + 20),
                                     "min_lr": st.floats(0, 1e-4)}),
}


def test_every_registered_policy_has_a_schedule_here():
    assert set(LR_POLICIES) == set(POLICY_FIELDS)


@pytest.mark.parametrize("policy", list(POLICY_FIELDS))
@given(data=st.data(), lr=base_lr)
def test_every_policy_follows_its_formula(policy, data, lr):
    fields = data.draw(POLICY_FIELDS[policy])
    seen, p = rates(base_lr=lr, lr_policy=policy, **fields)
    want = [by_hand(policy, p, it) for it in range(ITERS)]
    assert seen == pytest.approx(want, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("policy", list(POLICY_FIELDS))
@given(data=st.data(), lr=base_lr, warmup_iter=st.integers(1, ITERS + 10),
       warmup_start=st.floats(0, 1))
def test_warmup_composes_with_every_policy(policy, data, lr, warmup_iter, warmup_start):
    """Linear from warmup_start times the policy's rate to the policy's own at warmup_iter,
    on the policy's clock (not shifted)."""
    fields = data.draw(POLICY_FIELDS[policy])
    seen, p = rates(base_lr=lr, lr_policy=policy, warmup_iter=warmup_iter,
                    warmup_start=warmup_start, **fields)
    want = [warmed(by_hand(policy, p, it), p, it) for it in range(ITERS)]
    assert seen == pytest.approx(want, rel=1e-12, abs=1e-300)


def test_warmup_of_step_and_cosine_by_the_numbers():
    """The schedule in plain numbers: warmup over 4 iterations from a quarter."""
    step, _ = rates(base_lr=1.0, lr_policy="step", gamma=0.5, stepsize=3, warmup_iter=4,
                    warmup_start=0.25)
    assert step[:8] == pytest.approx([0.25, 0.4375, 0.625, 0.5 * 0.8125, 0.5, 0.5, 0.25, 0.25])
    cosine, _ = rates(base_lr=1.0, lr_policy="cosine", max_iter=8, warmup_iter=4,
                      warmup_start=0.25)
    half = [(1 + math.cos(math.pi * it / 8)) / 2 for it in range(8)]
    assert cosine[:10] == pytest.approx(
        [0.25 * half[0], 0.4375 * half[1], 0.625 * half[2], 0.8125 * half[3], *half[4:8], 0, 0],
        abs=1e-15)


def test_a_policy_registered_from_outside_is_used_and_checked():
    def check(p):
        if p.power < 0:
            raise SolverError("solver field 'power': expected >= 0 for lr_policy \"root\"")

    @register_lr_policy("root", check=check, required={"power": 0.5})
    def root(p, it, current_step):
        return p.base_lr / (1 + it) ** p.power, current_step

    try:
        with pytest.raises(SolverError, match="'power' is not set, and lr_policy \"root\""):
            Solver(NoParams(), base_lr=1.0, lr_policy="root")
        with pytest.raises(SolverError, match="expected >= 0"):
            Solver(NoParams(), base_lr=1.0, lr_policy="root", power=-1)
        with pytest.raises(ValueError, match="already registered"):
            register_lr_policy("root")(root)
        seen, _ = rates(base_lr=1.0, lr_policy="root", power=0.5, warmup_iter=2)
        assert seen[:4] == pytest.approx([0.0, 0.5 / 2 ** 0.5, 1 / 3 ** 0.5, 0.5])
    finally:
        del LR_POLICIES["root"]


@pytest.mark.parametrize("fields, message", [
    (dict(lr_policy="cosine"), r"'max_iter': expected an integer > 0 for lr_policy \"cosine\""),
    (dict(lr_policy="cosine", max_iter=10, min_lr=0.5), r"'min_lr': expected a number in "
                                                         r"\[0, base_lr 0.1\].*found 0.5"),
    (dict(lr_policy="cosine", max_iter=10, min_lr=-1), r"'min_lr'.*found -1"),
    (dict(lr_policy="step", gamma=0.5, stepsize=2, min_lr=0.01),
     r"'min_lr' is set, but lr_policy \"step\" does not use it \(lr_policy \"cosine\" does\)"),
    (dict(min_lr=0.01), r"'min_lr' is set, but lr_policy \"fixed\" does not use it"),
    (dict(warmup_iter=-1), r"'warmup_iter': expected an integer >= 0.*found -1"),
    (dict(warmup_iter=5, warmup_start=1.5), r"'warmup_start': expected a fraction.*\[0, 1\]"),
    (dict(warmup_start=0.1), r"'warmup_start' is set but 'warmup_iter' is not"),
    (dict(lr_policy="warmup"), r"'lr_policy': expected one of \['fixed', .*'cosine'\]"),
])
def test_bad_schedule_fields_are_one_line_errors_naming_the_field(fields, message):
    with pytest.raises(SolverError, match=message) as caught:
        Solver(NoParams(), base_lr=0.1, **fields)
    assert "\n" not in str(caught.value)


def test_the_new_fields_come_from_a_solver_file_too():
    solver = Solver(NoParams(), 'base_lr: 0.5 lr_policy: "cosine" max_iter: 4 min_lr: 0.125 '
                                'warmup_iter: 2 warmup_start: 0.5')
    solver.step(5)
    assert solver.rate == 0.125
    assert solver.param.warmup_iter == 2
