"""The data half of the liveness walk over arrays (docs/design.md, 6. Memory): every data
touch of the forward pass and of backward's actions, as one array of (root, time), and the
lifetimes they give. What a step touches depends on the graph alone (:class:`StepRoots`,
found once per net); a plan only moves when each step runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = ["DataWalk", "StepRoots", "data_walk", "saves_scratch", "step_roots"]


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: it holds arrays
class StepRoots:
    """Per step, the data roots a walk touches, as compressed rows: ``roots[start[s] :
    start[s + 1]]`` are its tops' roots (the first ``tops[s]``), then its bottoms';
    ``reads[read_start[s] : read_start[s + 1]]`` the roots its backward reads; ``scratch``
    whether its layer keeps scratch, ``view`` whether it writes no data of its own and
    ``saves`` whether it saves scratch for its backward (:func:`saves_scratch`)."""

    start: np.ndarray
    roots: np.ndarray
    tops: np.ndarray
    read_start: np.ndarray
    reads: np.ndarray
    scratch: np.ndarray
    view: bytes
    saves: bytes


def step_roots(steps, layers, data_root, reads, layer_need) -> StepRoots:
    """The :class:`StepRoots` of a net's run order (``reads``: per step, the data roots its
    backward reads, :func:`~unroll.engine.memory.liveness.backward_reads`)."""
    root = np.asarray(data_root, np.int64)
    blobs = [b for step in steps for b in (*step.tops, *step.bottoms)]
    counts = [len(step.tops) + len(step.bottoms) for step in steps]
    read_counts = [len(r) for r in reads]
    return StepRoots(_starts(counts), root[np.array(blobs, np.int64)],
                     np.array([len(step.tops) for step in steps], np.int64),
                     _starts(read_counts),
                     np.array([r for rs in reads for r in rs], np.int64),
                     np.array([bool(layer.scratch_specs) for layer in layers], bool),
                     bytes("data" in layer.memory.shares_bottom for layer in layers),
                     bytes(saves_scratch(layer, need) for layer, need in zip(layers, layer_need)))


def saves_scratch(layer, runs_backward) -> bool:
    """Whether a layer keeps scratch from its forward to its backward."""
    return bool(runs_backward and layer.scratch_specs
                and any(lives == "both" for _, _, lives in layer.scratch_specs.values()))


def _starts(counts) -> np.ndarray:
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _rows(start, counts, rows) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the first ``counts[i]`` entries of each of ``rows`` (rows starting at
    ``start``), and for each which of ``rows`` it came from."""
    n = counts[rows]
    ends = np.cumsum(n)
    total = int(ends[-1]) if len(ends) else 0
    of = np.repeat(np.arange(len(rows)), n)
    return np.arange(total) + (start[rows] - ends + n)[of], of


class DataWalk(NamedTuple):
    """What :func:`data_walk` finds: per data buffer (the roots, then one per root's run
    again, by root and time) its ``first`` and ``last`` time (-1: never touched);
    ``life_root`` and ``life_action`` the root and writing action of each buffer after the
    roots; ``back`` each step's backward time; ``again_at`` the times (a tuple) each step
    keeping scratch runs in backward's forward runs, the steps in the order first run."""

    first: np.ndarray
    last: np.ndarray
    life_root: np.ndarray
    life_action: np.ndarray
    back: np.ndarray
    again_at: dict


def data_walk(at: StepRoots, n_blobs: int, bounds, order, runs, again, layer_need
              ) -> DataWalk:
    """The data lifetimes of the forward pass (time 0..S-1), the loss (S) and backward's
    ``order`` of actions (a forward run of ``runs[i]``'s steps, or a segment's backward,
    between ``bounds``, last step first), as :func:`~unroll.engine.memory.liveness.liveness`
    describes: a root whose byte in ``again`` is set gets a buffer per action that writes
    it, from that write to its last use before the next."""
    S = len(at.tops)
    steps, actions, times = [np.arange(S)], [np.full(S, -1)], [np.arange(S)]
    back = np.zeros(S, np.int64)
    t = S + 1
    for i, a in enumerate(order):
        if a >= 0:
            run = np.asarray(runs[i], np.int64)
            steps.append(run)
            actions.append(np.full(len(run), i))
            times.append(np.arange(t, t + len(run)))
            t += len(run)
            continue
        lo, hi = bounds[~a], bounds[~a + 1]
        back[lo:hi] = np.arange(t + hi - lo - 1, t - 1, -1)
        t += hi - lo
    steps, actions, times = (np.concatenate(x).astype(np.int64) for x in (steps, actions,
                                                                          times))
    # every touch: each run step's tops and bottoms, then backward's reads
    at_roots, of = _rows(at.start, at.start[1:] - at.start[:-1], steps)
    need = np.flatnonzero(np.asarray(layer_need, bool))
    at_reads, of_read = _rows(at.read_start, at.read_start[1:] - at.read_start[:-1], need)
    roots = np.concatenate([at.roots[at_roots], at.reads[at_reads]])
    when = np.concatenate([times[of], back[need][of_read]])
    # a root run again gets a buffer at the first write of each action writing it
    tops, of_top = _rows(at.start, at.tops, steps)
    written = at.roots[tops]
    fresh = np.frombuffer(bytes(again), np.uint8)[written] > 0 if len(again) else (
        np.zeros(len(written), bool))
    written, of_top = written[fresh], of_top[fresh]
    _, firsts = np.unique(written * (len(order) + 1) + actions[of_top] + 1, return_index=True)
    born = np.sort(firsts)  # the first writes, in time order
    life_root, life_time = written[born], times[of_top[born]]
    life_action = actions[of_top[born]]
    by = np.lexsort((life_time, life_root))
    life_root, life_time, life_action = life_root[by], life_time[by], life_action[by]
    # a touch is of the root's buffer born last at or before it; a root not run again, or
    # touched before its first run, has its own
    span = t + 1
    key = life_root * span + life_time
    j = np.searchsorted(key, roots * span + when, "right") - 1
    own = j < 0
    own[~own] = life_root[j[~own]] != roots[~own]
    first = np.full(n_blobs + len(life_root), np.iinfo(np.int64).max)
    last = np.full(n_blobs + len(life_root), -1, np.int64)
    np.minimum.at(first, roots[own], when[own])
    np.maximum.at(last, roots[own], when[own])
    first[n_blobs:], last[n_blobs:] = life_time, life_time
    np.maximum.at(last, n_blobs + j[~own], when[~own])
    first[last < 0] = -1
    kept = at.scratch[steps] & (actions >= 0)  # scratch of a run in backward
    return DataWalk(first, last, life_root, life_action, back,
                    _again_at(steps[kept], times[kept]))


def _again_at(steps: np.ndarray, times: np.ndarray) -> dict[int, tuple]:
    """Step -> its ``times`` (ascending, as given), the steps in the order first given."""
    by_step = np.argsort(steps, kind="stable")
    steps, times = steps[by_step], times[by_step].tolist()
    starts = np.flatnonzero(np.diff(steps, prepend=-1))
    ends = np.append(starts[1:], len(steps)).tolist()
    first = np.argsort(by_step[starts], kind="stable").tolist()
    ids, starts = steps[starts].tolist(), starts.tolist()
    return {ids[k]: tuple(times[starts[k] : ends[k]]) for k in first}
