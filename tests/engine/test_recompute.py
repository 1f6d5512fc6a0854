"""Training in a memory budget (docs/design.md, 6. Memory): segments of the run order are
recomputed in backward, and every result is bit-identical to the plan without a budget."""

import heapq
import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.net_helpers import host
from unroll import expand, testing, to_prototxt
from unroll.core.errors import MemoryBudgetError, NetError
from unroll.core.proto import LayerParameter
from unroll.engine.memory import GRADIENT_CHUNK, Checkpoints, Policy, bptt_hsm, hsm_order
from unroll.engine.net import Net
from unroll.testing import builtin_templates
from unroll.train.bucketing import cont_from_lengths

CELLS = builtin_templates("step")


def recurrent_net(cell, T, N, layers, direction, dropout, D=3, H=4):
    """A recurrent layer (``expand``) under a Euclidean loss, optionally Dropout on its output."""
    width = 2 * H if direction == "bidirectional" else H
    drop = ('layer { name: "drop" type: "Dropout" bottom: "h" top: "h" '
            'dropout_param { dropout_ratio: 0.3 } }\n' if dropout else "")
    return "force_backward: true\n" + to_prototxt(expand(
        cell, steps=T, batch=N, input_dim=D, hidden=H, direction=direction,
        layers=layers)) + drop + f"""
layer {{ name: "target" type: "Input" top: "target"
        input_param {{ shape {{ dim: {T} dim: {N} dim: {width} }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "target" top: "loss" }}
"""


def feed_for(net, T, lengths, seed=0):
    rng = np.random.default_rng(seed)
    feed = {name: rng.normal(size=net.blobs[name].shape) for name in net.inputs}
    feed["cont"] = cont_from_lengths(lengths, T)
    return feed


def train_step(net, feed, wrt="x"):
    """One forward and backward: the output, the loss, the input's diff, the param diffs."""
    net.seed(5)  # Dropout's masks: the same draws in every net compared
    out = {k: host(v).copy() for k, v in net.forward(**feed).items()}
    net.clear_param_diffs()
    net.backward()
    return (out, net.loss, host(net.blobs[wrt].diff).copy() if wrt else None,
            {p.name: host(p.blob.diff).copy() for p in net.learnable_params})


def assert_identical(got, want):
    (out, loss, dx, grads), (out0, loss0, dx0, grads0) = got, want
    assert loss == loss0
    for k in out0:
        np.testing.assert_array_equal(out[k], out0[k], err_msg=k)
    if dx0 is not None:
        np.testing.assert_array_equal(dx, dx0)
    for k in grads0:
        np.testing.assert_array_equal(grads[k], grads0[k], err_msg=k)


def smallest_budget(text, dtype) -> int:
    with pytest.raises(MemoryBudgetError) as error:
        Net(text, dtype=dtype, memory_budget=1)
    return error.value.smallest


#: short nets, and nets longer than a weight-gradient chunk (GRADIENT_CHUNK steps): their
#: input projections and weight gradients run by chunks, and segments are cut between them
LENGTHS = st.one_of(st.integers(2, 7), st.integers(GRADIENT_CHUNK + 1, GRADIENT_CHUNK + 8))


def chains(steps, longest):
    """What the budget properties draw: recurrent layers of every template, ``steps`` long,
    over packed sequences of up to ``longest`` steps."""
    return dict(cell=st.sampled_from(CELLS), layers=st.integers(1, 2), T=steps,
                lengths=st.lists(st.integers(1, longest), min_size=1, max_size=3),
                direction=st.sampled_from(["forward", "bidirectional"]),
                dropout=st.booleans(), dtype=st.sampled_from(["float32", "float64"]),
                where=st.floats(0, 1))


def full_plan_step(cell, layers, T, lengths, direction, dropout, dtype):
    """A drawn chain's prototxt, its training step in the full plan, and its planned bytes."""
    text = recurrent_net(cell, T, len(lengths), layers, direction, dropout)
    full = Net(text, dtype=dtype, seed=3)
    return (text, train_step(full, feed_for(full, T, lengths)),
            full.inspect().recompute["planned_bytes"])


