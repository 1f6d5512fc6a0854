"""BucketedModel: one unrolled net per sequence length, all over one parameter store."""

from __future__ import annotations

import numpy as np

from unroll.atomic import write_atomic
from unroll.net import Net
from unroll.param_store import ParamStore
from unroll.proto import NetParameter

__all__ = ["BucketedModel"]


class BucketedModel:
    """One unrolled net per sequence length, built on demand, all over ONE parameter store.

    ``make_net_param(T)`` returns the NetParameter unrolled to T steps (e.g.
    ``lambda T: unroll.expand("tagger", steps=T, ...)``). Every net is built
    over the same :class:`~unroll.param_store.ParamStore`, so a param named
    "W" is one data and one diff buffer whatever T runs, and a solver step
    updates every bucket's net at once. Inputs are time-major: axis 0 is T
    (it picks the net), axis 1 the batch (inputs not given, such as initial
    recurrent states, follow the batch size of those given). ``steps_from``
    names the input whose axis 0 is T when inputs differ there (a tagger's
    words (T, N) beside its characters (C, T * N)).

    The model is a :class:`~unroll.solver.TrainableNet`, the interface the
    Solver drives. A test-phase model shares the
    training model's params, its workspace and its unrolled NetParameters with
    ``BucketedModel(make, phase="test", store=train.store,
    net_params=train.net_params)``: ``net_params`` is a dict T -> NetParameter
    that both fill and read, so each T is expanded once for both phases. All
    nets over one store run in one workspace (:mod:`unroll.workspace`), sized
    by the largest net that has run.

    >>> import unroll, numpy as np
    >>> make = lambda T: unroll.expand("rnn", steps=T, batch=2, input_dim=3, hidden=4)
    >>> model = BucketedModel(make)
    >>> model.forward(x=np.zeros((5, 2, 3)), cont=np.zeros((5, 2)))["h"].shape
    (5, 2, 4)
    >>> model.forward(x=np.zeros((9, 2, 3)), cont=np.zeros((9, 2)))["h"].shape
    (9, 2, 4)
    >>> len(model.learnable_params), sorted(model.nets)
    (3, [1, 5, 9])
    """

    def __init__(self, make_net_param, phase="train", device="cpu", dtype="float32", seed=0,
                 store=None, steps_from=None, net_params=None, plan_memory=True,
                 max_bytes=None, memory_budget=None):
        self.make_net_param = make_net_param
        self.steps_from = steps_from
        self._built: dict[int, dict] = {}  # T -> input shapes as built
        self.phase = phase
        self.device = device
        self.dtype = dtype
        self._seed = seed
        self.plan_memory = plan_memory
        self.max_bytes = max_bytes  # each net's memory limit (Net's max_bytes)
        self.memory_budget = memory_budget  # each net's (Net's memory_budget)
        self.store = store if store is not None else ParamStore()
        #: T -> the unrolled NetParameter, serialized (a few dozen bytes a layer, where the
        #: parsed message costs ~2 KB); pass it to a twin model to expand each T once
        self.net_params: dict[int, bytes] = net_params if net_params is not None else {}
        self.nets: dict[int, Net] = {}
        self.active: Net | None = None
        # the T = 1 net creates every param now, so learnable_params is complete
        # before the first batch (a solver sizes its history from it)
        self._canonical()

    def net(self, steps: int) -> Net:
        """The net unrolled to ``steps``, built on first use and cached."""
        steps = int(steps)
        if steps not in self.nets:
            if steps not in self.net_params:
                self.net_params[steps] = self.make_net_param(steps).SerializeToString()
            net = Net(
                NetParameter.FromString(self.net_params[steps]), phase=self.phase,
                device=self.device,
                dtype=self.dtype, seed=self._seed + steps, param_store=self.store,
                plan_memory=self.plan_memory, max_bytes=self.max_bytes,
                memory_budget=self.memory_budget,
            )
            self._built[steps] = {name: net.blobs[f"{name}@0"].shape for name in net.inputs}
            self.nets[steps] = net
        return self.nets[steps]

    @property
    def workspace(self):
        """The workspace every net of this model (and of its twins over the store) runs in."""
        return self._canonical().workspace

    def seed(self, seed: int) -> None:
        """Reseed run-time randomness (Dropout): net T draws from ``seed + T``, built or not."""
        self._seed = int(seed)
        for steps, net in self.nets.items():
            net.seed(self._seed + steps)

    @property
    def learnable_params(self):
        return list(self.store)

    def __repr__(self) -> str:
        values = sum(p.blob.count for p in self.store)
        return (f"BucketedModel(phase={self.phase!r}, nets for T={sorted(self.nets)}, "
                f"{len(self.store)} learnable params ({values:,} values), "
                f"{self.dtype} on {self.device})")

    @property
    def loss(self) -> float:
        """The last forward's loss, read back on first access (see :attr:`Net.loss`)."""
        return self.active.loss if self.active is not None else 0.0

    @property
    def device_loss(self):
        """The last forward's loss on the device, not read back (see :attr:`Net.device_loss`)."""
        return self._canonical().device_loss if self.active is None else self.active.device_loss

    def forward(self, blobs=(), **inputs) -> dict:
        """Run the net whose T is axis 0 of the inputs (of ``steps_from``); returns its outputs
        and the blobs named in ``blobs`` (kept from now on, as :meth:`Net.forward` does).

        An input not given (an initial recurrent state, say) follows the batch
        size of the given inputs that had the same batch size (axis 1) when
        the net was built.
        """
        if not inputs:
            raise ValueError("BucketedModel.forward needs its inputs: forward(x=..., cont=...)")
        shapes = {name: np.shape(v) for name, v in inputs.items()}
        if self.steps_from is not None:
            if self.steps_from not in shapes:
                raise ValueError(f"forward needs input '{self.steps_from}' (it sets T)")
            steps = {shapes[self.steps_from][0]}
        else:
            steps = {s[0] for s in shapes.values() if len(s) >= 1}
        if len(steps) != 1:
            raise ValueError(f"inputs must agree on T (axis 0); found {shapes}")
        net_steps = int(steps.pop())
        net = self.net(net_steps)
        built = self._built[net_steps]
        batch = {}
        for name, shape in shapes.items():
            if name not in built:
                raise ValueError(f"'{name}' is not an input of the net; inputs: {net.inputs}")
            if len(shape) >= 2 and len(built[name]) >= 2:
                if batch.setdefault(built[name][1], shape[1]) != shape[1]:
                    raise ValueError(f"inputs built with one batch size now disagree: {shapes}")
        for name in net.inputs:
            shape = built[name]
            if name not in inputs and len(shape) >= 2 and shape[1] in batch:
                net.blobs[f"{name}@0"].reshape((shape[0], batch[shape[1]]) + shape[2:])
        self.active = net
        return net.forward(blobs=blobs, **inputs)

    def backward(self) -> None:
        if self.active is None:
            raise RuntimeError("BucketedModel.backward before forward")
        self.active.backward()

    def clear_param_diffs(self) -> None:
        """Zero every param's diff: one fill of the store's flat buffer once it is packed."""
        if self.store.packed:
            self.store.diff.fill(0)
            return
        for p in self.store:
            p.blob.diff.fill(0)

    def _canonical(self) -> Net:
        # every bucket's net holds every param, but layer names carry t: files are
        # always written and read through the T = 1 net, so any model loads them
        return self.net(1)

    def to_proto(self):
        """The params as a Caffe NetParameter (.caffemodel) of the net unrolled to T = 1."""
        return self._canonical().to_proto()

    def copy_from(self, source, strict: bool = False) -> None:
        """Load params saved by :meth:`to_proto` / :meth:`save`; every bucket sees them."""
        self._canonical().copy_from(source, strict=strict)

    def save(self, path) -> None:
        write_atomic(path, self.to_proto().SerializeToString())

    @property
    def param_nbytes(self) -> int:
        """Bytes of learnable memory: one data and one diff per param, for all buckets together."""
        return self.store.nbytes
