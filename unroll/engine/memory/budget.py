"""Planning within a memory budget: the mechanism a recompute policy
(:mod:`unroll.engine.memory.policy`) chooses over (docs/design.md, 6. Memory).

:func:`within_budget` reads the net's :class:`~unroll.engine.memory.policy.Chain` once,
hands the policy a :class:`Plans` that makes each plan it weighs (a liveness and a
layout, each made once), and holds the one chosen to the budget.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter

import numpy as np

from unroll.core.errors import MemoryBudgetError
from unroll.engine.memory.aliases import aliases_of, relived_aliases
from unroll.engine.memory.costs import plan_costs
from unroll.engine.memory.hsm import hsm_units
from unroll.engine.memory.layout import Layout, input_roots, planned_bytes
from unroll.engine.memory.lifetimes import Liveness
from unroll.engine.memory.liveness import forward_runs
from unroll.engine.memory.policy import Chain, FewestRecomputed, Plan, Policy
from unroll.engine.memory.segments import allowed_cuts, crossing_bytes, recomputable
from unroll.engine.memory.walk import step_roots
from unroll.engine.memory.weight_gradients import gradient_chunks

__all__ = ["Plans", "within_budget"]


class Plans:
    """The plans a policy weighs, each made once: :attr:`full` without recomputation,
    :meth:`of` with segments; :attr:`smallest` the fewest bytes of any weighed. What may run
    again is found once, for all of them (``again``, a
    :class:`~unroll.engine.memory.segments.Recomputable`): an attempt is one liveness walk
    and one layout. Without either, :meth:`recomputed` gives a plan's cost in forward steps
    (``runs_of``: :func:`~unroll.engine.memory.liveness.forward_runs` of the net, where
    the plan is not one level) and :meth:`least` a lower bound on its bytes, from the
    net's :class:`~unroll.engine.memory.costs.PlanCosts` (``costs(kept=, aliases=)``, made
    once, on the first use). ``aliases(relived)`` gives what lives inside what where the
    runs may write the roots ``relived`` again (:func:`~unroll.engine.memory.aliases.
    relived_aliases` of the full plan's), found once, on the first plan made or bounded."""

    def __init__(self, make, lay_out, runs_of, chain: Chain, again, bytes_of, base,
                 full_layout, policy, aliases, costs):
        self._make, self._lay_out, self._runs_of, self._again = make, lay_out, runs_of, again
        self._aliases_of, self._aliases = aliases, None
        self._bytes_of, self._policy, self._steps = bytes_of, policy, chain.steps
        self._allowed = frozenset(chain.allowed)
        self._made: dict[tuple, Plan] = {}
        self._runs: dict[tuple, object] = {}
        self._bounded: dict[tuple, object] = {}
        self.full = Plan(bytes_of(base, full_layout), 0, base, full_layout)
        self._costs_of, self._costs, self._kept = costs, None, self.full.bytes - full_layout.total

    @property
    def smallest(self) -> int:
        """The fewest bytes of any plan made or bounded (:meth:`least`): those bounded are
        made for it, so that a refused budget names the smallest plan the policy weighed."""
        for cuts, order, slots in list(self._bounded.values()):
            self.of(cuts, order, slots)
        return min([self.full.bytes, *(plan.bytes for plan in self._made.values())])

    @property
    def costs(self):
        """The net's :class:`~unroll.engine.memory.costs.PlanCosts`, made on the first use."""
        if self._costs is None:
            self._costs = self._costs_of(kept=self._kept, aliases=self.aliases)
        return self._costs

    @property
    def aliases(self):
        """What lives inside what in every plan made (``aliases(relived)``), found on the
        first use: it reads the roots and the kept blobs, the same in every liveness."""
        if self._aliases is None:
            self._aliases = self._aliases_of(self.full.liveness, again=self._again.relived)
        return self._aliases

    def recomputed(self, cuts, order=(), slots=None) -> int:
        """The forward steps backward runs again in the plan :meth:`of` would make."""
        cuts, order = self._checked(cuts), tuple(order)
        if not order:  # one level: counted, without a walk
            return self.costs.recomputed(cuts)
        return self._recompute(cuts, order, slots).recomputed

    def least(self, cuts, order=(), slots=None) -> int:
        """A lower bound on the bytes of the plan :meth:`of` would make, found without
        making it (:meth:`~unroll.engine.memory.costs.PlanCosts.least_bytes`): a plan whose
        bound is over a budget need not be laid out to know it does not fit."""
        cuts, order = self._checked(cuts), tuple(order)
        self._bounded.setdefault((cuts, order), (cuts, order, slots))
        return self.costs.least_bytes(cuts, one_level=not order)

    def checkpoint_bytes(self, cuts) -> float:
        """About the bytes a checkpoint at each of ``cuts`` holds
        (:meth:`~unroll.engine.memory.costs.PlanCosts.checkpoint_bytes`): what a slot of
        BPTT-HSM over those segments adds to a plan's bytes."""
        return self.costs.checkpoint_bytes(self._checked(cuts))

    def _checked(self, cuts) -> tuple:
        cuts = tuple(cuts)
        bad = [p for p in cuts if p not in self._allowed]
        if bad or list(cuts) != sorted(set(cuts)):
            raise ValueError(f"recompute policy {self._policy!r} cuts at steps "
                             f"{list(cuts)[:8]}: expected ascending steps a segment may "
                             f"start at (Chain.allowed), found {bad[:8] or 'an unsorted list'}")
        return cuts

    def _recompute(self, cuts: tuple, order: tuple, slots):
        key = (cuts, order)
        if key not in self._runs:
            self._runs[key] = self._runs_of(self._again.plan(self._steps, self._checked(cuts),
                                                             order, slots))
        return self._runs[key]

    def of(self, cuts, order=(), slots=None) -> Plan:
        """The plan of segments starting at ``cuts`` (ascending steps of
        :attr:`Chain.allowed`); backward runs ``order``'s actions
        (:class:`~unroll.engine.memory.segments.Recompute`; empty: one level), BPTT-HSM's
        in ``slots`` slots."""
        cuts, order = tuple(cuts), tuple(order)
        key = (cuts, order)
        if key not in self._made:
            liveness = self._make(self._recompute(cuts, order, slots))
            layout = self._lay_out(liveness, aliases=self.aliases)
            self._made[key] = Plan(self._bytes_of(liveness, layout),
                                   liveness.recompute.recomputed, liveness, layout)
        return self._made[key]


def chain_of(steps, layers, shapes, itemsize: int, base: Liveness) -> tuple[Chain, list]:
    """The net's :class:`Chain` for ``shapes`` and its weight-gradient chunks."""
    chunks = gradient_chunks(steps, layers, base.layer_need, shapes)
    # a param with one chunk (T <= GRADIENT_CHUNK) may be cut inside it: its rows are then
    # kept, as without chunks; segments of a longer chain start between chunks, where the
    # fewest bytes cross
    keys = [layers[c[0]].memory.batched_param_gradient.key(layers[c[0]]) for c in chunks]
    count = Counter(keys)
    between = [c for c, key in zip(chunks, keys) if count[key] > 1]
    allowed = allowed_cuts(steps, layers, base.data_root, between)
    nbytes = np.array([math.prod(shape) for shape in shapes], np.int64) * itemsize
    # per step, its planned tops' bytes: summed over arrays (a chain has T steps)
    counts = [len(step.tops) for step in steps]
    tops = np.fromiter(itertools.chain.from_iterable(step.tops for step in steps), np.int64,
                       sum(counts))
    planned = np.asarray(base.data_root, np.int64) == np.arange(len(shapes))
    planned[np.fromiter(base.private, np.int64, len(base.private))] = False
    sizes = np.zeros(len(steps), np.int64)
    np.add.at(sizes, np.repeat(np.arange(len(steps)), counts), np.where(planned[tops],
                                                                        nbytes[tops], 0))
    crossing = (crossing_bytes(steps, base.data_root, base.private, nbytes)
                if between else None)
    units = hsm_units(between, allowed, crossing) if between else ()
    return Chain(len(steps), tuple(allowed), units, tuple(sizes.tolist()),
                 tuple(crossing) if crossing is not None else None), chunks


def within_budget(base: Liveness, make, lay_out, steps, layers, bottom_need, shapes,
                  itemsize: int, budget=None, policy: Policy | None = None, name: str = "",
                  rewritten=()) -> tuple[Liveness, Layout]:
    """The liveness and layout that ``policy`` chooses (None: :class:`FewestRecomputed`)
    within ``budget`` bytes (:func:`~unroll.engine.memory.layout.planned_bytes`; None: no
    budget, and without a policy the full plan).

    ``base`` is the net's :class:`Liveness` without recomputation (made once per net: it
    depends on the graph alone), ``make(recompute, base=base)`` its liveness for a
    :class:`~unroll.engine.memory.segments.Recompute` plan, ``lay_out(liveness,
    aliases=)`` a layout for the current shapes (``rewritten``: the blobs written in
    place). A budget the chosen plan does not fit is a
    :class:`~unroll.core.errors.MemoryBudgetError` giving the smallest plan made.
    """
    # what lives inside what does not depend on the cuts: found once per net and shapes
    aliases = aliases_of(steps, layers, base, shapes, rewritten, bottom_need)
    full = lay_out(base, aliases=aliases)
    if budget is None and policy is None:
        return base, full
    inputs = input_roots(steps, layers, base.data_root)
    chain, chunks = chain_of(steps, layers, shapes, itemsize, base)
    policy = FewestRecomputed() if policy is None else policy
    runs_of = functools.partial(forward_runs, steps, layers, base.data_root, base.layer_need,
                                bottom_need)
    again = recomputable(steps, layers, base.data_root, base.private, chunks, base.reads,
                         step_roots(steps, layers, base.data_root, base.reads, base.layer_need))
    plans = Plans(functools.partial(make, base=base), lay_out, runs_of, chain, again,
                  lambda plan, layout_: planned_bytes(plan, layout_, shapes, itemsize, inputs),
                  base, full, policy,
                  functools.partial(relived_aliases, aliases, steps, layers, shapes=shapes,
                                    rewritten=rewritten),
                  functools.partial(plan_costs, steps, layers, base.data_root, base.private,
                                    base.layer_need, again, shapes, itemsize))
    got = policy.choose(chain, plans, budget) or plans.full
    if budget is not None and got.bytes > budget:
        smallest = plans.smallest
        raise MemoryBudgetError(
            f"net '{name}': memory_budget {budget:,} bytes is too small: the smallest plan "
            f"found needs {smallest:,} bytes (activations, diffs, scratch and kept "
            f"blobs; params and inputs not counted)", smallest)
    return got.liveness, got.layout
