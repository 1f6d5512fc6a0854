"""Solver callbacks: the order their hooks run in, what each sees, and one of your own
plugging in (docs/design.md, Solver)."""

from __future__ import annotations

import numpy as np
import pytest

from unroll.engine.net import Net
from unroll.train.distributed import Comm
from unroll.train.solver import Solver, SolverCallback
from unroll.train.solver_callbacks import (
    AllReduce,
    GradientClipping,
    GraphReplay,
    NonFiniteCheck,
)

NET = """
layer { name: "in" type: "Input" top: "x" top: "y"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }
"""


def batch(k: int) -> dict:
    rng = np.random.default_rng(2000 + k)
    return {"x": 3 * rng.normal(size=(4, 3)), "y": rng.normal(size=(4, 2))}


class Recording(SolverCallback):
    """Writes each hook it sees into ``events``, with what the solver holds then."""

    def __init__(self, name: str, events: list):
        self.name, self.events = name, events

    def on_start(self, solver, it):
        self.events.append((self.name, "on_start", it.iter, it.loss))

    def on_gradients_ready(self, solver, it):
        diff = solver.net.store.diff
        self.events.append((self.name, "on_gradients_ready", it.iter, float(np.sqrt(diff @ diff))))

    def on_update(self, solver, it):
        self.events.append((self.name, "on_update", it.iter, (solver.iter, it.applied)))


def test_the_builtins_come_first_yours_in_the_order_added_and_the_replay_last():
    solver = Solver(Net(NET), base_lr=0.1, clip_gradients=1.0, nonfinite="skip", max_skipped=1)
    first, second = Recording("first", []), Recording("second", [])
    solver.add_callback(first)
    solver.add_callback(second)
    kinds = [type(c) for c in solver.callbacks]
    assert kinds == [AllReduce, NonFiniteCheck, GradientClipping, Recording, Recording,
                     GraphReplay]
    assert solver.callbacks[3:5] == (first, second)
    plain = Solver(Net(NET), base_lr=0.1)
    assert [type(c) for c in plain.callbacks] == [AllReduce, GraphReplay]


def test_each_iteration_runs_the_hooks_in_order_around_the_passes_and_the_update():
    events = []
    forwards = []
    solver = Solver(Net(NET), base_lr=0.1, clip_gradients=0.5, iter_size=2)
    solver.add_callback(Recording("a", events))
    solver.add_callback(Recording("b", events))
    solver.step(2, feed=lambda k: forwards.append(k) or batch(k))
    hooks = [(name, hook, at) for name, hook, at, _ in events]
    assert hooks == [(name, hook, at) for at in (0, 1)
                     for hook in ("on_start", "on_gradients_ready", "on_update")
                     for name in ("a", "b")]
    assert forwards == [0, 1, 2, 3]
    starts = [seen for _, hook, _, seen in events if hook == "on_start"]
    assert starts == [None] * 4, "on_start runs before the passes"
    norms = [seen for _, hook, _, seen in events if hook == "on_gradients_ready"]
    assert norms == pytest.approx([0.5] * 4), "yours see the diffs clipped, not yet averaged"
    updates = [seen for _, hook, _, seen in events if hook == "on_update"]
    assert updates == [(1, True), (1, True), (2, True), (2, True)]


def test_update_runs_gradients_ready_and_update_only():
    events = []
    net = Net(NET)
    solver = Solver(net, base_lr=0.1)
    solver.add_callback(Recording("a", events))
    net.forward(**batch(0))
    net.backward()
    assert solver.update() is True
    assert [hook for _, hook, _, _ in events] == ["on_gradients_ready", "on_update"]


def test_a_skipped_iteration_ends_gradients_ready_before_yours_and_still_reports_the_update():
    events = []
    solver = Solver(Net(NET), base_lr=0.1, nonfinite="skip", max_skipped=1)
    solver.add_callback(Recording("a", events))

    def feed(k):
        inputs = batch(k)
        inputs["x"][0, 0] = np.nan if k == 1 else inputs["x"][0, 0]
        return inputs

    solver.step(3, feed=feed)
    assert [(hook, at) for _, hook, at, _ in events if hook != "on_start"] == [
        ("on_gradients_ready", 0), ("on_update", 0), ("on_update", 1),
        ("on_gradients_ready", 2), ("on_update", 2)]
    assert [seen for _, hook, _, seen in events if hook == "on_update"] == [
        (1, True), (2, False), (3, True)]


