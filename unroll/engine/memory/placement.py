"""Placement: buffers with lifetimes in, their offsets in one workspace out (docs/design.md,
6. Memory). Nothing here knows blobs or layers: a buffer is ``(first, last, nbytes)``.
"""

from __future__ import annotations

import bisect
import heapq

from unroll.engine.workspace import ALIGN

__all__ = ["place"]


def place(buffers) -> tuple[list[int], int]:
    """Offsets for buffers ``(first, last, nbytes)`` live over steps first..last, and the total.

    Two buffers whose lifetimes overlap never overlap in memory. A buffer
    takes, in this order, a freed buffer of its exact size, the smallest freed
    one at most twice its size, or new memory at the end: an unrolled net's
    steps free and ask for the same sizes over and over, so this stays within
    a few percent of the live peak, in O(n log n). Every buffer is aligned to
    :data:`unroll.engine.workspace.ALIGN` bytes.

    >>> place([(0, 1, 64), (1, 2, 64), (2, 3, 64)])
    ([0, 64, 0], 128)
    """
    order = sorted(range(len(buffers)), key=lambda i: buffers[i][0])
    ending: list[tuple[int, int]] = []  # (last, index) of placed buffers, a heap by last
    free: list[tuple[int, int]] = []  # (size, offset), sorted
    offsets = [0] * len(buffers)
    sizes = [-(-max(b[2], 1) // ALIGN) * ALIGN for b in buffers]
    top = 0
    for i in order:
        first = buffers[i][0]
        while ending and ending[0][0] < first:
            _, j = heapq.heappop(ending)
            bisect.insort(free, (sizes[j], offsets[j]))
        need = sizes[i]
        k = bisect.bisect_left(free, (need, -1))
        if k < len(free) and free[k][0] <= 2 * need:
            size, offsets[i] = free.pop(k)
            sizes[i] = size  # the whole block returns to the free list with it
        else:
            offsets[i], top = top, top + need
        heapq.heappush(ending, (buffers[i][1], i))
    return offsets, top
