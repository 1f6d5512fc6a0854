"""Concurrent regions: where a net's branches may run at once, and what that does to
lifetimes (docs/design.md, 6. Memory): within a region every buffer lives through all of
it, since the branches' order is not known in advance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unroll.graph import Step

__all__ = ["Region", "concurrent_regions", "widened"]


@dataclass
class Region:
    """Steps ``start..stop-1`` of the run order, split into independent branches.

    ``first`` lists the region's steps that depend on no branch (run before
    them, in run order); ``branches`` the others, one list per branch in run
    order. No branch reads what another writes, and none shares a param or
    draws random numbers, so they may run at once.
    """

    start: int
    stop: int
    first: list[int]
    branches: list[list[int]]


def concurrent_regions(steps: list[Step], layers, min_steps: int = 8) -> list[Region]:
    """Where a Split fans a value out to chains that meet again only later (the two
    directions of a bidirectional layer), the steps between the Split and their meeting.

    A Split is a candidate when each of its readers reads nothing else made
    after it (a reader that also reads later values is where branches meet,
    not a branch). Labels then flow from its tops through the steps after it;
    the first step reached by two labels ends the region. A region is kept if
    it has two or more branches of ``min_steps`` steps or more, their layers
    share no param, and none draws random numbers.
    """
    producer: dict[int, int] = {}  # blob -> its latest writer so far
    readers: dict[int, list[int]] = {}
    made_by: list[list[int]] = []  # step -> the steps that wrote its bottoms
    for s, step in enumerate(steps):
        made_by.append([producer[b] for b in step.bottoms if b in producer])
        for b in step.bottoms:
            readers.setdefault(b, []).append(s)
        for t in step.tops:
            producer[t] = s
    regions: list[Region] = []
    s = 0
    while s < len(steps):
        region = _region_from(s, steps, layers, made_by, readers, min_steps)
        if region is None:
            s += 1
        else:
            regions.append(region)
            s = region.stop
    return regions


def _region_from(p: int, steps, layers, made_by, readers, min_steps) -> Region | None:
    if layers[p].type != "Split" or len(steps[p].tops) < 2:
        return None
    heads = [readers.get(t, [None])[0] for t in steps[p].tops]
    if any(h is None or any(w > p for w in made_by[h] if w != p) for h in heads):
        return None
    label: dict[int, int] = {}  # step -> its branch
    for k, h in enumerate(heads):
        if h in label:
            return None  # one reader takes two tops: no branches here
        label[h] = k
    first, stop = [], len(steps)
    for s in range(p + 1, len(steps)):
        found = {label[w] for w in made_by[s] if w in label}
        if s in label:
            found.add(label[s])
        if len(found) > 1:
            stop = s
            break
        if found:
            label[s] = found.pop()
        else:
            first.append(s)
    branches: list[list[int]] = [[] for _ in heads]
    for s in range(p + 1, stop):
        if s in label:
            branches[label[s]].append(s)
    branches = [b for b in branches if b]
    if len(branches) < 2 or min(len(b) for b in branches) < min_steps:
        return None
    params = [{id(blob) for s in b for blob in layers[s].blobs} for b in branches]
    if sum(len(p) for p in params) != len(set().union(*params)):
        return None
    if any(layers[s].draws_random for b in branches for s in b):
        return None
    return Region(p + 1, stop, first, branches)


def widened(span, windows) -> tuple[int, int]:
    """``span`` stretched over every window (of a concurrent region) it meets."""
    first, last = span
    for a, b in windows:
        if first <= b and last >= a:
            first, last = min(first, a), max(last, b)
    return first, last