@settings(max_examples=12, deadline=None)
@given(**chains(LENGTHS, GRADIENT_CHUNK + 8))
def test_a_budgeted_net_is_bit_identical_to_the_full_plan(cell, layers, T, lengths, direction,
                                                          dropout, dtype, where):
    lengths = [min(n, T) for n in lengths]
    text, want, need = full_plan_step(cell, layers, T, lengths, direction, dropout, dtype)
    least = smallest_budget(text, dtype)
    budget = int(least + where * (need - least))
    for kw in ({"memory_budget": budget}, {"recompute": "sqrt"}, {"recompute": "none"},
               {"recompute": Checkpoints(lambda k, n: k % 2 == 1)}):
        net = Net(text, dtype=dtype, seed=3, **kw)
        assert_identical(train_step(net, feed_for(net, T, lengths)), want)
        assert_identical(train_step(net, feed_for(net, T, lengths)), want)  # a second step
        if "memory_budget" in kw:  # the workspace's high-water mark after a real run
            assert net.workspace.nbytes <= budget


@settings(max_examples=6, deadline=None)
@given(cell=st.sampled_from(["lstm", "gru"]), layers=st.integers(1, 2), T=st.integers(2, 6),
       lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       dropout=st.sampled_from([0.0, 0.3]), where=st.floats(0, 1))
def test_the_tagger_template_in_a_budget_is_bit_identical(cell, layers, T, lengths, dropout,
                                                          where):
    lengths = [min(n, T) for n in lengths]
    text = to_prototxt(expand("tagger", steps=T, batch=len(lengths), vocab=20, tags=7,
                              embed=4, hidden=4, layers=layers, cell=cell, dropout=dropout))
    rng = np.random.default_rng(1)
    cont = cont_from_lengths(lengths, T)
    inside = np.arange(T)[:, None] < np.array(lengths)[None, :]
    feed = dict(words=rng.integers(0, 20, (T, len(lengths))), cont=cont,
                labels=np.where(inside, rng.integers(0, 7, (T, len(lengths))), -1))
    full = Net(text, dtype="float64", seed=3)
    want = train_step(full, feed, wrt=None)
    need = full.inspect().recompute["planned_bytes"]
    least = smallest_budget(text, "float64")
    net = Net(text, dtype="float64", seed=3, memory_budget=int(least + where * (need - least)))
    assert_identical(train_step(net, feed, wrt=None), want)


@settings(max_examples=30, deadline=None)
@given(net=testing.random_nets(8, 16, max_layers=30), where=st.floats(0, 1),
       seed=st.integers(0, 3))
def test_a_random_net_in_a_budget_is_bit_identical(net, where, seed):
    # fan-out, in-place chains, Dropout in place, views, Slice and Concat, shared params
    text, keep = net
    rng = np.random.default_rng(seed)
    feed = dict(x=rng.normal(size=(8, 16)), t=rng.normal(size=(8, 16)))
    full = Net(text, dtype="float64", seed=3, keep=keep)
    want = train_step(full, feed)
    need = full.inspect().recompute["planned_bytes"]
    with pytest.raises(MemoryBudgetError) as error:
        Net(text, dtype="float64", keep=keep, memory_budget=1)
    budget = int(error.value.smallest + where * (need - error.value.smallest))
    net = Net(text, dtype="float64", seed=3, keep=keep, memory_budget=budget)
    assert_identical(train_step(net, feed), want)
    assert_identical(train_step(net, feed), want)


def test_the_planned_peak_is_within_the_budget_and_recomputes():
    T = 40
    text = recurrent_net("gru", T, 2, 1, "forward", False, D=8, H=16)
    full = Net(text, dtype="float64", seed=3)
    want = train_step(full, feed_for(full, T, [T, 30]))
    need = full.inspect().recompute["planned_bytes"]
    budget = (smallest_budget(text, "float64") + need) // 2
    net = Net(text, dtype="float64", seed=3, memory_budget=budget)
    assert_identical(train_step(net, feed_for(net, T, [T, 30])), want)
    assert net.workspace.nbytes <= budget < need
    plan = net.inspect().recompute
    assert plan["checkpoints"] and plan["recomputed_steps"] > 0
    assert plan["planned_bytes"] <= budget and plan["budget"] == budget
    assert "recomputed in backward" in str(net.inspect())


