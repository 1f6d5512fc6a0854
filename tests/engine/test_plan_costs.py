"""What a recomputation plan costs without its liveness or its layout (docs/design.md,
6. Memory): the forward steps counted are the walk's, the bound on its bytes never exceeds
the bytes laid out, and a budget chooses the plan it chose laying out every candidate."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.test_recompute import (
    CELLS,
    GRADIENT_CHUNK,
    per_step_loss_net,
    recurrent_net,
    whole_output_loss_net,
)
from unroll import testing
from unroll.core.errors import MemoryBudgetError
from unroll.engine.memory import FewestRecomputed, Policy, budget, hsm_order
from unroll.engine.net import Net


class Weighed(Policy):
    """Keeps what a budget's policy sees (the chain and its plans) and chooses the full
    plan."""

    def choose(self, chain, plans, budget):
        self.chain, self.plans = chain, plans
        return None


def weighed(text, keep=()):
    policy = Weighed()
    Net(text, dtype="float64", seed=3, keep=list(keep), recompute=policy)
    return policy.chain, policy.plans


NETS = st.one_of(
    st.builds(lambda cell, T, layers, direction, dropout: (recurrent_net(
        cell, T, 2, layers, direction, dropout), ()),
        st.sampled_from(CELLS), st.one_of(st.integers(2, 7),
                                          st.integers(2 * GRADIENT_CHUNK + 1,
                                                      3 * GRADIENT_CHUNK + 4)),
        st.integers(1, 2), st.sampled_from(["forward", "bidirectional"]), st.booleans()),
    st.builds(lambda cell, T: (per_step_loss_net(cell, T, 2, 3, 4), ()),
              st.sampled_from(["lstm", "gru"]),
              st.integers(2 * GRADIENT_CHUNK + 1, 3 * GRADIENT_CHUNK + 4)),
    # pieces of the loss by chunk, and the parts run again inside their wholes
    st.builds(lambda cell, T: (whole_output_loss_net(cell, T, 2, 3, 4), ()),
              st.sampled_from(["lstm", "gru", "rnn"]),
              st.integers(2 * GRADIENT_CHUNK + 1, 4 * GRADIENT_CHUNK + 4)),
    testing.random_nets(8, 16, max_layers=30))


@settings(max_examples=25, deadline=None)
@given(net=NETS, data=st.data())
def test_a_plans_counted_runs_are_its_walks_and_its_bound_is_below_its_bytes(net, data):
    text, keep = net
    chain, plans = weighed(text, keep)
    for _ in range(3):
        cuts = sorted(data.draw(st.sets(st.sampled_from(chain.allowed), max_size=12))
                      if chain.allowed else ())
        plan = plans.of(cuts)
        assert plans.recomputed(cuts) == plan.recomputed
        ran = {s for run in plan.liveness.recompute.runs if run is not None for s in run}
        assert np.flatnonzero(plans.costs.runs_again(cuts)).tolist() == sorted(ran)
        assert plans.least(cuts) <= plan.bytes
    if len(chain.units) >= 2:  # BPTT-HSM's plans, in any number of slots
        n = len(chain.units) + 1
        slots = data.draw(st.integers(1, n))
        plan = plans.of(chain.units, hsm_order(n, slots), slots)
        assert plans.least(chain.units, hsm_order(n, slots), slots) <= plan.bytes


def never_bounded(monkeypatch):
    """Plans.least at 0: every plan a policy weighs is laid out."""
    monkeypatch.setattr(budget.Plans, "least", lambda self, cuts, order=(), slots=None: 0)


@settings(max_examples=25, deadline=None)
@given(net=NETS, where=st.floats(0, 1), policy=st.sampled_from([None, "hsm"]))
def test_a_budget_chooses_the_plan_of_laying_out_every_candidate(net, where, policy):
    text, keep = net
    full = Net(text, dtype="float64", seed=3, keep=list(keep)).inspect().recompute
    with pytest.raises(MemoryBudgetError) as error:
        Net(text, dtype="float64", keep=list(keep), memory_budget=1)
    least = error.value.smallest
    limit = int(least + where * (full["planned_bytes"] - least))

    def chosen(budget_):
        try:
            net_ = Net(text, dtype="float64", seed=3, keep=list(keep), recompute=policy,
                       memory_budget=budget_)
        except MemoryBudgetError as e:
            return str(e)
        live, lay = net_.memory.liveness, net_.memory.layout
        rc = live.recompute
        return (None if rc is None else (rc.cuts, rc.order, rc.slots, rc.recomputed),
                lay.total, np.asarray(lay.offset["data"]).tobytes(),
                np.asarray(lay.offset["diff"]).tobytes())

    got = [chosen(b) for b in (1, limit)]
    with pytest.MonkeyPatch.context() as monkeypatch:
        never_bounded(monkeypatch)
        assert [chosen(b) for b in (1, limit)] == got
    # the one-level plans of the default policy, all laid out: of those that fit, the fewest
    # steps run again, then the fewest bytes, is the one chosen
    chain, plans = weighed(text, keep)
    fits = [plan for plan in map(plans.of, FewestRecomputed.candidates(chain))
            if plan.bytes <= limit]
    # (the full plan of the net a budget plans: a loss over a whole output runs by chunks)
    if policy is None and fits and plans.full.bytes > limit:
        want = min(fits, key=lambda plan: (plan.recomputed, plan.bytes))
        assert got[1][0][0] == want.liveness.recompute.cuts and got[1][0][2] is None
        assert (got[1][0][3], got[1][1]) == (want.recomputed, want.layout.total)


def test_a_budget_lays_out_only_the_plans_its_bound_lets_fit(monkeypatch):
    # planning cost, counted (bench/bench_recompute.py times it): of the one-level plans a
    # budget weighs, those whose bound is over the budget are never laid out
    layouts, bounded = [], []
    of, least = budget.Plans.of, budget.Plans.least

    def counted_of(self, cuts, order=(), slots=None):
        if (tuple(cuts), tuple(order)) not in self._made:
            layouts.append(tuple(cuts))
        return of(self, cuts, order, slots)

    def counted_least(self, cuts, order=(), slots=None):
        bounded.append(tuple(cuts))
        return least(self, cuts, order, slots)

    monkeypatch.setattr(budget.Plans, "of", counted_of)
    monkeypatch.setattr(budget.Plans, "least", counted_least)
    T = 8 * GRADIENT_CHUNK  # a long chain's shape: 8 chunks, a loss at each step
    text = per_step_loss_net("lstm", T, 4, 32, 32)
    full = Net(text, dtype="float64").inspect().recompute["planned_bytes"]
    layouts.clear()
    net = Net(text, dtype="float64", memory_budget=full // 5)
    assert net.memory.liveness.recompute.recomputed > 0
    assert len(bounded) == 6 and len(layouts) == 3  # laying out every one weighed: 6
