"""Recompute policies: which checkpoints backward keeps, apart from how it recomputes
(docs/design.md, 6. Memory), as JAX's ``checkpoint(policy=)`` keeps what to save apart
from the mechanism.

A policy sees a net's :class:`Chain` (where segments may start, the bytes of each step)
and weighs :class:`Plan` s that :class:`~unroll.engine.memory.budget.Plans` makes for it
(``plans.of(cuts)``: liveness and layout of segments starting at ``cuts``); its
:meth:`Policy.choose` returns the one to run, or None for the full plan. Built in, by
the names ``Net(recompute=...)`` takes: ``"none"`` (:class:`NoRecompute`), ``"sqrt"``
(:class:`ChenSegments`), ``"hsm"`` (:class:`BPTTHSM`); without a name, a memory budget
takes :class:`FewestRecomputed`. A policy of the user's own is a :class:`Checkpoints`
predicate, or a subclass of :class:`Policy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from unroll.engine.memory.hsm import bptt_hsm, hsm_order
from unroll.engine.memory.segments import greedy_cuts

if TYPE_CHECKING:
    from collections.abc import Callable

    from unroll.engine.memory.budget import Plans
    from unroll.engine.memory.layout import Layout
    from unroll.engine.memory.lifetimes import Liveness

__all__ = ["BPTTHSM", "HSM_MOST_FORWARDS", "Chain", "ChenSegments", "Checkpoints",
           "FewestRecomputed", "NoRecompute", "Plan", "Policy", "policy_named"]

#: a multi-level plan runs each step forward at most this many times (BPTT-HSM's fewest
#: slots tried): fewer slots save little more memory, for ever more recomputation
HSM_MOST_FORWARDS = 6


class Plan(NamedTuple):
    """One plan a policy weighs: its planned bytes
    (:func:`~unroll.engine.memory.layout.planned_bytes`), the forward steps backward runs
    again, and its liveness and layout."""

    bytes: int
    recomputed: int
    liveness: Liveness
    layout: Layout


@dataclass(frozen=True)
class Chain:
    """What a policy sees of a net, for its current shapes: ``steps`` in run order,
    ``allowed`` the steps a segment may start at
    (:func:`~unroll.engine.memory.segments.allowed_cuts`), ``units`` the cuts between
    weight-gradient chunks, one each where the fewest bytes cross
    (:func:`~unroll.engine.memory.hsm.hsm_units`; empty in a net of fewer than two
    chunks), ``sizes`` the bytes each step's planned tops take and ``crossing`` the bytes
    a cut at each step leaves to checkpoints (None: no chunks)."""

    steps: int
    allowed: tuple
    units: tuple
    sizes: tuple
    crossing: tuple | None

    @property
    def places(self) -> tuple:
        """Where a checkpoint may go, in run order: between weight-gradient chunks in a chain
        of two chunks or more (the k-th place starts chunk k), else every allowed cut."""
        return self.units or self.allowed

    @property
    def total(self) -> int:
        """The bytes of every step's planned tops (at least 1)."""
        return max(sum(self.sizes), 1)


class Policy:
    """A recompute policy: of the plans a net may run in backward, the one it runs.

    A subclass defines :meth:`choose`. ``plans.of(cuts)`` plans segments starting at
    ``cuts`` (ascending, of ``chain.allowed``), each run forward again once right before
    its backward; ``plans.recomputed(cuts)`` gives only its forward steps run again,
    ``plans.least(cuts)`` a lower bound on its bytes and ``plans.checkpoint_bytes(cuts)``
    about what a checkpoint at each cut holds, each at a fraction of the cost;
    ``plans.full`` is the plan without recomputation. Every plan
    gives the results of the full plan bit for bit: a policy decides memory and time only.
    """

    #: the name ``Net(recompute=...)`` takes for it (None: not a built-in)
    name: str | None = None

    def choose(self, chain: Chain, plans: Plans, budget: int | None) -> Plan | None:
        """The plan to run within ``budget`` bytes (None: no budget), or None for the full
        plan; a plan over the budget is refused, giving the smallest plan made."""
        raise NotImplementedError(f"{type(self).__name__} must define choose()")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NoRecompute(Policy):
    """``"none"``: never recompute; a budget the full plan does not fit is refused."""

    name = "none"

    def choose(self, chain, plans, budget):
        return None


