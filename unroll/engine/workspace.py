"""The workspace: activation, gradient and scratch memory shared by every net of a model.

Only one net of a model runs at a time, so all of them (every bucket, train
and test phase) take their blobs from one byte arena, sized by the largest
net that has run rather than the sum. Where each buffer sits in the arena is
decided by the net's memory plan (:func:`unroll.engine.memory.layout`).
"""

from __future__ import annotations

import math
import weakref

import numpy as np

__all__ = ["ALIGN", "Workspace", "workspace_for"]

#: byte alignment of every buffer (a cache line; enough for any dtype and for SIMD loads)
ALIGN = 64


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
