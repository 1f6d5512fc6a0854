"""TreeModel: one tree net per level-widths bucket, all over one parameter store and workspace."""

from __future__ import annotations

import zlib

import numpy as np

from unroll.core.proto import NetParameter
from unroll.engine.net import Net
from unroll.engine.param_store import ParamStore
from unroll.frontend.checked_nets import checked_nets
from unroll.train.shared_store_model import SharedStoreModel

__all__ = ["TreeModel"]


class TreeModel(SharedStoreModel):
    """Tree nets built on demand per key (level widths), sharing ONE ParamStore and workspace.

    ``make_net_param(key)`` returns the NetParameter of a key (e.g. ``lambda w:
    expand_tree("child_sum_tree_lstm", w, ...)``); ``canonical`` is the key of
    the net built first, which creates every param (so a solver sees them all)
    and through which weights are saved and loaded. ``forward(widths=key,
    **inputs)`` runs the key's net (:class:`~unroll.train.tree_sampler.TreeBucketSampler`
    gives each batch's key) on inputs with the rows that net declares (``x``: one a
    node); other rows are refused, since a net would take them and read only some.
    Like :class:`~unroll.train.bucketed_model.BucketedModel` it is a
    :class:`~unroll.train.solver.TrainableNet`; a test-phase twin shares the store with
    ``TreeModel(make, canonical, phase="test", store=train.store)``.

    >>> from unroll.frontend.tree_unroller import expand_tree
    >>> import numpy as np
    >>> make = lambda w: expand_tree("nary_tree_lstm", w, input_dim=2, hidden=3)
    >>> model = TreeModel(make, canonical=(1,))
    >>> model.forward(widths=(2, 1), x=np.ones((3, 2)))["h"].shape
    (3, 3)
    >>> sorted(model.nets), len(model.learnable_params)
    ([(1,), (2, 1)], 6)
    """

    def __init__(self, make_net_param, canonical, phase: str = "train", device: str = "cpu",
                 dtype="float32", seed: int = 0, store: ParamStore | None = None,
                 plan_memory: bool = True):
        self.make_net_param = make_net_param
        self.phase, self.device, self.dtype, self.plan_memory = phase, device, dtype, plan_memory
        self._seed = int(seed)
        self.store = store if store is not None else ParamStore()
        self.nets: dict = {}
        #: key -> {input: the rows its net declares} (a tree net's structure fixes them)
        self._rows: dict = {}
        self.canonical_key = canonical
        self.active: Net | None = None
        self.net(canonical)

    def net(self, key) -> Net:
        """The net of ``key``, built on first use and cached."""
        if key not in self.nets:
            def build(net_param):
                return Net(net_param, phase=self.phase, device=self.device, dtype=self.dtype,
                           seed=self._net_seed(key), param_store=self.store,
                           plan_memory=self.plan_memory)

            # the net expand builds to check itself is this one: a deep tree's is built once
            with checked_nets(build) as checked:
                param = self.make_net_param(key)
            net = checked.take(param)
            if net is None:  # expanded from the cache, or not by expand
                net = build(NetParameter.FromString(param.SerializeToString()))
            self.nets[key] = net
            self._rows[key] = {name: net.blobs[name].shape[0] for name in net.inputs
                               if net.blobs[name].ndim}
        return self.nets[key]

    def _net_seed(self, key) -> int:
        # from the key, not the build order, so that a run that builds its nets in another
        # order (a resumed one) draws the same masks
        entropy = [self._seed, zlib.crc32(repr(key).encode())]
        return int(np.random.SeedSequence(entropy).generate_state(1)[0])

    def _canonical(self) -> Net:
        return self.nets[self.canonical_key]

    def seed(self, seed: int) -> None:
        """Reseed run-time randomness (Dropout): the net of each key draws from a stream of
        (``seed``, key) alone, built or not."""
        self._seed = int(seed)
        for key, net in self.nets.items():
            net.seed(self._net_seed(key))

    def forward(self, widths=None, blobs=(), **inputs) -> dict:
        """Run the net of key ``widths`` on ``inputs``; returns its outputs."""
        if widths is None:
            raise ValueError("TreeModel.forward needs widths= (the batch's key, "
                             "TreeBucketSampler.key(batch))")
        self.active = self.net(widths)
        rows = self._rows[widths]
        for name, value in inputs.items():
            # a net reshapes to what it is given, and the tree's gathers would then read
            # only the first rows of a longer x: a tree net's inputs have its node count
            found = np.shape(value)[:1]
            if name in rows and found != (rows[name],):
                per_node = " (one per node)" if rows[name] == np.sum(widths) else ""
                raise ValueError(f"the tree net of widths {widths}: input '{name}' must have "
                                 f"{rows[name]} rows{per_node}, found "
                                 f"{found[0] if found else 'a scalar'}")
        return self.active.forward(blobs=blobs, **inputs)

    def __repr__(self) -> str:
        return (f"TreeModel(phase={self.phase!r}, {len(self.nets)} nets, "
                f"{len(self.store)} learnable params, {self.dtype} on {self.device})")
