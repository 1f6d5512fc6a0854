"""Placement: buffers with lifetimes in, their offsets in one workspace out (docs/design.md,
6. Memory). Nothing here knows blobs or layers: a buffer is a first and last time and a
size in bytes.
"""

from __future__ import annotations

import bisect
import heapq
import sys

import numpy as np

from unroll.engine.workspace import ALIGN

__all__ = ["place"]

#: from this many buffers on, placement runs compiled: importing numba costs about 0.6 s,
#: more than the Python loop takes for a net of this size (where numba is loaded already,
#: as in any process that has run a recurrent unit, the compiled pass always runs)
COMPILED_FROM = 200_000


def place(first, last, nbytes) -> tuple[np.ndarray, int]:
    """Offsets for buffers of ``nbytes`` live over steps ``first``..``last`` (arrays, one
    entry a buffer), and the total.

    Two buffers whose lifetimes overlap never overlap in memory. In order of
    first time (ties in the order given), a buffer takes, in this order, a
    freed buffer of its exact size, the smallest freed one at most twice its
    size (the lowest of those), or new memory at the end: an unrolled net's
    steps free and ask for the same sizes over and over, so this stays within
    a few percent of the live peak, in O(n log n) (for a long net one compiled pass,
    :func:`unroll.engine.kernels.placement.best_fit`; the same rule in Python
    below :data:`COMPILED_FROM` buffers). Every buffer is aligned
    to :data:`unroll.engine.workspace.ALIGN` bytes.

    >>> offsets, total = place([0, 1, 2], [1, 2, 3], [64, 64, 64])
    >>> offsets.tolist(), total
    ([0, 64, 0], 128)
    """
    first, last = np.asarray(first, np.int64), np.asarray(last, np.int64)
    sizes = -(-np.maximum(np.asarray(nbytes, np.int64), 1) // ALIGN) * ALIGN
    if not len(first) == len(last) == len(sizes):
        raise ValueError(f"place: {len(first)} first times, {len(last)} last times and "
                         f"{len(sizes)} sizes: expected one of each per buffer")
    backwards = np.flatnonzero(last < first)
    if len(backwards):
        i = int(backwards[0])
        raise ValueError(f"place: buffer {i} lives from {first[i]} to {last[i]}: expected "
                         f"its last time at or after its first")
    by_first, by_last = np.argsort(first, kind="stable"), np.argsort(last, kind="stable")
    if len(sizes) < COMPILED_FROM and not _numba_loaded():
        return _best_fit(by_first.tolist(), by_last.tolist(), first.tolist(), last.tolist(),
                         sizes.tolist())
    from unroll.engine.kernels.placement import best_fit

    classes = np.unique(sizes)
    offsets, top = best_fit(by_first, by_last, first, last, sizes, classes,
                            np.searchsorted(classes, sizes))
    return offsets, int(top)


def _numba_loaded() -> bool:
    return "numba" in sys.modules


def _best_fit(by_first, by_last, first, last, sizes) -> tuple[np.ndarray, int]:
    """:func:`~unroll.engine.kernels.placement.best_fit`'s pass over lists: the freed
    blocks of each size a heap of offsets, the sizes that have any a sorted list."""
    free: dict[int, list[int]] = {}
    free_sizes: list[int] = []
    offsets, top, e, n = [0] * len(sizes), 0, 0, len(sizes)
    for i in by_first:
        now = first[i]
        while e < n and last[by_last[e]] < now:
            j = by_last[e]
            e += 1
            if sizes[j] not in free:
                free[sizes[j]] = []
                bisect.insort(free_sizes, sizes[j])
            heapq.heappush(free[sizes[j]], offsets[j])
        k = bisect.bisect_left(free_sizes, sizes[i])
        if k < len(free_sizes) and free_sizes[k] <= 2 * sizes[i]:
            size = free_sizes[k]
            offsets[i] = heapq.heappop(free[size])
            if not free[size]:
                del free[size], free_sizes[k]
            sizes[i] = size  # the buffer keeps the whole block
        else:
            offsets[i], top = top, top + sizes[i]
    return np.array(offsets, np.int64), top