class ChenSegments(Policy):
    """``"sqrt"``: Chen et al.'s greedy segments, of about a square root of the steps'
    bytes each, where those need less memory than no recomputation."""

    name = "sqrt"

    def choose(self, chain, plans, budget):
        got = plans.of(segments_of(chain, chain.total / max(1.0, chain.steps ** 0.5)))
        return got if got.bytes < plans.full.bytes else None


class FewestRecomputed(Policy):
    """A memory budget's plan by default: no recomputation where the full plan fits, else
    of Chen's greedy segments of every halving of the steps' bytes down to a step each and
    of a square root of them, the one that fits running the fewest steps again; where none
    fits and the net is a chain of three weight-gradient chunks or more, BPTT-HSM's
    (:class:`BPTTHSM`). One level with a segment a chunk runs each step at most twice, no
    more than BPTT-HSM with a slot for every chunk, so BPTT-HSM serves the budgets one level
    cannot reach."""

    @staticmethod
    def candidates(chain: Chain) -> list[tuple]:
        """The cuts of the one-level plans it weighs: Chen's greedy segments of every
        halving of the steps' bytes down to a step each, then of a square root of them."""
        step = min((n for n in chain.sizes if n), default=chain.total) / 2  # a step, at least
        # memory falls then rises, and the steps run again do not follow the size
        tries = [chain.total / 2**k for k in range(1, 64) if chain.total / 2**k >= step]
        tries.append(chain.total / max(1.0, chain.steps ** 0.5))
        return list(dict.fromkeys(segments_of(chain, segment) for segment in tries))

    def choose(self, chain, plans, budget):
        if budget is None or plans.full.bytes <= budget:
            return None
        # the fewest steps run again first: a plan's memory is laid out only while no plan
        # that fits has run fewer, and only where its bound may fit (the choice is the one
        # of laying out every plan)
        best = None
        for c in sorted(self.candidates(chain), key=plans.recomputed):
            if best is not None and plans.recomputed(c) > best.recomputed:
                break
            if plans.least(c) > budget:  # it cannot fit: never laid out
                continue
            got = plans.of(c)
            if got.bytes <= budget and (best is None or got.bytes < best.bytes):
                best = got
        if best is None and len(chain.units) >= 2:
            best = hsm_within(chain, plans, budget)
        return best


class BPTTHSM(Policy):
    """``"hsm"``: Gruslys et al.'s BPTT-HSM over the chunks of a chain (a segment a chunk):
    of the slot counts whose policy runs every step forward at most
    :data:`HSM_MOST_FORWARDS` times, the most that fit the budget; without one, the fewest
    (the least memory), where that is less than without recomputation. Where the full plan
    fits, or the chain has fewer than three chunks, as :class:`FewestRecomputed`."""

    name = "hsm"

    def choose(self, chain, plans, budget):
        if len(chain.units) < 2 or (budget is not None and plans.full.bytes <= budget):
            return FewestRecomputed().choose(chain, plans, budget)
        got = hsm_within(chain, plans, budget)
        if budget is None and got.bytes >= plans.full.bytes:  # never more memory, for nothing
            return None
        return got


