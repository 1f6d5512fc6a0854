"""BucketedModel: one unrolled net per sequence length, all over one parameter store."""

from __future__ import annotations

import numpy as np

from unroll.core.proto import NetParameter
from unroll.core.sizes import byte_size
from unroll.engine.layer import LAYERS
from unroll.engine.net import Net
from unroll.engine.param_store import ParamStore
from unroll.train.shared_store_model import SharedStoreModel

__all__ = ["BucketedModel"]


class BucketedModel(SharedStoreModel):
    """One unrolled net per sequence length, built on demand, all over ONE parameter store.

    ``make_net_param(T)`` returns the NetParameter unrolled to T steps (e.g.
    ``lambda T: unroll.expand("tagger", steps=T, ...)``). Every net is built
    over the same :class:`~unroll.engine.param_store.ParamStore`, so a param named
    "W" is one data and one diff buffer whatever T runs, and a solver step
    updates every bucket's net at once.

    **Axes.** An input has a time axis, or none. The time axes are declared
    by the nets themselves: an axis whose size is the step count (the
    template's ``dim: {{ T }}``) in the nets unrolled to 1 and 2 steps, such
    as axis 0 of ``x``, ``cont`` and per-step labels, while a (1, N, H) state,
    an (N,) label or a tagger's (C, columns) characters have none. Callers
    may declare them too, ``time_axes={"words": 0, "lengths": None}``, which
    wins. T is read only from the time-major inputs given, which must agree
    on it; ``steps_from`` reads it from one input's axis 0. Given ``steps_from``
    or a declared time axis, the model builds only the nets of the T it is
    asked for (none at construction: a template need not unroll to one step),
    and the inputs it was not told about have no time axis. An input not
    given (an initial recurrent state) follows, axis by axis, the given
    inputs the net ties it to: a state's batch is its recurrence's cont's
    (through the Scale by cont, or the unit, that gates it), so a character
    model's states follow the character columns and a word model's the
    sentences, whatever their sizes.

    The model is a :class:`~unroll.train.solver.TrainableNet`, the interface the
    Solver drives. A test-phase model shares the
    training model's params, its workspace and its unrolled NetParameters with
    ``BucketedModel(make, phase="test", store=train.store,
    net_params=train.net_params)``: ``net_params`` is a dict T -> NetParameter
    that both fill and read, so each T is expanded once for both phases. All
    nets over one store run in one workspace (:mod:`unroll.engine.workspace`), sized
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
    >>> model.time_axes
    {'x': 0, 'cont': 0, 'h_0': None}
    """

    def __init__(self, make_net_param, phase="train", device="cpu", dtype="float32", seed=0,
                 store=None, steps_from=None, net_params=None, plan_memory=True,
                 max_bytes=None, time_axes=None, memory_budget=None):
        self.make_net_param = make_net_param
        self.steps_from = steps_from
        self._declared_time_axes = dict(time_axes or {})
        self._built: dict[int, dict] = {}  # T -> input shapes as built
        #: T -> {input: {axis: [(input, axis) the net ties it to]}}
        self._ties: dict[int, dict] = {}
        self.phase = phase
        self.device = device
        self.dtype = dtype
        self._seed = seed
        self.plan_memory = plan_memory
        self.max_bytes = max_bytes  # each net's memory limit (Net's max_bytes)
        # each net's (Net's memory_budget), refused here rather than when a net is first built
        self.memory_budget = memory_budget if memory_budget is None else byte_size(
            memory_budget, "memory_budget")
        self.store = store if store is not None else ParamStore()
        #: T -> the unrolled NetParameter, serialized (a few dozen bytes a layer, where the
        #: parsed message costs ~2 KB); pass it to a twin model to expand each T once
        self.net_params: dict[int, bytes] = net_params if net_params is not None else {}
        self.nets: dict[int, Net] = {}
        self.active: Net | None = None
        #: T is set by steps_from or by a declared time axis: the nets at T = 1 and 2 are
        #: not needed to find the time axes, so only the T asked for are built (a template
        #: may not unroll to one step)
        self.builds_only_asked = steps_from is not None or any(
            axis is not None for axis in self._declared_time_axes.values())
        self._axes: dict | None = None
        if not self.builds_only_asked:
            # the T = 1 net creates every param now, so learnable_params is complete
            # before the first batch (a solver sizes its history from it)
            self._canonical()
            self._axes = self._time_axes()

    @property
    def time_axes(self) -> dict:
        """Each input's time axis (None: it has none), declared or read off the nets; when
        only the T asked for are built, the declared ones until the first net is built."""
        return self._axes if self._axes is not None else dict(self._declared_time_axes)

    def net(self, steps: int) -> Net:
        """The net unrolled to ``steps``, built on first use and cached."""
        steps = int(steps)
        if steps not in self.nets:
            # the params are filled from seed + 1 whichever T creates them (as the T = 1
            # net always did), so ranks that build their first nets at different T agree
            net = Net(
                self._net_param(steps), phase=self.phase, device=self.device,
                dtype=self.dtype, seed=self._seed + 1, param_store=self.store,
                plan_memory=self.plan_memory, max_bytes=self.max_bytes,
                memory_budget=self.memory_budget,
            )
            net.seed(self._seed + steps)
            self._built[steps] = {name: net.blobs[f"{name}@0"].shape for name in net.inputs}
            self._ties[steps] = _input_ties(self._net_param(steps), net)
            self.nets[steps] = net
            if self._axes is None:
                self._axes = self._time_axes(steps)
        return self.nets[steps]

    def _net_param(self, steps: int) -> NetParameter:
        if steps not in self.net_params:
            self.net_params[steps] = self.make_net_param(steps).SerializeToString()
        return NetParameter.FromString(self.net_params[steps])

    def _time_axes(self, steps: int = 1) -> dict:
        """Each input's time axis, read off the first net built (``steps``): declared, else
        the axis whose size is T at T = 1 and 2 (when only the T asked for are built, or all
        are declared, only those declared)."""
        inputs = self._built[steps]
        unknown = sorted(set(self._declared_time_axes) - set(inputs))
        if unknown:
            raise ValueError(f"time_axes names {unknown}, which are not inputs of the net; "
                             f"inputs: {list(inputs)}")
        if self.builds_only_asked or set(self._declared_time_axes) >= set(inputs):
            return {name: self._declared_time_axes.get(name) for name in inputs}
        two = {lp.top[k]: tuple(shape.dim) for lp in self._net_param(2).layer
               if lp.type == "Input" for k, shape in enumerate(lp.input_param.shape)}
        axes = {}
        for name, one in self._built[1].items():
            if name in self._declared_time_axes:
                axes[name] = self._declared_time_axes[name]
                continue
            found = [a for a, n in enumerate(one)
                     if n == 1 and name in two and len(two[name]) == len(one) and two[name][a] == 2]
            axes[name] = found[0] if len(found) == 1 else None
        return axes

    def seed(self, seed: int) -> None:
        """Reseed run-time randomness (Dropout): net T draws from ``seed + T``, built or not."""
        self._seed = int(seed)
        for steps, net in self.nets.items():
            net.seed(self._seed + steps)

    def __repr__(self) -> str:
        values = sum(p.blob.count for p in self.store)
        return (f"BucketedModel(phase={self.phase!r}, nets for T={sorted(self.nets)}, "
                f"{len(self.store)} learnable params ({values:,} values), "
                f"{self.dtype} on {self.device})")

    def forward(self, blobs=(), **inputs) -> dict:
        """Run the net whose T is the time axis of the time-major inputs (axis 0 of
        ``steps_from``); returns its outputs and the blobs named in ``blobs`` (kept from now
        on, as :meth:`Net.forward` does).

        An input not given (an initial recurrent state, say) takes, on each axis
        the net ties to a given input (see the class), that input's size.
        """
        if not inputs:
            raise ValueError("BucketedModel.forward needs its inputs: forward(x=..., cont=...)")
        shapes = {name: np.shape(v) for name, v in inputs.items()}
        self._check_known(shapes)
        net_steps = self._steps(shapes)
        net = self.net(net_steps)
        self._check_known(shapes)
        built, ties = self._built[net_steps], self._ties[net_steps]
        for name in net.inputs:
            if name in inputs:
                continue
            shape = list(built[name])
            for axis, tied in ties.get(name, {}).items():
                sizes = {shapes[other][b] for other, b in tied
                         if other in shapes and b < len(shapes[other])}
                if len(sizes) > 1:
                    given = {other: shapes[other] for other, _ in tied if other in shapes}
                    raise ValueError(f"input '{name}' (not given) follows axis {axis} of "
                                     f"inputs that disagree on its size: {given}")
                if sizes:
                    shape[axis] = sizes.pop()
            net.blobs[f"{name}@0"].reshape(tuple(shape))
        self.active = net
        return net.forward(blobs=blobs, **inputs)

    def _check_known(self, shapes: dict) -> None:
        """Every input given is one of the net's (once a net is built, its inputs are known)."""
        if self._axes is None:
            return
        unknown = sorted(set(shapes) - set(self._axes))
        if unknown:
            raise ValueError(f"'{unknown[0]}' is not an input of the net; inputs: "
                             f"{list(self._axes)}")

    def _steps(self, shapes: dict) -> int:
        """T: the time axis of the time-major inputs given (or axis 0 of ``steps_from``)."""
        if self.steps_from is not None:
            if self.steps_from not in shapes:
                raise ValueError(f"forward needs input '{self.steps_from}' (it sets T)")
            return int(shapes[self.steps_from][0])
        timed = {name: shapes[name][axis] for name, axis in self.time_axes.items()
                 if axis is not None and name in shapes and axis < len(shapes[name])}
        if not timed:
            major = [name for name, axis in self.time_axes.items() if axis is not None]
            raise ValueError(
                f"forward needs a time-major input to read T from (time-major: {major}; "
                f"given: {list(shapes)}); give one, or declare which axis of a given input "
                f"is T: BucketedModel(..., time_axes={{'name': axis}})")
        if len(set(timed.values())) != 1:
            axes = {name: self.time_axes[name] for name in timed}
            raise ValueError(
                f"the time-major inputs disagree on T: {timed} (their time axes {axes}, "
                f"shapes {dict((n, shapes[n]) for n in timed)}); an input that has no time "
                f"axis, or another one, is declared with BucketedModel(..., "
                f"time_axes={{'{next(iter(timed))}': None}}), or T read from one input with "
                f"steps_from='{next(iter(timed))}'")
        return int(next(iter(timed.values())))

    def _canonical(self) -> Net:
        # every bucket's net holds every param, but layer names carry t: files are
        # written and read through the T = 1 net, so any model loads them (step 0's layers
        # are in every net); a model that builds only the T asked for uses its shortest
        if not self.builds_only_asked:
            return self.net(1)
        if not self.nets:
            raise RuntimeError(
                "BucketedModel: no net is built yet (given steps_from or a time axis, it "
                "builds only the T it is asked for); run a forward first, or build one with "
                "model.net(T)")
        return self.nets[min(self.nets)]

    @property
    def param_nbytes(self) -> int:
        """Bytes of learnable memory: one data and one diff per param, for all buckets together."""
        return self.store.nbytes


