"""A solver's history (Caffe's ``history_``): one flat buffer per slot, laid out as the store.

Each slot of an update rule (SGD's momentum, Adam's m and v) is one buffer the
size of the :class:`~unroll.engine.param_store.ParamStore`'s, so a param's
history is the view at its offset, and a span of adjacent params is one slice
(docs/design.md, Solver). Params may appear after the solver was made (a
bucketed model builds a length's net on first use): :meth:`SolverHistory.sync`
packs the store and gives them zero history; params vanishing or changing
order under the solver is an error.

>>> from unroll.engine.net import Net
>>> net = Net('''layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
...   layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
...           inner_product_param { num_output: 2 } }''')
>>> history = SolverHistory(net, slots=2)
>>> [p.name for p in history.sync()], [h.shape for h in history.arrays()]
(['ip.0', 'ip.1'], [(2, 3), (2,), (2, 3), (2,)])
"""

from __future__ import annotations

from unroll.engine.backend import module_of
from unroll.engine.param_store import LearnableParam
from unroll.train.solver_param import SolverError

__all__ = ["SolverHistory"]


class SolverHistory:
    """The history slots of ``net``'s learnable params, packed as ``net.store``."""

    def __init__(self, net, slots: int):
        self.net, self.slots = net, slots
        self.buffers: list = []  # per slot: one buffer laid out as the store's
        self._names: list[str] = []
        self._views: list[list] = []  # per learnable param: views of its history slots

    def sync(self) -> list[LearnableParam]:
        """The learnable params, packed, with zero history for any that appeared since."""
        params = list(self.net.learnable_params)
        if len(params) < len(self._names) or any(
            p.name != name for p, name in zip(params, self._names)
        ):
            raise SolverError(
                f"the net's learnable params changed under the solver: it had "
                f"{self._names}, now has {[p.name for p in params]}"
            )
        if self.net.store.pack():
            self._grow()
        for p in params[len(self._views):]:
            if p.offset < 0:
                raise SolverError(
                    f"learnable param '{p.name}' is not in the net's store: a net must keep "
                    f"every learnable param in its ParamStore"
                )
            self._names.append(p.name)
            self._views.append([])
        for p, views in zip(params, self._views):
            if not views:
                end = p.offset + p.blob.count
                views.extend(buffer[p.offset:end].reshape(p.blob.shape)
                             for buffer in self.buffers)
        return params

    def _grow(self) -> None:
        """Buffers for the store's new size: old values kept (packing only appends)."""
        data = self.net.store.data
        xp = module_of(data)
        grown = []
        for old in self.buffers or [None] * self.slots:
            new = xp.zeros(data.size, data.dtype)
            if old is not None:
                new[: old.size] = old
            grown.append(new)
        self.buffers = grown
        for views in self._views:
            views.clear()

    def arrays(self) -> list:
        """The history arrays in Caffe's order: slot 0 of every param, then slot 1 (Adam: m, v)."""
        self.sync()
        return [views[s] for s in range(self.slots) for views in self._views]