class Checkpoints(Policy):
    """The user's policy as a predicate: ``keep(k, n)`` says whether backward keeps a
    checkpoint at the k-th of the ``n`` places one may go (:attr:`Chain.places`, k from 1:
    in a chain of weight-gradient chunks, where chunk k starts); the segments between the
    checkpoints each run forward again once, right before their backward.

    Keeping every second chunk of a chain of four (128 steps):

    >>> from unroll import Net, expand, to_prototxt
    >>> from unroll.engine.memory import Checkpoints
    >>> text = "force_backward: true\\n" + to_prototxt(expand(
    ...     "rnn", steps=128, batch=1, input_dim=2, hidden=2))
    >>> net = Net(text, recompute=Checkpoints(lambda k, n: k % 2 == 0))
    >>> plan = net.memory.liveness.recompute  # one checkpoint, where chunk 2 starts
    >>> len(plan.cuts), plan.policy
    (1, 'one level')
    """

    def __init__(self, keep: Callable[[int, int], bool]):
        self.keep = keep

    def choose(self, chain, plans, budget):
        places = chain.places
        cuts = tuple(p for k, p in enumerate(places, 1) if self.keep(k, len(places)))
        return plans.of(cuts) if cuts else None

    def __repr__(self) -> str:
        return f"Checkpoints({self.keep!r})"


def segments_of(chain: Chain, segment_bytes: float) -> tuple:
    """Chen's greedy cuts over ``chain`` (:func:`~unroll.engine.memory.segments.greedy_cuts`)
    of segments of about ``segment_bytes``."""
    return tuple(greedy_cuts(chain.sizes, chain.allowed, segment_bytes, chain.crossing))


def hsm_within(chain: Chain, plans: Plans, budget: int | None) -> Plan | None:
    """BPTT-HSM's plan over ``chain.units`` with the most slots that fits ``budget`` (None
    if none; without a budget, the fewest slots)."""
    units = chain.units
    n = len(units) + 1
    fewest = 2
    while fewest < n and bptt_hsm(n, fewest) > HSM_MOST_FORWARDS * n:
        fewest += 1

    def fit(m):
        return plans.of(units, hsm_order(n, m), m)

    if budget is None:
        return fit(fewest)
    # every slot count has the same bound: laid out only where it may fit
    least = plans.least(units, hsm_order(n, fewest), fewest)
    if least > budget:
        return None
    # the planned bytes grow with the slots, nearly in a line, a checkpoint a slot: the
    # most that fit, between the slot counts laid out (``lo`` fits, ``hi`` does not; the
    # fewest fits where any does), at the count where their line meets the budget. The
    # first is where the bound rising by a checkpoint a slot meets it (the bound is low:
    # over the count that fits, most often by a few slots), and from one count laid out
    # the line rises by a checkpoint a slot; halving where one side moved twice running
    # (as the Illinois method keeps regula falsi from creeping)
    slot = max(plans.checkpoint_bytes(units), 1.0)
    laid: dict[int, int] = {}
    lo, hi, moved = fewest, n + 1, []
    while hi - lo > 1:
        if moved[-2:] in ([True, True], [False, False]):
            guess = (lo + hi) // 2
        elif lo in laid and hi in laid:
            slot = (laid[hi] - laid[lo]) / (hi - lo)
            guess = lo + int((budget - laid[lo]) // slot)
        elif hi in laid:
            guess = hi - math.ceil((laid[hi] - budget) / slot)
        elif lo in laid:
            guess = lo + int((budget - laid[lo]) // slot)
        else:
            guess = fewest + int((budget - least) // slot)
        guess = min(max(guess, lo + 1), hi - 1)
        laid[guess] = fit(guess).bytes
        moved.append(laid[guess] <= budget)
        lo, hi = (guess, hi) if moved[-1] else (lo, guess)
    if lo not in laid and fit(lo).bytes > budget:
        return None
    return fit(lo)


BUILT_IN = {policy.name: policy for policy in (NoRecompute(), ChenSegments(), BPTTHSM())}


def policy_named(recompute) -> Policy | None:
    """The policy ``Net(recompute=...)`` names: None (a budget's default,
    :class:`FewestRecomputed`), a built-in's name, or a :class:`Policy`."""
    if recompute is None or isinstance(recompute, Policy):
        return recompute
    if isinstance(recompute, str) and recompute in BUILT_IN:
        return BUILT_IN[recompute]
    raise ValueError(f"recompute must be None, one of {sorted(BUILT_IN)} or a "
                     f"unroll.engine.memory.Policy, found {recompute!r}")