# -- which axes of an input the net ties to which of another -------------------------------

def _input_ties(net_param: NetParameter, net: Net) -> dict:
    """{input: {axis: [(other input, its axis), ...]}}: the axes of other inputs that the
    layers of ``net_param`` force to the same size, through the layers that declare
    ``same_shape`` (every axis of every bottom and top), Slice and
    Concat (but their axis), Scale and Bias (the second bottom along the first from
    ``axis``) and the recurrent units (every leading axis)."""
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def tie(a, b):
        parent[find(a)] = find(b)

    def ndim(blob):
        return net.blobs[blob].ndim if blob in net.blobs else 0

    for lp in net_param.layer:
        blobs = [*lp.bottom, *lp.top]
        if getattr(LAYERS.get(lp.type), "same_shape", False):
            for other in blobs[1:]:
                for k in range(min(ndim(blobs[0]), ndim(other))):
                    tie((blobs[0], k), (other, k))
        elif lp.type in ("Slice", "Concat"):
            field = lp.slice_param if lp.type == "Slice" else lp.concat_param
            for other in blobs[1:]:
                n = ndim(other)
                axis = field.axis % n if n else 0
                for k in range(min(ndim(blobs[0]), n)):
                    if k != axis:
                        tie((blobs[0], k), (other, k))
        elif lp.type in ("Scale", "Bias") and lp.bottom:
            field = lp.scale_param if lp.type == "Scale" else lp.bias_param
            first, n = lp.bottom[0], ndim(lp.bottom[0])
            for top in lp.top:
                for k in range(min(n, ndim(top))):
                    tie((first, k), (top, k))
            if len(lp.bottom) > 1 and n:
                axis = field.axis % n
                for j in range(ndim(lp.bottom[1])):
                    tie((lp.bottom[1], j), (first, axis + j))
        elif getattr(LAYERS.get(lp.type), "roles", ()) and lp.bottom:
            lead = ndim(lp.bottom[-1])  # the recurrent units: cont is the state's leading axes
            for other in blobs:
                for k in range(min(lead, ndim(other))):
                    tie((lp.bottom[-1], k), (other, k))
    inputs = list(net.inputs)
    groups: dict = {}
    for name in inputs:
        for k in range(ndim(name)):
            groups.setdefault(find((name, k)), []).append((name, k))
    ties = {}
    for name in inputs:
        for k in range(ndim(name)):
            tied = [m for m in groups[find((name, k))] if m[0] != name]
            if tied:
                ties.setdefault(name, {})[k] = tied
    return ties
