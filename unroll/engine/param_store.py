"""Named learnable parameters, owned once, shared by name, packed into flat buffers."""

from __future__ import annotations

from dataclasses import dataclass

from unroll.engine.backend import device_of
from unroll.engine.blob import Blob


@dataclass(repr=False)
class LearnableParam:
    """One owned parameter: its name, blob, multipliers, and the layer that owns it.

    ``name`` is the ``param { name: ... }`` of the prototxt, or
    ``"<layer>.<index>"`` for an unnamed (private) param. ``offset`` is where
    its values start in the store's flat buffers (-1 until :meth:`ParamStore.pack`).
    ``p.data`` and ``p.diff`` are its blob's arrays (``p.blob.data``, ``p.blob.diff``).

    >>> import numpy as np
    >>> p = LearnableParam("W", Blob((2, 3), dtype=np.float32), owner="ip")
    >>> p.data.shape, p
    ((2, 3), LearnableParam('W', shape=(2, 3), float32, lr_mult=1, decay_mult=1, owner='ip'))
    """

    name: str
    blob: Blob
    lr_mult: float = 1.0
    decay_mult: float = 1.0
    owner: str = ""
    has_lr_mult: bool = False
    has_decay_mult: bool = False
    offset: int = -1

    @property
    def data(self):
        """The param's values (its blob's data)."""
        return self.blob.data

    @property
    def diff(self):
        """The param's gradient (its blob's diff)."""
        return self.blob.diff

    @property
    def shape(self) -> tuple:
        return self.blob.shape

    def __repr__(self) -> str:
        return (f"LearnableParam({self.name!r}, shape={self.blob.shape}, {self.blob.dtype}, "
                f"lr_mult={self.lr_mult:g}, decay_mult={self.decay_mult:g}, "
                f"owner={self.owner!r})")


class ParamStore:
    """The owners of named params, shared by every net built over it.

    One store per model: all the unrolled nets of a bucketed model are built
    over the same store, so a param named "W" is one data and one diff buffer
    whichever net (bucket length) runs.

    :meth:`pack` moves every param into ONE contiguous data buffer and ONE
    diff buffer (``store.data``, ``store.diff``), each blob then holding a view
    of its slice: a solver clears, clips and all-reduces the gradients of the
    whole model as one array. Packing is append-only: params added later (a
    net built lazily) go after the packed ones at the next ``pack()``, which
    reallocates the buffers and rebinds every blob, so existing offsets stay.

    >>> import numpy as np
    >>> store = ParamStore()
    >>> store.add(LearnableParam("W", Blob((2, 3), dtype=np.float64)))
    >>> store.add(LearnableParam("b", Blob((3,), dtype=np.float64)))
    >>> store.pack(), store.data.shape, store["b"].offset
    (True, (9,), 6)
    >>> store["W"].blob.data[...] = 1.0
    >>> float(store.data.sum())
    6.0
    """

    def __init__(self):
        self._by_name: dict[str, LearnableParam] = {}
        self._order: list[LearnableParam] = []
        self._aliases: list[tuple[Blob, LearnableParam]] = []
        self._packed = 0  # how many of _order live in the flat buffers
        #: the flat buffers of every param's values and gradients (None until packed)
        self.data = None
        self.diff = None

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __repr__(self) -> str:
        values = sum(p.blob.count for p in self._order)
        names = [p.name for p in self._order[:4]] + (["..."] if len(self._order) > 4 else [])
        kind = f", {self._order[0].blob.dtype}" if self._order else ""
        return (f"ParamStore({len(self._order)} params, {values:,} values{kind}, "
                f"{'packed' if self.packed else 'not packed'}: {', '.join(names)})")

    def __getitem__(self, name: str) -> LearnableParam:
        return self._by_name[name]

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self):
        return iter(self._order)

    def add(self, param: LearnableParam, named: bool = True) -> None:
        if named:
            self._by_name[param.name] = param
        self._order.append(param)

    def alias(self, view: Blob, param: LearnableParam) -> None:
        """Record ``view``, a reshaped view of ``param``'s arrays, so that packing rebinds it."""
        self._aliases.append((view, param))

    @property
    def packed(self) -> bool:
        """True when every param lives in the flat buffers."""
        return self.data is not None and self._packed == len(self._order)

    def pack(self) -> bool:
        """Move every param into the flat buffers; True if the buffers were (re)allocated.

        Holders of views of the old buffers (a solver's history) must re-derive
        them when this returns True. Every param must share one device and dtype.
        """
        if self.packed or not self._order:
            return False
        first = self._order[0].blob
        for p in self._order:
            if p.blob.xp is not first.xp or p.blob.dtype != first.dtype:
                raise TypeError(
                    f"param '{p.name}' is {p.blob.dtype} on {device_of(p.blob.xp)}, but param "
                    f"'{self._order[0].name}' is {first.dtype} on {device_of(first.xp)}: the "
                    f"params of one store must share a dtype and a device"
                )
        total = sum(p.blob.count for p in self._order)
        data = first.xp.empty(total, first.dtype)
        diff = first.xp.empty(total, first.dtype)
        offset = 0
        for p in self._order:
            blob, end = p.blob, offset + p.blob.count
            data[offset:end] = blob.data.reshape(-1)
            diff[offset:end] = blob.diff.reshape(-1)
            blob.data = data[offset:end].reshape(blob.shape)
            blob.diff = diff[offset:end].reshape(blob.shape)
            p.offset, offset = offset, end
        for view, p in self._aliases:
            shape = view.data.shape
            view.data, view.diff = p.blob.data.reshape(shape), p.blob.diff.reshape(shape)
        self.data, self.diff = data, diff
        self._packed = len(self._order)
        return True

    def clear_diffs(self) -> None:
        """Zero every param's diff: one fill of the flat buffer once packed."""
        if self.packed:
            self.diff.fill(0)
            return
        for p in self._order:
            p.blob.diff.fill(0)

    @property
    def nbytes(self) -> int:
        """Bytes held by the owners' data and diff (one copy each, however shared)."""
        return sum(p.blob.data.nbytes + p.blob.diff.nbytes for p in self._order)
