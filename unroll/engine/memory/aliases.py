"""Aliases: buffers that live inside others, so that a layer moves no memory (docs/design.md,
6. Memory): the parts of a Concat or Slice inside their whole and a diff passed through
unchanged as its bottoms' diff too (Eltwise SUM). :func:`aliases_of` resolves them once per
net and shapes into one immutable :class:`Aliases` (``buffer -> (host buffer, element
offset)``), which every plan a budget weighs reads; :meth:`Aliases.resolved` adds a plan's
buffers of values run again. :func:`resolve` follows the chain.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from unroll.engine.memory.lifetimes import Liveness
    from unroll.graph import Step

__all__ = ["Aliases", "aliases_of", "relived_aliases", "resolve"]


@dataclass(frozen=True)
class Aliases:
    """What lives inside what, for one net and set of shapes, whatever the cuts.

    ``data`` and ``diff`` map a root to ``(host root, element offset)``;
    ``parts`` gives each Concat or Slice step its (data in whole, diff in
    whole) flags per part, ``passed`` each pass-through step its per-bottom
    flags (the layer writes no diff for those). ``again`` lists the parts
    ``(step, part, root, whole root, element offset)`` whose data a plan's
    forward runs write again: hosted buffer by buffer (:meth:`resolved`).
    ``writes`` are the diffs backward's steps write, where they land: arrays of
    the host (ascending), first and end element there, and the writing step
    (what changes with the cuts is only when that step runs).
    """

    data: Mapping
    diff: Mapping
    parts: Mapping
    passed: Mapping
    again: tuple
    writes: tuple

    def resolved(self, plan: Liveness) -> tuple[dict, dict, dict]:
        """``(data_host, diff_host, parts)`` for ``plan``: data buffer / diff root ->
        (host, element offset), new dicts the weight-gradient rows may join; the parts of
        a whole run again inside its buffers, where the same runs write both.

        Where nothing runs again they are the net's own, in new dicts (a part, root 1,
        inside root 3 at element 6; ``plan`` is then not read):

        >>> found = Aliases({1: (3, 6)}, {1: (3, 6)}, {4: ((True,), (True,))}, {}, (), ())
        >>> data_host, diff_host, parts = found.resolved(plan=None)
        >>> data_host, data_host is found.data, parts
        ({1: (3, 6)}, False, {4: ((True,), (True,))})
        """
        data_host, parts = dict(self.data), dict(self.parts)
        if not self.again or plan.first_buffer is None:
            return data_host, dict(self.diff), parts
        # a part and its whole are paired buffer by buffer where the same runs write both;
        # lists, not the plan's arrays, in this loop: a T-step chain has a part a step
        n, first, written_by = len(plan.data_root), plan.first_buffer.tolist(), plan.written_by
        for s, k, r, w, offset in self.again:
            a, b = first[r], first[w]
            count = first[r + 1] - a
            if (count <= 0 or first[w + 1] - b != count
                    or written_by[a : a + count] != written_by[b : b + count]):
                continue
            if any(n + a + i in data_host for i in range(count)):
                continue
            for i in range(count):
                data_host[n + a + i] = (n + b + i, offset)
            data_flags, diff_flags = parts[s]
            parts[s] = (data_flags[:k] + (True,) + data_flags[k + 1:], diff_flags)
        return data_host, dict(self.diff), parts


def aliases_of(steps: list[Step], layers, plan: Liveness, shapes, rewritten, bottom_need,
               again: bytes = b"") -> Aliases:
    """The :class:`Aliases` of a net's run order for blob ``shapes``; ``again`` says per
    data root whether a plan's forward runs may write it again (none: the full plan).

    Two parts concatenated on axis 0 live inside the Concat's top, 6 elements apart:

    >>> from unroll import Net
    >>> net = Net('''
    ...   layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
    ...   layer { name: "a" type: "ReLU" bottom: "x" top: "a" }
    ...   layer { name: "b" type: "TanH" bottom: "x" top: "b" }
    ...   layer { name: "c" type: "Concat" bottom: "a" bottom: "b" top: "c"
    ...           concat_param { axis: 0 } }
    ...   layer { name: "d" type: "Sigmoid" bottom: "c" top: "d" }''', phase="test")
    >>> m = net.memory
    >>> found = aliases_of(m.graph.steps, m.layers, m.liveness, [b.shape for b in m.blobs],
    ...                    m.graph.rewritten, m.bottom_need)
    >>> [m.blobs[r].name for r in (1, 2, 3)], dict(found.data)
    (['a', 'b', 'c'], {1: (3, 0), 2: (3, 6)})
    """
    data_host, diff_host, parts, relived = _parts(steps, layers, plan, shapes, rewritten,
                                                  again)
    passed = _pass_through(steps, layers, plan, bottom_need, diff_host, rewritten)
    writes = _diff_writes(steps, layers, plan, bottom_need, shapes, diff_host, parts, passed)
    return Aliases(MappingProxyType(data_host), MappingProxyType(diff_host),
                   MappingProxyType(parts), MappingProxyType(passed), tuple(relived), writes)


def relived_aliases(full: Aliases, steps: list[Step], layers, plan: Liveness, shapes,
                    rewritten, again: bytes) -> Aliases:
    """The :class:`Aliases` :func:`aliases_of` finds with ``again``, from ``full``, the
    net's without it (the same roots and shapes): only the data of parts and wholes run
    again differs; the diffs, their pass-through and backward's writes never do, and are
    ``full``'s (a budget's attempts all read this one, found once per net).

    Without ``again`` it is ``full`` itself:

    >>> found = Aliases({1: (3, 6)}, {1: (3, 6)}, {4: ((True,), (True,))}, {}, (), ())
    >>> relived_aliases(found, [], [], None, [], (), b"") is found
    True
    """
    if not any(again):
        return full
    data_host, _, parts, relived = _parts(steps, layers, plan, shapes, rewritten, again)
    return Aliases(MappingProxyType(data_host), full.diff, MappingProxyType(parts),
                   full.passed, tuple(relived), full.writes)


def _diff_writes(steps: list[Step], layers, plan: Liveness, bottom_need, shapes, diff_host,
                 parts, passed) -> tuple:
    """The bottom diffs each backward step writes, as :attr:`Aliases.writes`: none for a
    view, a part inside its whole (a Slice writes its whole's unless every part is inside
    it) or a diff passed through."""
    skipped = {s: diff_flags if layers[s].memory.parts_of_whole == "bottoms"
               else (all(diff_flags),) for s, (_, diff_flags) in parts.items()}
    skipped.update(passed)
    blobs, writers = [], []
    for s, (step, layer) in enumerate(zip(steps, layers)):
        if not plan.layer_need[s] or "diff" in layer.memory.shares_bottom:
            continue
        flags, need = skipped.get(s, ()), bottom_need[s]
        for k, b in enumerate(step.bottoms):
            if need[k] and not (k < len(flags) and flags[k]):
                blobs.append(b)
                writers.append(s)
    blobs = np.array(blobs, np.int64)
    counts = np.array([math.prod(shapes[b]) for b in blobs.tolist()], np.int64)
    hosts, firsts = landing(diff_host, np.asarray(plan.diff_root, np.int64)[blobs])
    order = np.lexsort((firsts, hosts))
    return (hosts[order], firsts[order], firsts[order] + counts[order],
            np.array(writers, np.int64)[order])


def landing(host, roots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`resolve` over an array of ``roots``: the wholes they live in, and their
    element offsets there.

    >>> wholes, offsets = landing({1: (0, 4), 2: (1, 3)}, np.array([2, 0]))
    >>> wholes.tolist(), offsets.tolist()
    ([0, 0], [7, 0])
    """
    up = np.full(max(host, default=-1) + 1, -1, np.int64)
    within = np.zeros(len(up), np.int64)
    if host:
        inside = np.fromiter(host, np.int64, len(host))
        up[inside], within[inside] = zip(*host.values())
    wholes, firsts = roots.copy(), np.zeros(len(roots), np.int64)
    moving = np.arange(len(roots))
    while True:  # up the chain of wholes
        moving = moving[wholes[moving] < len(up)]
        moving = moving[up[wholes[moving]] >= 0]
        if not len(moving):
            return wholes, firsts
        firsts[moving] += within[wholes[moving]]
        wholes[moving] = up[wholes[moving]]


