"""The workspace: activation, gradient and scratch memory shared by every net of a model.

Only one net of a model runs at a time, so all of them (every bucket, train
and test phase) take their blobs from one byte arena, sized by the largest
net that has run rather than the sum. Where each buffer sits in the arena is
decided by :func:`place`, from the lifetimes a net's memory plan gives
(:func:`unroll.graph.rules.plan_memory`) and the sizes its shapes give.
"""

from __future__ import annotations

import bisect
import heapq
import math
import weakref

import numpy as np

__all__ = ["ALIGN", "Workspace", "place", "workspace_for"]

#: byte alignment of every buffer (a cache line; enough for any dtype and for SIMD loads)
ALIGN = 64


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def place(buffers) -> tuple[list[int], int]:
    """Offsets for buffers ``(first, last, nbytes)`` live over steps first..last, and the total.

    Two buffers whose lifetimes overlap never overlap in memory. A buffer
    takes, in this order, a freed buffer of its exact size, the smallest freed
    one at most twice its size, or new memory at the end: an unrolled net's
    steps free and ask for the same sizes over and over, so this stays within
    a few percent of the live peak, in O(n log n).

    >>> place([(0, 1, 64), (1, 2, 64), (2, 3, 64)])
    ([0, 64, 0], 128)
    """
    order = sorted(range(len(buffers)), key=lambda i: buffers[i][0])
    ending: list[tuple[int, int]] = []  # (last, index) of placed buffers, a heap by last
    free: list[tuple[int, int]] = []  # (size, offset), sorted
    offsets = [0] * len(buffers)
    sizes = [_aligned(max(b[2], 1)) for b in buffers]
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


class Workspace:
    """One growable byte arena on one device, lent to whichever net runs.

    ``nbytes`` is what the arena holds now: the largest plan that ran. A net
    that finds the arena too small grows it; every other net then drops its
    views of the old arena (so that memory is freed) and re-places on its
    next run.

    >>> ws = Workspace()
    >>> ws.grow(100)
    >>> ws.nbytes >= 100, ws.view(0, (2, 3), "float32").shape
    (True, (2, 3))
    """

    def __init__(self, xp=np):
        self.xp = xp
        self.arena = xp.zeros(0, np.uint8)
        #: the net whose forward ran last: only it may run backward
        self.holder = None
        self._clients: weakref.WeakSet = weakref.WeakSet()

    @property
    def nbytes(self) -> int:
        return int(self.arena.size)

    def __repr__(self) -> str:
        return (f"Workspace({self.nbytes:,} bytes on {self.xp.__name__}, "
                f"{len(self._clients)} nets)")

    def attach(self, client) -> None:
        """Register a net: its ``release_memory()`` is called when the arena moves."""
        self._clients.add(client)

    def grow(self, nbytes: int) -> None:
        """Make the arena at least ``nbytes``; views of the old one are released first."""
        if nbytes <= self.nbytes:
            return
        for client in list(self._clients):
            client.release_memory()
        self.arena = self.xp.zeros(0, np.uint8)  # free the old arena before the new one
        self.arena = self.xp.zeros(nbytes, np.uint8)
        self.holder = None

    def view(self, offset: int, shape, dtype):
        """The arena bytes at ``offset`` as an array of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        n = math.prod(shape) * dtype.itemsize
        return self.arena[offset : offset + n].view(dtype).reshape(shape)


_BY_STORE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def workspace_for(store, xp) -> Workspace:
    """The workspace of every net built over parameter store ``store`` on ``xp``'s device."""
    by_device = _BY_STORE.setdefault(store, {})
    key = xp.__name__
    if key not in by_device:
        by_device[key] = Workspace(xp)
    return by_device[key]
