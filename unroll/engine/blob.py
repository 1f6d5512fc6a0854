"""Blob: a value and its gradient, side by side, on one device."""

from __future__ import annotations

import math

import numpy as np

from unroll.core.errors import NetError


def _shape_tuple(shape) -> tuple:
    """``shape`` as a tuple of ints: the given tuple itself when it is one, so that a top
    shaped like its bottom shares the bottom's tuple (an unrolled net has thousands)."""
    if type(shape) is tuple:
        for d in shape:
            if type(d) is not int:
                break
        else:
            return shape
    return tuple(int(d) for d in shape)


class Blob:
    """``data`` and ``diff`` arrays of one shape and dtype (Caffe's Blob).

    Two blobs may share memory: a weight-sharing layer's param blob holds the
    owner's arrays (or views of them), so updates and gradients land in one
    buffer. Code that changes a blob's values must write into the arrays
    (``blob.data[...] = v``), never rebind them, or sharing would break.

    Arrays are allocated (zero-filled) on first use, so shaping a blob costs
    nothing: a net places most of its blobs in a shared workspace instead
    (see :mod:`unroll.engine.workspace`). A blob made a view of another with
    :meth:`view_of` always reads that blob's current memory.

    >>> b = Blob((2, 3))
    >>> b.shape, b.count, b.data.dtype
    ((2, 3), 6, dtype('float32'))
    """

    __slots__ = ("_data", "_diff", "_shape", "xp", "dtype", "name", "_source", "_source_diff",
                 "_seen", "_seen_diff", "guard")

    def __init__(self, shape=(), xp=np, dtype=np.float32, name=""):
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.name = name
        self._shape = _shape_tuple(shape)
        self._data = self._diff = None
        self._source = None  # the blob whose data (and, with _source_diff, diff) this one views
        self._source_diff = False
        self._seen = self._seen_diff = None
        #: None, or the net's access gate: its memory is the net's only while the net runs
        self.guard = None

    @property
    def data(self):
        if self.guard is not None and not self.guard.open:
            raise self.guard.closed_error(self)
        if self._source is None and self._data is not None:
            return self._data  # the common case, on every layer call: no further call
        return self._data_array()

    @data.setter
    def data(self, array) -> None:
        self._data, self._shape = array, tuple(array.shape)
        if self._source is not None:
            self._source, self._diff, self._source_diff = None, None, False

    @property
    def diff(self):
        """The gradient, zeros until written; allocated on first use, so a net that
        never runs backward (a test-phase net) holds no gradient memory."""
        if self.guard is not None and not self.guard.open:
            raise self.guard.closed_error(self)
        if not self._source_diff and self._diff is not None:
            return self._diff
        return self._diff_array()

    @diff.setter
    def diff(self, array) -> None:
        self._diff, self._source_diff = array, False

    def _data_array(self):
        if self._source is not None:
            array = self._source._data_array()
            if array is not self._seen:
                same = array.shape == self._shape
                self._data, self._seen = array if same else array.reshape(self._shape), array
        elif self._data is None:
            self._data = self.xp.zeros(self._shape, self.dtype)
        return self._data

    def _diff_array(self):
        if self._source_diff:
            array = self._source._diff_array()
            if array is not self._seen_diff:
                same = array.shape == self._shape
                self._diff = array if same else array.reshape(self._shape)
                self._seen_diff = array
        elif self._diff is None:
            self._diff = self.xp.zeros(self._shape, self.dtype)
        return self._diff

    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def count(self) -> int:
        return math.prod(self._shape)

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self._shape) * self.dtype.itemsize

    def reshape(self, shape) -> bool:
        """Give the blob ``shape`` (its memory comes on first use). True if the shape changed."""
        if type(shape) is tuple and shape == self._shape:
            return False
        shape = _shape_tuple(shape)
        if shape == self._shape:
            return False
        if shape and min(shape) < 0:
            raise NetError(f"blob '{self.name}': negative dimension in shape {shape}")
        self._shape = shape
        self._data = self._diff = self._seen = self._seen_diff = None
        return True

    def bind(self, data=None, diff=None) -> None:
        """Give the blob the arrays a net placed for it (None: its own, on first use)."""
        self._data, self._diff = data, diff
        self._seen = self._seen_diff = None

    def bind_data(self, data) -> None:
        """Give the blob other data memory a net placed for it; its diff stays."""
        self._data, self._seen = data, None

    def view_of(self, other: Blob, diff: bool = True) -> None:
        """Make ``data`` (and ``diff`` too, if asked) a view of ``other``'s, whatever memory
        ``other`` is given later. Same count required; the shape is this blob's."""
        if other.count != self.count:
            raise NetError(f"blob '{self.name}' {self.shape} cannot view blob '{other.name}' "
                           f"{other.shape}: counts differ")
        self._source, self._source_diff = other, diff
        self._seen = self._seen_diff = None
        if not diff:
            self._diff = None

    def share_data(self, other: Blob) -> None:
        """Make ``data`` the memory of ``other`` (same shape), now and after it moves."""
        self.view_of(other, diff=False)

    def __repr__(self) -> str:
        return f"Blob({self.name!r}, shape={self.shape}, dtype={self.dtype})"
