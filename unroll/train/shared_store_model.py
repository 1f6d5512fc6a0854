"""SharedStoreModel: what a model of several nets over one parameter store does the same
whichever net a batch takes (BucketedModel's lengths, TreeModel's level widths)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from unroll.core.atomic import write_atomic
from unroll.engine.net import Net

__all__ = ["SharedStoreModel"]


class SharedStoreModel(ABC):
    """The part of a :class:`~unroll.train.solver.TrainableNet` of several nets over ONE
    ParamStore (``store``) that does not depend on which net runs: the last forward's net
    (``active``) runs backward and holds the loss; the canonical net (the subclass's
    ``_canonical()``, whose layers hold every param) reads and writes the weights and
    names the workspace they all run in.

    >>> from unroll.train.bucketed_model import BucketedModel
    >>> from unroll import expand
    >>> model = BucketedModel(lambda T: expand("lstm", steps=T, batch=2, input_dim=3, hidden=4))
    >>> isinstance(model, SharedStoreModel), model.loss  # no forward yet
    (True, 0.0)
    """

    store: object
    active: Net | None

    @abstractmethod
    def _canonical(self) -> Net:
        """The net whose layers hold every param (each model says which of its nets)."""

    @property
    def workspace(self):
        """The workspace every net of this model (and of its twins over the store) runs in."""
        return self._canonical().workspace

    @property
    def learnable_params(self):
        """Every param of the store, once, whichever nets share it."""
        return list(self.store)

    @property
    def loss(self) -> float:
        """The last forward's loss, read back on first access (see :attr:`Net.loss`)."""
        return self.active.loss if self.active is not None else 0.0

    @property
    def device_loss(self):
        """The last forward's loss on the device, not read back (see :attr:`Net.device_loss`)."""
        return (self._canonical() if self.active is None else self.active).device_loss

    def backward(self) -> None:
        """Backward through the last forward's net (an error before any forward)."""
        if self.active is None:
            raise RuntimeError(f"{type(self).__name__}.backward before forward")
        self.active.backward()

    def clear_param_diffs(self) -> None:
        """Zero every param's diff (:meth:`ParamStore.clear_diffs`)."""
        self.store.clear_diffs()

    def to_proto(self):
        """The params as a Caffe NetParameter (.caffemodel), through the canonical net."""
        return self._canonical().to_proto()

    def copy_from(self, source, strict: bool = False) -> None:
        """Load params saved by :meth:`to_proto` / :meth:`save`; every net sees them."""
        self._canonical().copy_from(source, strict=strict)

    def save(self, path) -> None:
        """Write :meth:`to_proto` to ``path`` (a .caffemodel), atomically."""
        write_atomic(path, self.to_proto().SerializeToString())