def _parts(steps: list[Step], layers, plan: Liveness, shapes, rewritten, again) -> tuple:
    """Concat bottoms and Slice tops placed inside their whole, so they move no memory.

    Along axis 0 (or any axis with only 1s before it) the parts of a Concat
    top or a Slice bottom are consecutive blocks of it: each part's root is
    then hosted at its element offset in the whole's root, data and diff
    alike, and the layer skips its copy. Not for memory written in place
    (``rewritten``: a write through the whole would change a part a backward
    still reads), nor for a part that keeps memory of its own (an input, say,
    which the user may reshape and fill between runs). A part or whole whose
    data backward's forward runs write again (``again``) is left to
    :meth:`Aliases.resolved`.

    Returns ``(data_host, diff_host, flags, again)``: root -> (host root, element
    offset), step -> (data in whole, diff in whole) per part, and the parts run again.
    """
    data_host: dict[int, tuple[int, int]] = {}
    diff_host: dict[int, tuple[int, int]] = {}
    flags: dict[int, tuple[tuple[bool, ...], tuple[bool, ...]]] = {}
    relived = []
    written = {plan.data_root[b] for b in rewritten}
    for s, (step, layer) in enumerate(zip(steps, layers)):
        kind = layer.memory.parts_of_whole
        if kind is None:
            continue
        whole, parts = (step.tops[0], step.bottoms) if kind == "bottoms" else (
            step.bottoms[0], step.tops)
        shape = shapes[whole]
        axis = getattr(layer, "axis", None)  # a parts layer's axis, None until set up
        data_flags, diff_flags = [False] * len(parts), [False] * len(parts)
        flags[s] = (data_flags, diff_flags)
        if axis is None or any(d != 1 for d in shape[:axis]):
            continue
        offset = 0
        for k, part in enumerate(parts):
            for roots, host, fl, lives in ((plan.data_root, data_host, data_flags, True),
                                           (plan.diff_root, diff_host, diff_flags, False)):
                r, w = roots[part], roots[whole]
                if (r == w or r in host or r in written or w in written
                        or r in plan.private):
                    continue
                if lives and again and (again[r] or again[w]):
                    relived.append((s, k, r, w, offset))
                    continue
                host[r] = (w, offset)
                fl[k] = True
            offset += math.prod(shapes[part])
    return data_host, diff_host, {s: (tuple(a), tuple(b)) for s, (a, b) in flags.items()}, relived


