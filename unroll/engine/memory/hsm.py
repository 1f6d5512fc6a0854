"""Gruslys et al.'s BPTT-HSM over the chunks of a chain (docs/design.md, 6. Memory): its
dynamic program (:func:`bptt_hsm`), the actions that take its optimum (:func:`hsm_order`)
and the cuts of its segments (:func:`hsm_units`).
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["bptt_hsm", "hsm_order", "hsm_units"]


def hsm_units(between, allowed, crossing) -> tuple:
    """The cuts of BPTT-HSM's segments in a chain: between every two weight-gradient
    chunks (``between``, in run order), the allowed cut the fewest bytes cross; the steps
    before the first chunk go with it, those after the last with that.

    >>> hsm_units([(1, 2), (4, 5), (7, 8)], [1, 3, 4, 6, 7], [0, 0, 0, 5, 2, 0, 3, 1, 0])
    (4, 7)
    """
    spans = sorted((min(c), max(c)) for c in between)
    allowed = set(allowed)
    cuts = []
    for (_, last), (first, _) in zip(spans, spans[1:]):
        window = [p for p in range(last + 1, first + 1) if p in allowed]
        if window:
            cuts.append(min(window, key=crossing.__getitem__))
    return tuple(cuts)


def bptt_hsm(t: int, slots: int) -> int:
    """Gruslys et al.'s BPTT-HSM: the fewest forward steps that backpropagate a chain of
    ``t`` steps keeping at most ``slots`` hidden states (the input's included), by their
    dynamic program ``Q(t, m) = min_y y + Q(t - y, m - 1) + Q(y, m)``, ``Q(t, 1) = t(t+1)/2``,
    ``Q(1, m) = 1``: a step's backward runs its forward again from the state before it.

    >>> bptt_hsm(4, 1), bptt_hsm(4, 2), bptt_hsm(4, 4), bptt_hsm(1000, 10)
    (10, 8, 7, 4636)
    """
    slots = max(1, min(slots, t))
    return int(_hsm_table(t, slots)[0][slots, t])


def _hsm_table(t: int, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """BPTT-HSM's costs ``Q[m, n]`` and first moves ``Y[m, n]`` (the steps run forward
    before the state kept next) for chains up to ``t`` steps and at least ``slots`` slots:
    rows up to a power of two, so that a search over the slots builds few tables."""
    return _hsm_rows(t, min(t, 1 << max(0, slots - 1).bit_length()))


@functools.lru_cache(maxsize=8)
def _hsm_rows(t: int, slots: int) -> tuple[np.ndarray, np.ndarray]:
    ts = np.arange(t + 1, dtype=np.int64)
    q = np.zeros((slots + 1, t + 1), np.int64)
    y = np.zeros((slots + 1, t + 1), np.int64)
    q[1] = ts * (ts + 1) // 2  # one slot: from the input every time (hsm_order's own case)
    for m in range(2, slots + 1):
        row, prev = q[m], q[m - 1]
        row[: m + 1] = np.maximum(2 * ts[: m + 1] - 1, 0)  # a slot for every state
        y[m, : m + 1] = np.minimum(ts[: m + 1], 1)
        for n in range(m + 1, t + 1):  # Q(., m) from Q(., m - 1), one n at a time
            costs = ts[1:n] + prev[n - 1 : 0 : -1] + row[1:n]
            k = int(costs.argmin())
            row[n], y[m, n] = costs[k], k + 1
    for a in (q, y):
        a.flags.writeable = False
    return q, y


def hsm_order(units: int, slots: int) -> tuple:
    """BPTT-HSM's policy for a chain of ``units`` segments in ``slots`` slots, as
    backward's actions (:class:`Recompute`): the forward pass runs every segment once,
    keeping the states the policy keeps; then the actions after it, whose forward runs
    total :func:`bptt_hsm` with the forward pass. A segment runs forward right before its
    own backward, from the state kept before it.

    >>> hsm_order(3, 2)  # segment 0 again, from the input; 1 twice, from the state kept at 1
    (-3, 1, -2, 0, -1)
    """
    slots = max(1, min(slots, units))
    _, first = _hsm_table(units, slots)
    actions: list[int] = []
    todo = [(0, units, slots)]  # ranges still to backpropagate, last first
    while todo:
        a, b, m = todo.pop()
        if b - a == 1:
            actions += [a, ~a]
        elif m == 1:  # from the state at a for every step
            for end in reversed(range(a, b)):
                actions += [*range(a, end + 1), ~end]
        else:
            y = int(first[m, b - a])
            actions += range(a, a + y)
            todo += [(a, a + y, m), (a + y, b, m - 1)]
    # the forward pass is every forward before the first backward
    first_backward = next(i for i, x in enumerate(actions) if x < 0)
    assert actions[:first_backward] == list(range(units))
    return tuple(actions[first_backward:])
