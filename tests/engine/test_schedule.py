"""One schedule for every run (docs/design.md, 6. Memory): the forward pass, backward, the
forward runs backward makes again, the weight-gradient GEMMs and the zeroing of diffs are
actions of one list, which the executor runs in one loop."""

from collections import Counter

import pytest

from unroll import expand, to_prototxt
from unroll.engine import executor
from unroll.engine.memory import Checkpoints, schedule
from unroll.engine.net import Net

T = 96  # three weight-gradient chunks


def lstm(**options) -> Net:
    text = "force_backward: true\n" + to_prototxt(expand(
        "lstm", steps=T, batch=2, input_dim=3, hidden=4)) + f"""
layer {{ name: "target" type: "Input" top: "target"
        input_param {{ shape {{ dim: {T} dim: 2 dim: 4 }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "target" top: "loss" }}
"""
    net = Net(text, **options)
    net.memory.for_forward()  # bound: the schedule has its GEMMs and its lives
    return net


def plan_of(net):
    """The schedule the net runs, which is the one its plan gives."""
    live, m = net.memory.liveness, net.memory
    made = schedule(len(m.fwd), [entry[0] for entry in m.bwd], live.zero_before,
                    live.recompute, [g.after for g in m.layout.groups], m.regions)
    assert made == m.schedule
    return m.schedule


@pytest.mark.parametrize("options", [{}, {"recompute": "sqrt"}, {"recompute": "hsm"},
                                     {"recompute": Checkpoints(lambda k, n: k % 2 == 0)}],
                         ids=["full", "sqrt", "hsm", "checkpoints"])
def test_every_step_runs_backward_once_and_forward_as_the_plan_recomputes(options):
    net = lstm(**options)
    plan = plan_of(net)
    forward = Counter(a.kind for a in plan.actions[: plan.backward])
    backward = Counter(a.kind for a in plan.actions[plan.backward :])
    assert forward["forward"] == len(net.memory.fwd)
    assert backward["backward"] == len(net.memory.bwd)
    assert backward["gemm"] == len(net.memory.layout.groups) > 0
    recompute = net.memory.liveness.recompute
    assert backward["forward"] == (0 if recompute is None else recompute.recomputed)
    assert backward["relive"] == (0 if recompute is None else
                                  sum(1 for a in recompute.order if a >= 0))


def test_a_gemm_runs_after_the_backward_of_the_step_it_follows():
    net = lstm(recompute="hsm")
    plan = plan_of(net)
    done = set()
    for action in plan.actions[plan.backward :]:
        if action.kind == "backward":
            done.add(action.at)
        elif action.kind == "gemm":
            assert net.memory.layout.groups[action.at].after in done


def test_the_schedule_is_the_one_the_net_runs():
    net = lstm(recompute="sqrt")
    plan = plan_of(net)
    ran = Counter(a[0] for a in net.memory.actions)
    kinds = Counter(a.kind for a in plan.actions)
    assert (ran[executor.FORWARD], ran[executor.BACKWARD], ran[executor.GEMM]) == (
        kinds["forward"], kinds["backward"], kinds["gemm"])
    assert ran[executor.BIND] > 0  # the lives of the runs, bound as each run starts