def whole_output_loss_net(cell, T, N, D, H):
    """A recurrent layer under one Euclidean loss over its whole (T, N, H) output, the target
    first: under a budget the loss runs by chunks of time, a piece right after each chunk
    (docs/design.md, 6. Memory, the whole-output loss)."""
    return f"""force_backward: true
layer {{ name: "target" type: "Input" top: "target"
        input_param {{ shape {{ dim: {T} dim: {N} dim: {H} }} }} }}
""" + to_prototxt(expand(cell, steps=T, batch=N, input_dim=D, hidden=H)) + """
layer { name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "target" top: "loss" }
"""


def per_step_loss_net(cell, T, N, D, H):
    """A recurrent layer with a Euclidean loss right after each step (its output is never
    whole), as a long stream trains."""
    net_param = expand(cell, steps=T, batch=N, input_dim=D, hidden=H)
    net_param.force_backward = True
    layers = list(net_param.layer)
    concat = next(lp for lp in layers if list(lp.top) == ["h"])
    step_of = {h: t for t, h in enumerate(concat.bottom)}
    target = LayerParameter(name="target", type="Input", top=["target"])
    target.input_param.shape.add(dim=[T, N, H])
    cut = LayerParameter(name="target_slice", type="Slice", bottom=["target"],
                         top=[f"target_t{t}" for t in range(T)])
    cut.slice_param.axis = 0
    del net_param.layer[:]
    net_param.layer.extend([target, cut])
    for lp in layers:
        if lp is concat:
            continue
        net_param.layer.append(lp)
        for top in (t for t in lp.top if t in step_of):
            net_param.layer.add(name=f"loss_t{step_of[top]}", type="EuclideanLoss",
                                bottom=[top, f"target_t{step_of[top]}"],
                                top=[f"loss_t{step_of[top]}"])
    return to_prototxt(net_param)


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_long_chain_trains_in_an_eighth_of_its_full_plan(cell):
    # chunked input projections and weight gradients leave nothing T steps long but the
    # checkpoints (docs/design.md, 6. Memory)
    T, N, H = 20 * GRADIENT_CHUNK, 4, 16
    text = per_step_loss_net(cell, T, N, H, H)
    rng = np.random.default_rng(2)
    feed = dict(x=rng.normal(size=(T, N, H)), target=rng.normal(size=(T, N, H)),
                cont=cont_from_lengths([T, T - 50, 100, 7], T))
    full = Net(text, dtype="float64", seed=3)
    want = train_step(full, feed)
    need = full.inspect().recompute["planned_bytes"]
    assert smallest_budget(text, "float64") <= need // 8
    for budget in (need // 4, need // 8):
        net = Net(text, dtype="float64", seed=3, memory_budget=budget)
        assert_identical(train_step(net, feed), want)
        assert net.workspace.nbytes <= budget  # the high-water mark after a real step
        plan = net.inspect().recompute
        assert plan["planned_bytes"] <= budget and plan["recomputed_steps"] > 0


def test_too_small_a_budget_names_the_smallest_that_works():
    text = recurrent_net("lstm", 6, 2, 1, "forward", False)
    with pytest.raises(MemoryBudgetError, match=r"memory_budget 1,000 bytes is too small: "
                                                r"the smallest plan found needs [\d,]+ bytes"):
        Net(text, dtype="float64", memory_budget=1000)
    least = smallest_budget(text, "float64")
    net = Net(text, dtype="float64", memory_budget=least)
    train_step(net, feed_for(net, 6, [6, 4]))
    assert net.workspace.nbytes <= least


class EveryAllowedCut(Policy):
    """A policy of the user's own, choosing through the interface: a checkpoint wherever a
    segment may start, unless that is over the budget."""

    def choose(self, chain, plans, budget):
        got = plans.of(chain.allowed)
        return got if budget is None or got.bytes <= budget else None


class OutOfOrder(Policy):
    def choose(self, chain, plans, budget):
        return plans.of(tuple(reversed(chain.allowed)))


@settings(max_examples=6, deadline=None)
@given(**chains(st.integers(3 * GRADIENT_CHUNK, 5 * GRADIENT_CHUNK), 5 * GRADIENT_CHUNK),
       every=st.integers(1, 2))
def test_the_users_policies_are_bit_identical_and_held_to_the_budget(
        cell, layers, T, lengths, direction, dropout, dtype, where, every):
    lengths = [min(n, T) for n in lengths]
    text, want, need = full_plan_step(cell, layers, T, lengths, direction, dropout, dtype)
    places = Net(text, dtype=dtype, recompute=Checkpoints(lambda k, n: True)).memory.liveness\
        .recompute.cuts  # where every chunk but the first starts
    keep_every = Checkpoints(lambda k, n: k % every == 0)  # a checkpoint every k-th chunk
    for policy, cuts in ((keep_every, places[every - 1::every]), (EveryAllowedCut(), None)):
        alone = Net(text, dtype=dtype, seed=3, recompute=policy)
        rc = alone.memory.liveness.recompute
        assert rc.recomputed > 0 and (cuts is None or rc.cuts == cuts)
        assert_identical(train_step(alone, feed_for(alone, T, lengths)), want)
        planned = alone.inspect().recompute["planned_bytes"]
        # a policy keeps its checkpoints: on a short chain its plan may need more than the
        # full plan does, and no budget below its plan is one it can keep
        budget = int(planned + where * max(need - planned, 0))
        net = Net(text, dtype=dtype, seed=3, recompute=policy, memory_budget=budget)
        assert_identical(train_step(net, feed_for(net, T, lengths)), want)
        assert net.workspace.nbytes <= budget  # the high-water mark after a real step


def test_a_policy_is_held_to_the_budget_and_to_the_cuts_allowed():
    T = 3 * GRADIENT_CHUNK
    text = per_step_loss_net("gru", T, 2, 4, 4)
    with pytest.raises(MemoryBudgetError, match="memory_budget 1,000 bytes is too small"):
        Net(text, recompute=Checkpoints(lambda k, n: True), memory_budget=1000)
    with pytest.raises(MemoryBudgetError, match="the smallest plan found needs"):
        Net(text, recompute="none", memory_budget=1000)
    with pytest.raises(ValueError, match=r"recompute policy OutOfOrder\(\) cuts at steps "
                                         r"\[\d+, .*expected ascending steps"):
        Net(text, recompute=OutOfOrder())


@settings(max_examples=8, deadline=None)
@given(cell=st.sampled_from(CELLS), layers=st.integers(1, 2),
       T=st.sampled_from([3 * GRADIENT_CHUNK, 4 * GRADIENT_CHUNK]),
       direction=st.sampled_from(["forward", "bidirectional"]),
       options=st.sampled_from([{"recompute": "sqrt"}, {"recompute": "hsm"}, "smallest"]))
def test_a_plan_moves_the_full_plans_diff_lifetimes_to_its_own_times(cell, layers, T,
                                                                      direction, options):
    # docs/design.md, 6. Memory: every backward touches the same diffs in every plan, so an
    # attempt takes the full plan's diff lifetimes and zeroing at its own backward times;
    # walking the layers' diffs for the plan gives the same
    text = recurrent_net(cell, T, 2, layers, direction, dropout=True)
    if options == "smallest":
        options = {"memory_budget": smallest_budget(text, "float64")}
    executor = Net(text, dtype="float64", **options).memory
    plan = executor.liveness.recompute
    moved, walked = executor.make(plan, base=executor.base), executor.make(plan)
    assert plan is not None and moved.back == walked.back
    assert list(moved.diff_life.items()) == list(walked.diff_life.items())
    assert list(moved.zero_before.items()) == list(walked.zero_before.items())


def test_an_attempt_is_one_liveness_walk_and_one_layout(monkeypatch):
    # planning cost, counted (bench/bench_recompute.py times it): what does not depend on
    # the cuts is found once, the full plan's liveness once per net, whatever its shapes
    from unroll.core import proto
    from unroll.engine import memory
    from unroll.engine.memory import budget as mechanism
    layout_module = importlib.import_module("unroll.engine.memory.layout")  # not the function

    counts: dict[str, int] = {}

    def counted(name, fn, is_attempt):
        def wrapper(*args, **kwargs):
            key = f"{name} {'attempt' if is_attempt(args, kwargs) else 'full'}"
            counts[key] = counts.get(key, 0) + 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(memory, "liveness", counted(
        "liveness", memory.liveness, lambda a, kw: (a[8] if len(a) > 8 else
                                                    kw.get("recompute")) is not None))
    monkeypatch.setattr(memory, "layout", counted(
        "layout", memory.layout, lambda a, kw: a[0].recompute is not None))
    monkeypatch.setattr(mechanism, "recomputable", counted(
        "recomputable", mechanism.recomputable, lambda a, kw: True))
    # what lives inside what: found once per net and shapes, and the data run again
    # taken out of it once for every attempt
    for module, name, attempt in ((layout_module, "aliases_of", False),
                                  (mechanism, "aliases_of", False),
                                  (mechanism, "relived_aliases", True)):
        monkeypatch.setattr(module, name, counted(
            "aliases", getattr(module, name), lambda a, kw, attempt=attempt: attempt))
    # the prototxt is parsed once per net, not once per attempt
    monkeypatch.setattr(proto, "parse_text", counted(
        "parse", proto.parse_text, lambda a, kw: False))
    T = 3 * GRADIENT_CHUNK
    text = per_step_loss_net("gru", T, 2, 4, 4)
    least = smallest_budget(text, "float64")
    counts.clear()
    net = Net(text, dtype="float64", seed=3, memory_budget=least)
    assert net.memory.liveness.recompute.recomputed > 0
    attempts = counts["layout attempt"]
    assert attempts >= 2 and counts == {"parse full": 1, "liveness full": 1,
                                        "layout full": 1, "liveness attempt": attempts,
                                        "recomputable attempt": 1, "layout attempt": attempts,
                                        "aliases full": 1, "aliases attempt": 1}
    rng = np.random.default_rng(0)  # a batch of 1, not 2 (axis 1 of every input)
    feed = {name: rng.normal(size=(net.blobs[name].shape[0], 1, *net.blobs[name].shape[2:]))
            for name in net.inputs}
    feed["cont"] = cont_from_lengths([T], T)
    net.forward(**feed)  # a new layout, and plan
    assert counts["liveness full"] == 1 and counts["layout full"] == 2
    assert counts["aliases full"] == 2  # once per net and shapes
    assert counts["recomputable attempt"] == 2 and counts["aliases attempt"] == 2
    assert counts["liveness attempt"] == counts["layout attempt"]


def test_a_budget_is_refused_where_it_cannot_be_planned():
    text = recurrent_net("lstm", 4, 2, 1, "bidirectional", False)
    with pytest.raises(NetError, match="concurrent=True runs branches at once"):
        Net(text, concurrent=True, recompute="sqrt")
    with pytest.raises(NetError, match="plan_memory=False keeps every blob"):
        Net(text, plan_memory=False, memory_budget=10**6)
    with pytest.raises(ValueError, match=r"recompute must be None, one of \['hsm', 'none', "
                                         r"'sqrt'\] or a unroll.engine.memory.Policy"):
        Net(text, recompute="log")


def test_layers_that_cannot_be_recomputed_keep_their_values():
    # BatchNorm's forward updates its statistics: recomputed, they would move twice
    from unroll.engine.layer import LAYERS

    assert not LAYERS["BatchNorm"].memory.recomputable
    assert not LAYERS["Input"].memory.recomputable
    assert LAYERS["Dropout"].draws_random  # kept too: its masks are the forward's


# -- Gruslys et al.'s dynamic program against a search over every policy -------------------
def fewest_forwards(t: int, slots: int) -> int:
    """Backpropagating a chain of t steps keeping at most ``slots`` hidden states (h_0 is
    one): a shortest path over (kept states, steps left). Moves: run forward from the
    nearest kept state to a later one and keep it (one forward per step), or backpropagate
    the last step left, running forward to it from the nearest kept state first."""
    start = (frozenset([0]), t)
    best = {start: 0}
    queue = [(0, 0, start)]
    while queue:
        cost, _, (kept, left) = heapq.heappop(queue)
        if left == 0:
            return cost
        if cost > best[(kept, left)]:
            continue
        p = max(k for k in kept if k < left)
        moves = [((frozenset(k for k in kept if k < left - 1), left - 1), left - p)]
        if len(kept) < slots:
            moves += [((kept | {q}, left), q - p) for q in range(p + 1, left)]
        for state, step in moves:
            if cost + step < best.get(state, 1 << 30):
                best[state] = cost + step
                heapq.heappush(queue, (cost + step, id(state), state))
    raise AssertionError("unreachable")


def states_held(t: int, order) -> int:
    """The most states a policy (:func:`hsm_order`'s actions after the forward pass) holds
    at once, h_0 included, checking that it backpropagates the chain: each step's
    backward once, last first, right after its forward; each forward run from a state
    written before."""
    actions = [*range(t), *order]
    assert [~a for a in actions if a < 0] == list(reversed(range(t)))
    written, spans = {0: -1}, {}
    for i, a in enumerate(actions):
        if a < 0:
            assert actions[i - 1] == ~a
        else:
            if i == 0 or actions[i - 1] != a - 1:  # a run starts from the state kept at a
                key = (a, written[a])
                spans[key] = max(spans.get(key, i), i)
            written[a + 1] = i
    return max(sum(w <= i <= last for (_, w), last in spans.items())
               for i in range(len(actions)))


@pytest.mark.parametrize("slots", [1, 2, 3, 4])
def test_the_dynamic_program_finds_the_fewest_forward_steps(slots):
    for t in range(1, 13):
        assert bptt_hsm(t, slots) == fewest_forwards(t, slots), (t, slots)


@pytest.mark.parametrize("slots", [1, 2, 3, 4, 6])
def test_the_executed_policy_runs_the_fewest_forward_steps_in_its_slots(slots):
    for t in range(1, 13):
        order = hsm_order(t, slots)
        forwards = t + sum(a >= 0 for a in order)
        assert forwards == fewest_forwards(t, slots) == bptt_hsm(t, slots), (t, slots)
        assert states_held(t, order) <= slots, (t, slots)


#: chains of three weight-gradient chunks or more: BPTT-HSM plans over their chunks
HSM_LENGTHS = st.integers(2 * GRADIENT_CHUNK + 2, 4 * GRADIENT_CHUNK)


@settings(max_examples=8, deadline=None)
@given(**chains(HSM_LENGTHS, 4 * GRADIENT_CHUNK))
def test_bptt_hsm_is_bit_identical_to_the_full_plan(cell, layers, T, lengths, direction,
                                                    dropout, dtype, where):
    lengths = [min(n, T) for n in lengths]
    text, want, need = full_plan_step(cell, layers, T, lengths, direction, dropout, dtype)
    fewest = Net(text, dtype=dtype, seed=3, recompute="hsm")  # the least memory
    plan = fewest.inspect().recompute
    # a loss over the whole output keeps it: small nets may need less without recomputing,
    # and by chunks of time (what a budget plans) less than as written
    assert plan["planned_bytes"] < need if plan["policy"] is not None else (
        plan["planned_bytes"] <= need)
    budget = int(plan["planned_bytes"] + where * (need - plan["planned_bytes"]))
    for net in (fewest, Net(text, dtype=dtype, seed=3, recompute="hsm", memory_budget=budget)):
        assert_identical(train_step(net, feed_for(net, T, lengths)), want)
        assert_identical(train_step(net, feed_for(net, T, lengths)), want)  # a second step
    assert net.workspace.nbytes <= budget


def test_a_budget_one_level_cannot_reach_is_planned_by_bptt_hsm():
    T, N, H = 6 * GRADIENT_CHUNK, 3, 5
    text = per_step_loss_net("lstm", T, N, H, H)
    rng = np.random.default_rng(2)
    feed = dict(x=rng.normal(size=(T, N, H)), target=rng.normal(size=(T, N, H)),
                cont=cont_from_lengths([T, T - 50, 20], T))
    want = train_step(Net(text, dtype="float64", seed=3), feed)
    one_level = [Net(text, dtype="float64", recompute="sqrt")]
    least = smallest_budget(text, "float64")
    net = Net(text, dtype="float64", seed=3, memory_budget=least)
    rc = net.memory.liveness.recompute
    assert rc.slots is not None and net.inspect().recompute["policy"].startswith("BPTT-HSM")
    assert least < one_level[0].inspect().recompute["planned_bytes"]
    assert_identical(train_step(net, feed), want)
    assert net.workspace.nbytes <= least
    # the executed policy is the dynamic program's: so many forward runs of the segments
    segments = len(rc.cuts) + 1
    assert segments + sum(a >= 0 for a in rc.order) == bptt_hsm(segments, rc.slots)


def test_a_budget_lays_out_few_bptt_hsm_slot_counts(monkeypatch):
    # a loss over the whole output leaves no one-level plan in a tight budget, and their
    # bounds say so (each checkpoint holds its chunk's Concat of h): none is laid out; of
    # the slot counts, the most that fit, found laying out a few (docs/design.md, 6. Memory)
    budget_module = importlib.import_module("unroll.engine.memory.budget")
    laid: dict[int, int] = {}
    one_level = []
    of = budget_module.Plans.of

    def counted(plans, cuts, order=(), slots=None):
        if not order and (tuple(cuts), ()) not in plans._made:
            one_level.append(tuple(cuts))
        plan = of(plans, cuts, order, slots)
        if slots is not None:
            assert slots not in laid or laid[slots] == plan.bytes
            laid[slots] = plan.bytes
        return plan

    monkeypatch.setattr(budget_module.Plans, "of", counted)
    T, N, H = 40 * GRADIENT_CHUNK, 4, 16
    text = whole_output_loss_net("lstm", T, N, H, H)
    budget = Net(text).inspect().recompute["planned_bytes"] * 2 // 25
    laid.clear()
    net = Net(text, memory_budget=budget)
    slots = net.memory.liveness.recompute.slots
    assert net.inspect().recompute["policy"].startswith("BPTT-HSM")
    assert one_level == []  # laying out every one weighed: 5 of them
    # the most slots that fit: the next count laid out, and over the budget
    assert laid[slots] <= budget < laid[slots + 1]
    assert len(laid) <= 3  # the first where the bound rising by a checkpoint a slot fits


def test_on_a_gpu_recomputation_adds_launches_and_no_sync():
    from unroll.engine import trace

    T = 3 * GRADIENT_CHUNK
    text = per_step_loss_net("gru", T, 2, 8, 16)
    counts = {}
    for label, kw, policy in (("full", {}, "None"), ("one level", {"recompute": "sqrt"},
                                                     "one level"),
                              ("hsm", {"recompute": "hsm"}, "BPTT-HSM")):
        net = Net(text, device="trace", seed=3, **kw)
        assert str(net.inspect().recompute["policy"]).startswith(policy)
        feed = {k: trace.asarray(v.astype(np.float32))
                for k, v in feed_for(net, T, [T, 5]).items()}
        net.forward(**feed)
        net.backward()  # a first step binds the workspace
        with trace.measure() as counted:
            net.forward(**feed)
            net.clear_param_diffs()
            net.backward()
        counts[label] = counted
    assert min(counts["hsm"].launches, counts["one level"].launches) > counts["full"].launches
    assert counts["one level"].syncs == counts["hsm"].syncs == counts["full"].syncs == 0


def test_unroll_memory_with_a_budget_shows_the_recomputation(tmp_path, capsys):
    from unroll.tools import cli

    path = tmp_path / "gru.prototxt"
    path.write_text(recurrent_net("gru", 40, 2, 1, "forward", False, D=8, H=16))
    least = smallest_budget(path.read_text(), "float64")
    assert cli.main(["memory", str(path), "--dtype", "float64", "--budget", str(least)]) == 0
    out = capsys.readouterr().out
    assert "recomputed in backward:" in out and f"of a budget of {least / 1024:.1f} KiB" in out
    assert cli.main(["memory", str(path), "--budget", "1kB"]) == 2
    assert "is too small: the smallest plan found needs" in capsys.readouterr().err


@pytest.mark.parametrize("cell, direction", [("lstm", "forward"), ("gru", "reverse"),
                                             ("rnn", "bidirectional")])
def test_a_chain_longer_than_a_chunk_has_its_gradients(cell, direction):
    # the input projection by chunks of GRADIENT_CHUNK steps, each right before its steps
    # (from step T-1 down in reverse), and the weight gradients by chunks: still the net's
    # gradients, against finite differences
    T = GRADIENT_CHUNK + 5
    text = recurrent_net(cell, T, 1, 1, direction, False, D=2, H=2)
    net = Net(text, dtype="float64", seed=3)
    projections = [n for n in net.layer_names if "x_proj_seq_c" in n]
    assert len(projections) == 2 * (2 if direction == "bidirectional" else 1)
    for name, value in feed_for(net, T, [T]).items():
        net.blobs[name].data[...] = value
    testing.check_net_gradient(net, wrt=["x"])