def resolve(host, r: int) -> tuple[int, int]:
    """The whole that root ``r`` lives in and its element offset there ((r, 0) if none)."""
    offset = 0
    while r in host:
        r, o = host[r]
        offset += o
    return r, offset


def _pass_through(steps: list[Step], layers, plan: Liveness, bottom_need, diff_host: dict,
                  rewritten) -> dict[int, tuple[bool, ...]]:
    """Bottom diffs equal to their top's diff (Eltwise SUM, coefficient 1) share its memory.

    The top's diff and those bottoms' diffs become one buffer, placed where
    one of them already lives (a Slice part of a time-major whole, say) or
    else at the top's; ``diff_host`` gains the entries. Every value has one
    reader (splits see to that), so nothing else writes that buffer between
    the top's readers' backward and the bottoms' producers'. Not for memory
    written in place or kept, nor for buffers already inside two wholes.
    Returns step -> per-bottom flags: the layer writes no diff for those.
    """
    written = {plan.diff_root[b] for b in rewritten}
    aliased: dict[int, tuple[bool, ...]] = {}
    for s, (step, layer) in enumerate(zip(steps, layers)):
        passes = layer.memory.passes_diff
        if passes is None or not plan.layer_need[s]:
            continue
        top = plan.diff_root[step.tops[0]]
        if top in plan.private or top in written:
            continue
        members = [(k, plan.diff_root[b]) for k, b in enumerate(step.bottoms)
                   if bottom_need[s][k] and passes(layer, k)]
        members = [(k, r) for k, r in members if r != top and r not in plan.private
                   and r not in written and sum(r == q for _, q in members) == 1]
        if not members:
            continue
        home = top if top in diff_host else next(
            (r for _, r in members if r in diff_host), top)
        if resolve(diff_host, home)[0] == top and home != top:
            continue  # the top's own buffer holds the bottom: not a pass-through
        flags = [False] * len(step.bottoms)
        for k, r in [(None, top)] + members:
            if r != home:
                if r in diff_host:
                    continue  # inside another whole already
                diff_host[r] = (home, 0)
            if k is not None:
                flags[k] = True
        if any(flags):
            aliased[s] = tuple(flags)
    return aliased
