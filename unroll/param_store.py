"""Named learnable parameters, owned once and shared by every layer that names them."""

from __future__ import annotations

from dataclasses import dataclass

from unroll.blob import Blob


@dataclass
class LearnableParam:
    """One owned parameter: its name, blob, multipliers, and the layer that owns it.

    ``name`` is the ``param { name: ... }`` of the prototxt, or
    ``"<layer>.<index>"`` for an unnamed (private) param.
    """

    name: str
    blob: Blob
    lr_mult: float = 1.0
    decay_mult: float = 1.0
    owner: str = ""
    index: int = 0
    has_lr_mult: bool = False
    has_decay_mult: bool = False


class ParamStore:
    """The owners of named params, shared by every net built over it.

    One store per model: all the unrolled nets of a bucketed model are built
    over the same store, so a param named "W" is one data and one diff buffer
    whichever net (bucket length) runs.

    >>> store = ParamStore()
    >>> "W" in store
    False
    """

    def __init__(self):
        self._by_name: dict[str, LearnableParam] = {}
        self._order: list[LearnableParam] = []

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

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

    @property
    def nbytes(self) -> int:
        """Bytes held by the owners' data and diff (one copy each, however shared)."""
        return sum(p.blob.data.nbytes + p.blob.diff.nbytes for p in self._order)
