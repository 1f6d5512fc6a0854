"""What liveness gives: every planned buffer's lifetime (:class:`Liveness`), from the graph
alone, with no shapes (docs/design.md, 6. Memory).

Time, for lifetimes, counts forward steps ``0..S-1``, then ``S`` when loss diffs are
filled, then backward steps, step ``s`` at ``2S - s`` (with a
:class:`~unroll.engine.memory.segments.Recompute` plan, its actions' steps one after
another).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from unroll.engine.memory.regions import widened

if TYPE_CHECKING:
    from unroll.engine.memory.segments import Recompute

__all__ = ["Lifetimes", "Liveness"]


class Lifetimes(Mapping):
    """root -> (first, last) time, for the roots placed in the workspace: a mapping held
    in two int32 arrays, since a net keeps it and a bucketed model keeps many nets."""

    __slots__ = ("_first", "_last")

    def __init__(self, spans: dict, n: int):
        self._first = np.full(n, -1, np.int32)
        self._last = np.full(n, -1, np.int32)
        if spans:
            roots = np.fromiter(spans, np.int64, len(spans))
            firsts, lasts = zip(*spans.values())
            self._first[roots], self._last[roots] = firsts, lasts

    def __getitem__(self, root: int) -> tuple[int, int]:
        if 0 <= root < len(self._first) and self._first[root] >= 0:
            return int(self._first[root]), int(self._last[root])
        raise KeyError(root)

    def __contains__(self, root) -> bool:
        return 0 <= root < len(self._first) and self._first[root] >= 0

    def __iter__(self):
        return iter(np.flatnonzero(self._first >= 0).tolist())

    def __len__(self) -> int:
        return int(np.count_nonzero(self._first >= 0))

    def items(self):
        roots = np.flatnonzero(self._first >= 0)
        return zip(roots.tolist(), zip(self._first[roots].tolist(), self._last[roots].tolist()))


@dataclass(frozen=True)
class Liveness:
    """Lifetimes of a net's memory, from its graph alone (no shapes).

    ``data_root[b]`` / ``diff_root[b]``: the blob whose memory blob b's data /
    diff is (a view or Split top shares its bottom's). ``data_life`` and
    ``diff_life`` map each root placed in the workspace to its (first, last)
    time; roots in ``private`` keep memory of their own (inputs, outputs,
    losses, ``keep=``). ``zero_before[s]`` lists diff roots that backward
    reads before anything writes them: zeroed right before step s's backward.

    With a :class:`Recompute` plan, a value that backward's forward runs write
    again has a life per run, each a buffer of its own: ``data_re_life`` maps
    life ids to their spans, ``re_root`` gives each life's root, lives of root
    r are ids ``re_index[r]`` to ``re_index[r + 1] - 1`` in time order, and
    ``re_born`` gives the action of ``recompute.order`` that starts each one
    (-1: the forward pass). Such roots are not in ``data_life``.
    """

    steps: int
    data_root: array
    diff_root: array
    private: set[int]
    data_life: Lifetimes
    diff_life: Lifetimes
    zero_before: dict[int, list[int]]
    layer_need: list[bool]
    windows: list = field(default_factory=list)  # of concurrent regions, as time spans
    #: with a Recompute plan: each step's backward time, each step's times in backward's
    #: forward runs (of the steps that keep scratch), the lives described above, the plan
    back: tuple | None = None
    re_time: Mapping = field(default_factory=dict)
    data_re_life: Lifetimes | None = None
    re_root: array = field(default_factory=lambda: array("i"))
    re_index: np.ndarray | None = None
    re_born: array = field(default_factory=lambda: array("i"))
    recompute: Recompute | None = None

    def backward_time(self, step: int) -> int:
        return self.back[step] if self.back is not None else 2 * self.steps - step

    def relived(self, root: int) -> bool:
        """Whether ``root``'s data has a life per forward run (in ``data_re_life``)."""
        return self.re_index is not None and self.re_index[root + 1] > self.re_index[root]

    def life_at(self, root: int, time: int) -> int:
        """The id of the life of relived ``root`` that holds its value at ``time``."""
        lo, hi = int(self.re_index[root]), int(self.re_index[root + 1])
        return bisect_right(self.data_re_life._first, time, lo + 1, hi) - 1

    def scratch_life(self, step: int, lives: str) -> tuple[int, int] | None:
        """When scratch of step ``step`` is live in the forward pass: ``lives`` is "forward",
        "backward" or "both". A step that backward runs forward again saves its scratch
        anew then (:meth:`scratch_re_life`)."""
        f, b = step, self.backward_time(step)
        runs_backward = self.layer_need[step]
        if lives == "forward":
            span = (f, f)
        elif lives == "backward":
            if not runs_backward:
                return None
            span = (b, b)
        elif step in self.re_time:
            span = (f, f)  # what backward reads, its last run saves again
        else:
            span = (f, b) if runs_backward else (f, f)
        return widened(span, self.windows)

    def scratch_re_life(self, step: int, lives: str, run: int) -> tuple[int, int] | None:
        """When scratch of a step is live in its ``run``-th forward run in backward (None:
        not): its last run saves what its backward reads."""
        times = self.re_time[step]
        again = times[run]
        if lives == "backward":
            return None
        if lives == "forward" or not self.layer_need[step] or run < len(times) - 1:
            return (again, again)
        return (again, self.backward_time(step))
