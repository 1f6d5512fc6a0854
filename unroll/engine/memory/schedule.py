"""One schedule for every run (docs/design.md, 6. Memory): the forward pass, backward,
the forward runs backward makes again, the weight-gradient GEMMs and the zeroing of diffs,
all actions in one list, as tinygrad runs one linear schedule.

A :class:`Schedule` names what runs, by number; :mod:`unroll.engine.executor` binds it to
the net's layers and memory and runs it in one loop. The policy's plan decides its shape:
without recomputation, every step forward then every backward; with a
:class:`~unroll.engine.memory.segments.Recompute` plan, backward is that plan's actions
(one level, BPTT-HSM's, or a user's :class:`~unroll.engine.memory.policy.Checkpoints`);
with concurrent regions, a region's branches are one action.

>>> s = schedule(3, (2, 0), {2: [7]}, gemm_after=(0,))
>>> [(a.kind, a.at) for a in s.actions[s.backward:]]
[('zero', 7), ('backward', 2), ('backward', 0), ('gemm', 0)]
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from unroll.engine.memory.regions import Region
    from unroll.engine.memory.segments import Recompute

__all__ = ["Action", "Schedule", "schedule"]


class Action(NamedTuple):
    """One action of a :class:`Schedule`. ``kind``: ``"forward"`` or ``"backward"`` (of
    step ``at``), ``"zero"`` (diff root ``at``), ``"gemm"`` (weight-gradient group ``at``
    of the layout), ``"relive"`` (bind the lives of forward run ``at`` of the
    :class:`~unroll.engine.memory.segments.Recompute` plan), ``"restore"`` (bind the
    forward pass's lives), or ``"region"``: ``parts`` are its actions before, per branch
    (at once where cores are free) and after."""

    kind: str
    at: int = -1
    parts: tuple = ()


@dataclass(frozen=True)
class Schedule:
    """Every run's actions in order: the forward pass's, then from ``backward`` on,
    backward's."""

    actions: tuple
    backward: int


def schedule(n_steps: int, backward_steps, zero_before, recompute: Recompute | None = None,
             gemm_after=(), regions: list[Region] = ()) -> Schedule:
    """The schedule of a run order of ``n_steps`` steps. ``backward_steps``: the steps that
    run backward, last first; ``zero_before[s]``: diff roots zeroed right before step s's
    backward; ``gemm_after[g]``: the step after whose backward weight-gradient group g runs
    (none where the layout is not bound); ``recompute``: the plan of backward's forward
    runs (not with ``regions``)."""
    gemms: dict[int, list[int]] = {}
    for g, s in enumerate(gemm_after):
        gemms.setdefault(s, []).append(g)
    # a step's actions are made once, however many runs run it: a long chain's schedule
    # is a list of them, made in a fraction of the time (tuple.__new__: Action's own
    # __new__ is Python code, a third of the time of a chain's schedule)
    make = tuple.__new__
    forward_of = [make(Action, ("forward", s, ())) for s in range(n_steps)]
    backward_of = {}
    for s in backward_steps:
        own = make(Action, ("backward", s, ()))
        zeros, after = zero_before.get(s), gemms.get(s)
        backward_of[s] = (own,) if zeros is None and after is None else (
            *(Action("zero", r) for r in zeros or ()), own,
            *(Action("gemm", g) for g in after or ()))

    def back(steps) -> list[Action]:
        return [a for s in steps for a in backward_of[s]]

    def ahead(steps) -> list[Action]:
        return [forward_of[s] for s in steps]

    if recompute is not None:
        forward, backward = [Action("restore"), *ahead(range(n_steps))], []
        bounds = [0, *recompute.cuts, n_steps]
        segments: list[list[int]] = [[] for _ in bounds[1:]]
        for s in backward_steps:  # in backward's order within each segment
            segments[bisect.bisect_right(bounds, s) - 1].append(s)
        for i, a in enumerate(recompute.order):
            backward += ([Action("relive", i), *ahead(recompute.runs[i])] if a >= 0
                         else back(segments[~a]))
    else:
        forward, pieces, s = [], [], 0
        runs_back = set(backward_steps)
        for region in regions:
            forward += ahead(range(s, region.start))
            forward.append(Action("region", parts=(
                tuple(ahead(region.first)), tuple(tuple(ahead(b)) for b in region.branches),
                ())))
            pieces.append(back(t for t in range(region.start - 1, s - 1, -1) if t in runs_back))
            pieces.append([Action("region", parts=(
                (), tuple(tuple(back(t for t in reversed(b) if t in runs_back))
                          for b in region.branches),
                tuple(back(t for t in reversed(region.first) if t in runs_back))))])
            s = region.stop
        forward += ahead(range(s, n_steps))
        pieces.append(back(t for t in range(n_steps - 1, s - 1, -1) if t in runs_back))
        backward = [a for piece in reversed(pieces) for a in piece]
    return Schedule(tuple(forward + backward), len(forward))
