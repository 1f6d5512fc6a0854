"""Placement: buffers with lifetimes in, their offsets in one workspace out (docs/design.md,
6. Memory). Nothing here knows blobs or layers: a buffer is a first and last time and a
size in bytes.
"""

from __future__ import annotations

import numpy as np

from unroll.engine.kernels.placement import best_fit
from unroll.engine.workspace import ALIGN

__all__ = ["place"]


def place(first, last, nbytes) -> tuple[np.ndarray, int]:
    """Offsets for buffers of ``nbytes`` live over steps ``first``..``last`` (arrays, one
    entry a buffer), and the total.

    Two buffers whose lifetimes overlap never overlap in memory. In order of
    first time (ties in the order given), a buffer takes, in this order, a
    freed buffer of its exact size, the smallest freed one at most twice its
    size (the lowest of those), or new memory at the end: an unrolled net's
    steps free and ask for the same sizes over and over, so this stays within
    a few percent of the live peak, in O(n log n) (one compiled pass,
    :func:`unroll.engine.kernels.placement.best_fit`). Every buffer is aligned
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
    classes = np.unique(sizes)
    offsets, top = best_fit(np.argsort(first, kind="stable"), np.argsort(last, kind="stable"),
                            first, last, sizes, classes, np.searchsorted(classes, sizes))
    return offsets, int(top)
