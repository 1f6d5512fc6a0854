"""What liveness gives: every planned buffer's lifetime (:class:`Liveness`), from the graph
alone, with no shapes (docs/design.md, 6. Memory).

Time, for lifetimes, counts the actions of the run order one after another: forward steps
``0..S-1``, then ``S`` when loss diffs are filled, then backward's actions (step ``s``'s
backward at ``2S - s`` without a :class:`~unroll.engine.memory.segments.Recompute` plan;
with one, its actions' steps one after another).
"""

from __future__ import annotations

from array import array
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

    @classmethod
    def of(cls, first: np.ndarray, last: np.ndarray) -> Lifetimes:
        """The lifetimes of arrays of first and last times by root (-1: none).

        >>> dict(Lifetimes.of(np.array([-1, 3]), np.array([-1, 5])))
        {1: (3, 5)}
        """
        out = cls({}, 0)
        out._first, out._last = first.astype(np.int32), last.astype(np.int32)
        return out

    def moved(self, times: np.ndarray) -> Lifetimes:
        """These lifetimes with every time t moved to ``times[t]`` (``times[-1]`` is -1).

        >>> Lifetimes({0: (1, 2)}, 2).moved(np.array([0, 5, 7, -1])).items().__next__()
        (0, (5, 7))
        """
        out = Lifetimes({}, len(self._first))
        out._first, out._last = times[self._first], times[self._last]
        return out

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
    diff is (a view or Split top shares its bottom's). A buffer is a root's
    memory over one lifetime: ``data_life`` and ``diff_life`` map each buffer
    placed in the workspace to its (first, last) time; roots in ``private``
    keep memory of their own (inputs, outputs, losses, ``keep=``).
    ``zero_before[s]`` lists diff roots that backward reads before anything
    writes them: zeroed right before step s's backward. ``back[s]`` is step s's
    backward time.

    A data buffer is numbered as its root, except where backward's forward
    runs (a :class:`Recompute` plan) write the root again: the root then has a
    buffer per run that writes it (the forward pass's first), numbered after
    the blobs, ``data_buffers(r)`` in time order; ``root_of`` gives each such
    buffer's root and ``written_by`` the action of ``recompute.order`` that
    writes it (-1: the forward pass). ``again_at[s]``: step s's times in
    backward's forward runs, for the steps that keep scratch.
    """

    steps: int
    data_root: array
    diff_root: array
    private: set[int]
    data_life: Lifetimes
    diff_life: Lifetimes
    zero_before: dict[int, list[int]]
    layer_need: list[bool]
    back: tuple
    windows: list = field(default_factory=list)  # of concurrent regions, as time spans
    again_at: Mapping = field(default_factory=dict)
    root_of: array = field(default_factory=lambda: array("i"))
    written_by: array = field(default_factory=lambda: array("i"))
    #: data root -> where its buffers start among those numbered after the blobs
    first_buffer: np.ndarray | None = None
    recompute: Recompute | None = None
    #: per step, the data roots its backward reads
    #: (:func:`~unroll.engine.memory.liveness.backward_reads`, found once per net)
    reads: tuple = ()

    @property
    def buffers(self) -> int:
        """How many data buffers there are: one a blob, then those of roots run again."""
        return len(self.data_root) + len(self.root_of)

    def relived(self, root: int) -> bool:
        """Whether ``root``'s data has a buffer per forward run."""
        return (self.first_buffer is not None
                and self.first_buffer[root + 1] > self.first_buffer[root])

    def data_buffers(self, root: int) -> range:
        """The data buffers of ``root`` in time order: itself, or one per forward run."""
        if not self.relived(root):
            return range(root, root + 1)
        n = len(self.data_root)
        return range(n + int(self.first_buffer[root]), n + int(self.first_buffer[root + 1]))

    def buffers_at(self, roots: np.ndarray, times: np.ndarray) -> np.ndarray:
        """The data buffers that hold ``roots``' values at ``times`` (arrays, one entry a
        root): a root's own, or of its buffers the one written last by then (its first
        where none is yet)."""
        if self.first_buffer is None:
            return roots.copy()
        n = len(self.data_root)
        start, stop = self.first_buffer[roots], self.first_buffer[roots + 1]
        # the buffers after the blobs, by root, then time: one sorted key a buffer
        lives = np.asarray(self.root_of, np.int64)
        born = self.data_life._first[n:].astype(np.int64)
        span = int(max(born.max(initial=0), times.max(initial=0))) + 1
        last = np.searchsorted(lives * span + born, roots * span + times, "right") - 1
        return np.where(stop > start, n + np.maximum(last, start), roots)

    def root_of_buffer(self, buffer: int) -> int:
        """The root whose data ``buffer`` holds: the buffer itself, or for one numbered after
        the blobs (a root run again), that root (``root_of``)."""
        n = len(self.data_root)
        return buffer if buffer < n else self.root_of[buffer - n]

    def scratch_life(self, step: int, lives: str, run: int) -> tuple[int, int] | None:
        """When scratch of step ``step`` is live (None: never) in the forward pass (``run``
        -1) or in its ``run``-th forward run in backward: ``lives`` is "forward",
        "backward" or "both". Of a step that backward runs forward again, the last run
        saves what its backward reads."""
        times = self.again_at.get(step, ())
        b, runs_backward = self.back[step], self.layer_need[step]
        if run >= 0:
            again = times[run]
            if lives == "backward":
                return None
            if lives == "forward" or not runs_backward or run < len(times) - 1:
                return (again, again)
            return (again, b)
        f = step
        if lives == "forward":
            span = (f, f)
        elif lives == "backward":
            if not runs_backward:
                return None
            span = (b, b)
        elif times:
            span = (f, f)  # what backward reads, its last run saves again
        else:
            span = (f, b) if runs_backward else (f, f)
        return widened(span, self.windows)
