"""Blob: a value and its gradient, side by side, on one device."""

from __future__ import annotations

import numpy as np


class Blob:
    """``data`` and ``diff`` arrays of one shape and dtype (Caffe's Blob).

    Two blobs may share memory: a weight-sharing layer's param blob holds the
    owner's arrays (or views of them), so updates and gradients land in one
    buffer. Code that changes a blob's values must write into the arrays
    (``blob.data[...] = v``), never rebind them, or sharing would break.

    >>> b = Blob((2, 3))
    >>> b.shape, b.count, b.data.dtype
    ((2, 3), 6, dtype('float32'))
    """

    __slots__ = ("data", "_diff", "xp", "dtype", "name")

    def __init__(self, shape=(), xp=np, dtype=np.float32, name=""):
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.name = name
        self.data = xp.zeros(tuple(shape), self.dtype)
        self._diff = None

    @property
    def diff(self):
        """The gradient, zeros until written; allocated on first use, so a net that
        never runs backward (a test-phase net) holds no gradient memory."""
        if self._diff is None:
            self._diff = self.xp.zeros(self.data.shape, self.dtype)
        return self._diff

    @diff.setter
    def diff(self, array) -> None:
        self._diff = array

    @property
    def shape(self) -> tuple:
        return self.data.shape

    @property
    def count(self) -> int:
        return int(self.data.size)

    @property
    def ndim(self) -> int:
        return self.data.ndim

    def reshape(self, shape) -> bool:
        """Give the blob ``shape``; allocates only when the shape changes. True if it did."""
        shape = tuple(int(d) for d in shape)
        if shape == self.data.shape:
            return False
        if any(d < 0 for d in shape):
            raise ValueError(f"blob '{self.name}': negative dimension in shape {shape}")
        self.data = self.xp.zeros(shape, self.dtype)
        self._diff = None
        return True

    def share_data(self, other: Blob) -> None:
        """Make ``data`` the very array of ``other`` (same shape required)."""
        self.data = other.data

    def __repr__(self) -> str:
        return f"Blob({self.name!r}, shape={self.shape}, dtype={self.dtype})"