class Freeze(SolverCallback):
    """Leaves out the update of every iteration in ``frozen``."""

    def __init__(self, frozen):
        self.frozen = frozen

    def on_gradients_ready(self, solver, it):
        if it.iter in self.frozen:
            it.applied = False


def test_a_callback_of_your_own_can_leave_an_update_out():
    net, reference = Net(NET), Net(NET)
    solver = Solver(net, type="SGD", base_lr=0.1, momentum=0.9)
    solver.add_callback(Freeze({1, 2}))
    solver.step(4, feed=batch)
    alone = Solver(reference, type="SGD", base_lr=0.1, momentum=0.9)
    for k in (0, 3):
        alone.iter = k
        alone.step(1, feed=batch)
    np.testing.assert_array_equal(net.store.data, reference.store.data)
    assert solver.iter == 4 and solver.loss == pytest.approx(alone.loss)


def test_a_callback_must_be_a_solver_callback():
    solver = Solver(Net(NET), base_lr=0.1)
    with pytest.raises(TypeError, match="add_callback: expected a SolverCallback, found function"):
        solver.add_callback(lambda solver, it: None)


class TwoEqualRanks(Comm):
    """Two ranks that saw the same batches, in one process: a sum over them is twice."""

    size = 2

    def allreduce_sum(self, array):
        array *= 2

    def sum(self, value):
        return 2 * value


@pytest.mark.parametrize("kind, fields", [
    ("SGD", dict(momentum=0.9, clip_gradients=0.5)),
    ("Adam", dict(momentum=0.9, momentum2=0.999, weight_decay=0.01)),
])
def test_the_all_reduce_callback_makes_two_ranks_one_process_with_iter_size_two(kind, fields):
    """Bit for bit: g + g over ranks is 2 * g, as iter_size 2 over the same batch twice."""
    ranks, alone = Net(NET), Net(NET)
    two = Solver(ranks, type=kind, base_lr=0.05, comm=TwoEqualRanks(), **fields)
    one = Solver(alone, type=kind, base_lr=0.05, iter_size=2, **fields)
    losses = two.step(5, feed=batch), one.step(5, feed=lambda k: batch(k // 2))
    np.testing.assert_array_equal(ranks.store.data, alone.store.data)
    assert losses[0] == losses[1] and two.loss == one.loss


class OneRankSentNaN(Comm):
    """A rank whose all-reduce brings a NaN from another rank."""

    def allreduce_sum(self, array):
        array[0] = np.nan


def test_the_non_finite_check_sees_the_gradients_after_the_all_reduce():
    """A NaN that only the all-reduce brings is caught: every rank decides alike."""
    net = Net(NET)
    solver = Solver(net, base_lr=0.1, comm=OneRankSentNaN(), nonfinite="skip", max_skipped=1)
    solver.step(1, feed=batch)
    assert [s.iter for s in solver.skipped] == [0] and np.isfinite(net.store.data).all()


class OneRankSentHugeValues(Comm):
    """A rank whose all-reduce brings ``value`` (finite gradients whose squares overflow
    float32, or an infinite one)."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def allreduce_sum(self, array):
        array[:2] = self.value


@pytest.mark.parametrize("value, skipped", [(1e30, []), (np.inf, [0]), (-np.inf, [0])])
def test_the_non_finite_check_skips_only_where_a_gradient_is_not_finite(value, skipped):
    """Gradients of 1e30 have a sum of squares that overflows float32; they are finite, so
    the update is applied; an infinite one is skipped."""
    net = Net(NET)
    solver = Solver(net, base_lr=1e-35, comm=OneRankSentHugeValues(value), nonfinite="skip",
                    max_skipped=1)
    solver.step(1, feed=batch)
    assert [s.iter for s in solver.skipped] == skipped
    assert np.isfinite(net.store.data).all()
