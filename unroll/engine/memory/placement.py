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
    firsts = [b[0] for b in buffers]
    order = sorted(range(len(buffers)), key=firsts.__getitem__)
    ending: list[tuple[int, int]] = []  # (last, index) of placed buffers, a heap by last
    # freed blocks by size, each a heap of offsets, and the sizes that have any, sorted:
    # the smallest (size, offset) at least a size is a bisect and a heap pop, where one
    # sorted list of every freed block moved thousands of entries a step at T=20,000
    free: dict[int, list[int]] = {}
    free_sizes: list[int] = []
    offsets = [0] * len(buffers)
    sizes = [-(-max(b[2], 1) // ALIGN) * ALIGN for b in buffers]
    top = 0
    push, pop = heapq.heappush, heapq.heappop
    for i in order:
        first = firsts[i]
        while ending and ending[0][0] < first:
            j = pop(ending)[1]
            size = sizes[j]
            if size in free:
                push(free[size], offsets[j])
            else:
                free[size] = [offsets[j]]
                bisect.insort(free_sizes, size)
        need = sizes[i]
        k = bisect.bisect_left(free_sizes, need)
        if k < len(free_sizes) and free_sizes[k] <= 2 * need:
            size = free_sizes[k]
            block = free[size]
            offsets[i] = pop(block)
            if not block:
                del free[size], free_sizes[k]
            sizes[i] = size  # the whole block returns to the free list with it
        else:
            offsets[i], top = top, top + need
        push(ending, (buffers[i][1], i))
    return offsets, top
