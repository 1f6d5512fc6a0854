"""The recompute policy: of the plans a memory budget allows, the one to run (docs/design.md,
6. Memory): Chen et al.'s one level of segments, or BPTT-HSM over the chunks of a chain.
"""

from __future__ import annotations

import math
from collections import Counter

from unroll.core.errors import MemoryBudgetError
from unroll.engine.memory.hsm import bptt_hsm, hsm_order, hsm_units
from unroll.engine.memory.layout import Layout, input_roots, planned_bytes
from unroll.engine.memory.lifetimes import Liveness
from unroll.engine.memory.segments import allowed_cuts, crossing_bytes, greedy_cuts, recompute_plan
from unroll.engine.memory.weight_gradients import gradient_chunks

__all__ = ["HSM_MOST_FORWARDS", "within_budget"]


def within_budget(make, lay_out, steps, layers, shapes, itemsize: int, budget=None,
                  mode=None, name: str = "") -> tuple[Liveness, Layout]:
    """The liveness and layout of a net that fit ``budget`` bytes (:func:`planned_bytes`)
    with the fewest forward steps recomputed, or, for ``mode="sqrt"``, Chen et al.'s
    segments of about a square root of the steps each (where those need less memory than
    no recomputation).

    ``make(recompute)`` gives the net's :class:`Liveness` for a :class:`Recompute`
    plan (None: none), ``lay_out(liveness)`` its layout for the current shapes.
    Segments are Chen's greedy ones (:func:`greedy_cuts`), of every halving of
    the steps' bytes down to a step each and of a square root of the steps:
    of those that fit, the one that runs fewest steps again. Where none fits
    and the net is a chain of three weight-gradient chunks or more, Gruslys
    et al.'s BPTT-HSM over its chunks (:func:`hsm_order`, a segment a chunk):
    of the slot counts whose policy runs every step forward at most
    :data:`HSM_MOST_FORWARDS` times, the most that fit. One level with a
    segment a chunk runs each step at most twice, no more than BPTT-HSM with
    a slot for every chunk, so BPTT-HSM serves the budgets one level cannot
    reach. ``mode="hsm"`` takes BPTT-HSM in any case (without a budget: its
    fewest slots, the least memory, where that is less than without
    recomputation). A budget none fits is a
    :class:`~unroll.core.errors.MemoryBudgetError` giving the smallest plan
    found.
    """
    base = make(None)
    full = lay_out(base)
    if budget is None and mode is None:
        return base, full
    inputs = input_roots(steps, layers, base.data_root)
    chunks = gradient_chunks(steps, layers, base.layer_need, shapes)
    # a param with one chunk (T <= GRADIENT_CHUNK) may be cut inside it: its rows are then
    # kept, as without chunks; segments of a longer chain start between chunks, where the
    # fewest bytes cross
    count = Counter(layers[c[0]].param_batch_key() for c in chunks)
    between = [c for c in chunks if count[layers[c[0]].param_batch_key()] > 1]
    allowed = allowed_cuts(steps, layers, base.data_root, between)
    sizes = [sum(math.prod(shapes[b]) * itemsize for b in step.tops
                 if base.data_root[b] == b and b not in base.private) for step in steps]
    total = max(sum(sizes), 1)
    crossing = (crossing_bytes(steps, base.data_root, base.private,
                               [math.prod(shape) * itemsize for shape in shapes])
                if between else None)

    planned: dict[tuple, tuple] = {}

    def attempt_order(cuts, order=(), slots=None):
        # segments of a few steps all end at the same cuts (between weight-gradient
        # chunks): each plan is made once
        if (cuts, order) not in planned:
            plan = make(recompute_plan(steps, layers, base.data_root, cuts, chunks, order,
                                       slots))
            layout_ = lay_out(plan)
            planned[(cuts, order)] = (planned_bytes(plan, layout_, shapes, itemsize, inputs),
                                      plan, layout_)
        return planned[(cuts, order)]

    def attempt(segment_bytes):
        return attempt_order(tuple(greedy_cuts(sizes, allowed, segment_bytes, crossing)))

    def error(smallest):
        return MemoryBudgetError(
            f"net '{name}': memory_budget {budget:,} bytes is too small: the smallest plan "
            f"found needs {smallest:,} bytes (activations, diffs, scratch and kept blobs; "
            f"params and inputs not counted)", smallest)

    need = planned_bytes(base, full, shapes, itemsize, inputs)
    units = hsm_units(between, allowed, crossing) if between else ()
    if mode == "hsm" and len(units) >= 2 and (budget is None or need > budget):
        best, least = _within_budget_hsm(attempt_order, units, budget)
        if best is None:
            raise error(least)
        if budget is None and least >= need:  # never more memory, for nothing
            return base, full
        return best[1], best[2]
    if mode == "sqrt":  # never more memory than without recomputation, for nothing
        n, plan, layout_ = attempt(total / max(1.0, len(steps) ** 0.5))
        return (plan, layout_) if n < need else (base, full)
    if budget is None or need <= budget:
        return base, full
    # every halving of the segments' bytes down to a step each, and Chen's square root:
    # memory falls then rises, and the steps run again do not follow the size
    step = min((n for n in sizes if n), default=total) / 2  # segments of a step, at least
    tries = [total / 2**k for k in range(1, 64) if total / 2**k >= step]
    tries.append(total / max(1.0, len(steps) ** 0.5))
    smallest, best = need, None
    for segment in tries:
        n, plan, layout_ = attempt(segment)
        smallest = min(smallest, n)
        if n <= budget and (best is None or (plan.recompute.recomputed, n) < best[0]):
            best = ((plan.recompute.recomputed, n), plan, layout_)
    if best is None and len(units) >= 2:
        best, least = _within_budget_hsm(attempt_order, units, budget)
        smallest = min(smallest, least)
    if best is None:
        raise error(smallest)
    return best[1], best[2]


#: a multi-level plan runs each step forward at most this many times (BPTT-HSM's fewest
#: slots tried): fewer slots save little more memory, for ever more recomputation
HSM_MOST_FORWARDS = 6


def _within_budget_hsm(attempt, units, budget) -> tuple[tuple | None, int]:
    """BPTT-HSM's plan over the segments starting at ``units`` with the most slots that
    fits ``budget`` (``(key, liveness, layout)``, None if none; without a budget, the
    fewest slots) and the smallest plan it found; ``attempt(cuts, order)`` plans one."""
    n = len(units) + 1
    fewest = 2
    while fewest < n and bptt_hsm(n, fewest) > HSM_MOST_FORWARDS * n:
        fewest += 1

    def fit(m):
        got, plan, layout_ = attempt(units, hsm_order(n, m), m)
        return (plan.recompute.recomputed, got), plan, layout_

    least = fit(fewest)
    if budget is None or least[0][1] > budget:
        return (least if budget is None else None), least[0][1]
    lo, hi = fewest, n + 1  # the planned bytes grow with the slots: the most that fit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fit(mid)[0][1] <= budget else (lo, mid)
    return fit(lo), least[0][1]
