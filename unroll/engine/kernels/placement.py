"""Best-fit placement of buffers with lifetimes as one compiled pass (numba), for
:func:`unroll.engine.memory.placement.place` (docs/design.md, 6. Memory).

A long chain places hundreds of thousands of buffers per layout, and a budget lays out
several plans: in Python, the heaps of freed blocks cost seconds a layout. The rule is
:func:`~unroll.engine.memory.placement.place`'s; this is its loop over arrays: the freed
blocks of each size a binary heap of offsets in one pool, and the sizes that have any
found by a segment tree over the sorted sizes.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _first_at_least(tree, leaves: int, k: int) -> int:
    """The first size class at or after ``k`` with a freed block (-1: none)."""
    if k >= leaves:
        return -1
    i = leaves + k
    if tree[i]:
        return k
    while True:
        if i == 1:
            return -1
        if i % 2 == 0 and tree[i + 1]:
            i += 1
            break
        i //= 2
    while i < leaves:
        i = 2 * i if tree[2 * i] else 2 * i + 1
    return i - leaves


@njit(cache=True, nogil=True)
def _mark(tree, leaves: int, k: int, value: bool) -> None:
    i = leaves + k
    tree[i] = value
    i //= 2
    while i >= 1:
        tree[i] = tree[2 * i] or tree[2 * i + 1]
        i //= 2


@njit(cache=True, nogil=True)
def best_fit(by_first, by_last, first, last, sizes, classes, size_class):
    """Offsets and the total for buffers of aligned ``sizes`` live over first..last.

    ``by_first`` and ``by_last`` order the buffers by first and by last time (a buffer
    ending before another starts is placed before it), ``classes`` are the distinct
    sizes, ascending, and ``size_class`` each buffer's index there. In order of first
    time, a buffer takes the lowest freed block of the smallest size at least its own
    and at most twice it (and keeps the whole block), or new memory at the end.
    """
    n, count = len(by_first), len(classes)
    leaves = 1
    while leaves < count:
        leaves *= 2
    tree = np.zeros(2 * leaves, np.bool_)
    start = np.zeros(count, np.int64)
    length = np.zeros(count, np.int64)
    capacity = np.zeros(count, np.int64)
    pool = np.empty(max(16, n), np.int64)
    used = 0
    block = size_class.copy()
    offsets = np.zeros(n, np.int64)
    top = 0
    e = 0
    for i in by_first:
        now = first[i]
        while e < n and last[by_last[e]] < now:
            j = by_last[e]
            e += 1
            c = block[j]
            if length[c] == capacity[c]:  # the heap moves to the pool's end, twice as large
                grown = max(4, 2 * capacity[c])
                if used + grown > len(pool):
                    bigger = np.empty(max(2 * len(pool), used + grown), np.int64)
                    bigger[:used] = pool[:used]
                    pool = bigger
                pool[used:used + length[c]] = pool[start[c]:start[c] + length[c]]
                start[c], capacity[c] = used, grown
                used += grown
            base, at, value = start[c], length[c], offsets[j]
            while at > 0:  # sift up
                parent = (at - 1) // 2
                if pool[base + parent] <= value:
                    break
                pool[base + at] = pool[base + parent]
                at = parent
            pool[base + at] = value
            length[c] += 1
            if length[c] == 1:
                _mark(tree, leaves, c, True)
        c = _first_at_least(tree, leaves, size_class[i])
        if c >= 0 and classes[c] <= 2 * sizes[i]:
            base = start[c]
            offsets[i] = pool[base]
            length[c] -= 1
            size, value, at = length[c], pool[base + length[c]], 0
            while True:  # sift the last entry down from the root
                child = 2 * at + 1
                if child >= size:
                    break
                if child + 1 < size and pool[base + child + 1] < pool[base + child]:
                    child += 1
                if pool[base + child] >= value:
                    break
                pool[base + at] = pool[base + child]
                at = child
            if size:
                pool[base + at] = value
            else:
                _mark(tree, leaves, c, False)
            block[i] = c
        else:
            offsets[i] = top
            top += sizes[i]
    return offsets, top
