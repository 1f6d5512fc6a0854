"""Net: a Caffe NetParameter built into layers and blobs, run forward and backward.

Caffe's semantics, deliberately: a bottom names the most recent top of that
name above it; a blob read by several layers gets a split so that each reader
has its own diff; a top named like its bottom runs in place when that is safe;
``param { name: "W" }`` shares one weight between every layer that names it
(the first owns it, the others point at its data and diff), so backward
accumulates the gradient of every timestep of an unrolled net into one blob.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from unroll.atomic import write_atomic
from unroll.backend import get_array_module, make_rng, to_numpy
from unroll.blob import Blob
from unroll.errors import FileFormatError, NetError
from unroll.fillers import fill
from unroll.host_checks import check_host_input, input_readers
from unroll.layer import layer_class
from unroll.param_store import LearnableParam, ParamStore
from unroll.proto import (
    TRAIN,
    LayerParameter,
    NetParameter,
    ParamSpec,
    array_from_blob_proto,
    blob_proto_from_array,
    read_binary,
    read_message,
)

PHASES = {"train": TRAIN, "test": 1}


@dataclass
class _Value:
    """One version of a named blob: what produced it and who reads it."""

    name: str
    version: int
    producer: int  # layer index; -1 for none
    top_index: int
    consumers: list = field(default_factory=list)  # (layer index, bottom index)
    blob: Blob | None = None


def _layer_failure(layer, what: str, error: Exception, bottoms) -> NetError:
    """A layer's unexpected exception as a NetError naming the layer and its bottoms."""
    shapes = ", ".join(f"'{b.name}' {b.shape}" for b in bottoms) or "none"
    return NetError(f"layer '{layer.name}' ({layer.type}) {what}: {error}; bottoms: {shapes}")


class BlobTable(Mapping):
    """``net.blobs``: a name gives its latest version (as in pycaffe), ``"name@k"`` version k.

    Versions come from in-place layers: ``bn`` written by BatchNorm is
    ``bn@0``; an in-place ReLU on it makes ``bn@1``, which ``bn`` now means.
    Versions share memory unless the net had to keep them apart (``keep=``).
    """

    def __init__(self):
        self._latest: dict[str, Blob] = {}
        self._versions: dict[str, list[Blob]] = {}

    def _add(self, name: str, blob: Blob) -> None:
        self._latest[name] = blob
        self._versions.setdefault(name, []).append(blob)

    def __getitem__(self, key: str) -> Blob:
        if key in self._latest:
            return self._latest[key]
        name, sep, version = key.rpartition("@")
        if sep and name in self._versions and version.isdigit():
            versions = self._versions[name]
            if int(version) < len(versions):
                return versions[int(version)]
        raise KeyError(f"no blob named {key!r}")

    def __iter__(self):
        return iter(self._latest)

    def __len__(self) -> int:
        return len(self._latest)

    def versions(self, name: str) -> list[Blob]:
        """Every version of ``name``, first producer first."""
        return list(self._versions[name])


def _state_meets_rule(phase: int, level: int, stages: set, rule) -> bool:
    if rule.HasField("phase") and rule.phase != phase:
        return False
    if rule.HasField("min_level") and level < rule.min_level:
        return False
    if rule.HasField("max_level") and level > rule.max_level:
        return False
    if any(s not in stages for s in rule.stage):
        return False
    return not any(s in stages for s in rule.not_stage)


def filter_layers(net_param: NetParameter, phase: int) -> list[LayerParameter]:
    """The layers of ``net_param`` included in ``phase`` (Caffe's FilterNet)."""
    level = net_param.state.level
    stages = set(net_param.state.stage)
    kept = []
    for lp in net_param.layer:
        if lp.include and lp.exclude:
            raise NetError(f"layer '{lp.name}': specify include or exclude rules, not both")
        if lp.include:
            ok = any(_state_meets_rule(phase, level, stages, r) for r in lp.include)
        else:
            ok = not any(_state_meets_rule(phase, level, stages, r) for r in lp.exclude)
        if ok:
            kept.append(lp)
    return kept


def _legacy_inputs(net_param: NetParameter) -> list[LayerParameter]:
    """NetParameter.input / input_shape / input_dim as one Input layer (as Caffe upgrades)."""
    if not net_param.input:
        return []
    lp = LayerParameter(name="input", type="Input", top=list(net_param.input))
    if net_param.input_shape:
        for s in net_param.input_shape:
            lp.input_param.shape.add().CopyFrom(s)
    elif net_param.input_dim:
        dims = list(net_param.input_dim)
        if len(dims) != 4 * len(net_param.input):
            raise NetError(f"input_dim must give 4 dims per input, found {len(dims)}")
        for i in range(len(net_param.input)):
            lp.input_param.shape.add().dim.extend(dims[4 * i : 4 * i + 4])
    else:
        raise NetError("net inputs given without input_shape or input_dim")
    return [lp]


class Net:
    """A net built from a NetParameter, run with Caffe's semantics.

    ``source`` is a NetParameter, a path to a prototxt file or prototxt text.
    ``keep`` names blobs that in-place layers must not overwrite. Nets built
    over one ``param_store`` share every named param (bucketed models).

    >>> net = Net('''
    ...   layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
    ...   layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
    ...           param { name: "W" } inner_product_param { num_output: 4 } }''')
    >>> net.forward()["y"].shape
    (2, 4)
    >>> [p.name for p in net.learnable_params]
    ['W', 'ip.1']
    """

    def __init__(
        self,
        source,
        phase: str = "train",
        device: str = "cpu",
        dtype="float32",
        keep=(),
        seed: int = 0,
        param_store: ParamStore | None = None,
        allow_python_layers: bool = False,
    ):
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {list(PHASES)}, found {phase!r}")
        self.net_param = read_message(source, NetParameter)
        self.name = self.net_param.name
        self.phase = phase
        self.device = device
        self.xp = get_array_module(device)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f":
            raise ValueError(f"dtype must be a float type (float32, float64), found {dtype!r}")
        self.allow_python_layers = allow_python_layers  # see layer_class: imports run code
        self.keep = set(keep)
        self._host_rng = np.random.default_rng(seed)
        self._rng = make_rng(self.xp, seed)
        self._shared_store = param_store is not None
        self.store = param_store if param_store is not None else ParamStore()
        self.learnable_params: list[LearnableParam] = []
        self._first_holders: set[tuple[str, int]] = set()  # (layer, index) first to hold a param
        self._loss: float | None = 0.0  # read back on first access (see loss)
        self._device_loss = None
        self._borrowed: dict = {}  # input name -> the caller's device array it holds
        self.in_place_fallbacks: list[str] = []
        self._build(_legacy_inputs(self.net_param) + filter_layers(self.net_param, PHASES[phase]))

    @classmethod
    def from_prototxt(cls, path_or_text, **kwargs) -> Net:
        """A Net from a prototxt path or text (same keywords as the constructor)."""
        return cls(read_message(path_or_text, NetParameter), **kwargs)

    # -- building -------------------------------------------------------------
    def _build(self, layer_params: list[LayerParameter]) -> None:
        names = [lp.name for lp in layer_params]
        for i, n in enumerate(names):
            if names.index(n) != i:
                raise NetError(f"two layers are named '{n}'; layer names must be unique")
        self.layers = [
            layer_class(lp, self.allow_python_layers)(
                lp, xp=self.xp, dtype=self.dtype, phase=self.phase, rng=self._rng,
                make_param=self._make_param)
            for lp in layer_params
        ]
        for layer, lp in zip(self.layers, layer_params):
            layer.check_counts(len(lp.bottom), len(lp.top))
        values, bottoms_of, tops_of = self._resolve_names(layer_params)
        self._allocate(values, bottoms_of, tops_of, layer_params)
        self._insert_splits(values, bottoms_of, tops_of, layer_params)
        for name in self.keep:
            if name not in self.blobs:
                raise NetError(f"keep names blob '{name}', which no layer produces")
        self.outputs = [v.name for v in values if not v.consumers]
        self._setup_layers()
        self._compute_need_backward()
        self._schedule()

    def _resolve_names(self, layer_params):
        """Bottoms to the latest version of their name; tops to new versions."""
        current: dict[str, _Value] = {}
        values: list[_Value] = []
        bottoms_of, tops_of = [], []
        for li, lp in enumerate(layer_params):
            bvals = []
            for bi, b in enumerate(lp.bottom):
                if b not in current:
                    raise NetError(
                        f"layer '{lp.name}' ({lp.type}): bottom '{b}' is not produced by any "
                        f"layer above it"
                    )
                current[b].consumers.append((li, bi))
                bvals.append(current[b])
            tvals = []
            for ti, t in enumerate(lp.top):
                in_place = ti < len(lp.bottom) and lp.bottom[ti] == t
                if t in current and not in_place:
                    raise NetError(
                        f"layer '{lp.name}' ({lp.type}): top '{t}' is already produced by layer "
                        f"'{layer_params[current[t].producer].name}'; a top may reuse a name "
                        f"only in place (as the same layer's bottom at the same position)"
                    )
                if t in (v.name for v in tvals):
                    raise NetError(f"layer '{lp.name}' ({lp.type}): top '{t}' is listed twice")
                version = current[t].version + 1 if in_place else 0
                v = _Value(t, version, li, ti)
                values.append(v)
                tvals.append(v)
            for v in tvals:
                current[v.name] = v
            bottoms_of.append(bvals)
            tops_of.append(tvals)
        return values, bottoms_of, tops_of

    def _allocate(self, values, bottoms_of, tops_of, layer_params) -> None:
        """A Blob per value; in-place values share their bottom's Blob when that is safe."""
        self.blobs = BlobTable()
        for v in values:
            lp = layer_params[v.producer]
            if v.version > 0:
                prev = bottoms_of[v.producer][v.top_index]
                reason = self._in_place_hazard(v.producer, prev, bottoms_of, layer_params)
                if reason is None:
                    v.blob = prev.blob
                else:
                    self.in_place_fallbacks.append(
                        f"layer '{lp.name}' writes '{v.name}' out of place: {reason}"
                    )
            if v.blob is None:
                v.blob = Blob((), self.xp, self.dtype, v.name)
            self.blobs._add(v.name, v.blob)

    def _in_place_hazard(self, li: int, prev: _Value, bottoms_of, layer_params) -> str | None:
        """Why layer ``li`` may not overwrite ``prev`` in place (None if it may).

        The write also lands in every value ``prev`` is a view of (a Reshape,
        Flatten or Split top shares its bottom's data), so those are checked too.
        """
        layer = self.layers[li]
        if not layer.in_place:
            raise NetError(
                f"layer '{layer.name}' ({layer.type}): cannot run in place (top '{prev.name}' "
                f"== bottom '{prev.name}'); {layer.type} needs a top of its own"
            )
        if "bottom" in layer.backward_reads:
            raise NetError(
                f"layer '{layer.name}' ({layer.type}): cannot run in place on '{prev.name}': "
                f"its backward reads its bottom, which the in-place write destroys"
            )
        value, reader, via = prev, li, ""
        while True:
            if value.name in self.keep:
                return f"keep=[{value.name!r}] asks to preserve it{via}"
            readers = [c for c, _ in value.consumers]
            readers.remove(reader)
            if readers:
                others = [layer_params[c].name for c in readers]
                return f"layer(s) {others} also read the value it would overwrite{via}"
            if value.producer < 0:
                return None
            producer = self.layers[value.producer]
            if "top" in producer.backward_reads:
                return (
                    f"the backward of its producer '{producer.name}' ({producer.type}) reads "
                    f"that top{via}"
                )
            if "data" not in producer.shares_bottom:
                return None
            # the value is a view of the producer's bottom: the write lands there as well
            reader, value = value.producer, bottoms_of[value.producer][0]
            via = f" (through '{producer.name}', a view of '{value.name}')"

    def _insert_splits(self, values, bottoms_of, tops_of, layer_params) -> None:
        """Give each reader of a multiply-read value its own diff (Caffe's InsertSplits).

        Sets the run order: every layer with its bottom and top blobs, each
        split right after the layer that produced the value it splits.
        """
        bottoms = [[v.blob for v in bvals] for bvals in bottoms_of]
        tops = [[v.blob for v in tvals] for tvals in tops_of]
        splits_after: dict[int, list] = {}
        for v in values:
            if len(v.consumers) < 2:
                continue
            base = f"{v.name}_{layer_params[v.producer].name}_{v.top_index}_split"
            split_tops = []
            for k, (li, bi) in enumerate(v.consumers):
                top = Blob((), self.xp, self.dtype, f"{base}_{k}")
                self.blobs._add(top.name, top)
                bottoms[li][bi] = top
                split_tops.append(top)
            lp = LayerParameter(name=base, type="Split", bottom=[v.name],
                                top=[t.name for t in split_tops])
            split = layer_class(lp)(lp, xp=self.xp, dtype=self.dtype, phase=self.phase)
            splits_after.setdefault(v.producer, []).append((split, [v.blob], split_tops))
        self.layers_run, self._bottoms, self._tops = [], [], []
        for li, layer in enumerate(self.layers):
            self.layers_run.append(layer)
            self._bottoms.append(bottoms[li])
            self._tops.append(tops[li])
            for split, b, t in splits_after.get(li, []):
                self.layers_run.append(split)
                self._bottoms.append(b)
                self._tops.append(t)

    # -- params and sharing ---------------------------------------------------
    def _make_param(self, layer, index: int, shape: tuple, filler) -> Blob:
        """Create, or share by name, param ``index`` of ``layer`` (Caffe's AppendParam)."""
        lp = layer.param
        spec = lp.param[index] if index < len(lp.param) else ParamSpec()
        learnable = layer.learnable
        lr_mult = spec.lr_mult if learnable else 0.0
        decay_mult = spec.decay_mult if learnable else 0.0
        if spec.name and spec.name in self.store:
            return self._share(layer, index, shape, spec, lr_mult, decay_mult)
        if not spec.name and self._shared_store and learnable:
            raise NetError(
                f"layer '{layer.name}' ({layer.type}): param {index} has no name; every param of "
                f"a net built over a shared parameter store must be named"
            )
        blob = Blob(shape, self.xp, self.dtype, spec.name or f"{layer.name}.{index}")
        if index < len(lp.blobs):
            value = array_from_blob_proto(lp.blobs[index])
            if value.shape != tuple(shape):
                raise NetError(
                    f"layer '{layer.name}' ({layer.type}): blobs {index} in the prototxt has "
                    f"shape {value.shape}, the layer expects {tuple(shape)}"
                )
        else:
            value = fill(filler, shape, self._host_rng, self.dtype)
        blob.data[...] = self.xp.asarray(value, self.dtype)
        param = LearnableParam(
            blob.name, blob, lr_mult, decay_mult, layer.name,
            has_lr_mult=spec.HasField("lr_mult"), has_decay_mult=spec.HasField("decay_mult"),
        )
        self.store.add(param, named=bool(spec.name))
        self.learnable_params.append(param)
        self._first_holders.add((layer.name, index))
        return blob

    def _share(self, layer, index, shape, spec, lr_mult, decay_mult) -> Blob:
        owner = self.store[spec.name]
        where = (
            f"cannot share param '{spec.name}' owned by layer '{owner.owner}' with layer "
            f"'{layer.name}'"
        )
        if spec.share_mode == ParamSpec.PERMISSIVE:
            if owner.blob.count != int(np.prod(shape)):
                raise NetError(
                    f"{where}: count mismatch; owner param shape is {owner.blob.shape} "
                    f"({owner.blob.count}), sharing layer expects {shape} ({int(np.prod(shape))})"
                )
        elif owner.blob.shape != tuple(shape):
            raise NetError(
                f"{where}: shape mismatch; owner param shape is {owner.blob.shape}, sharing layer "
                f"expects {shape} (use share_mode: PERMISSIVE to share by count)"
            )
        for what, has, value in (
            ("lr_mult", spec.HasField("lr_mult"), lr_mult),
            ("decay_mult", spec.HasField("decay_mult"), decay_mult),
        ):
            if not has:
                continue
            if getattr(owner, f"has_{what}") and getattr(owner, what) != value:
                raise NetError(
                    f"{where}: {what} mismatch; owner has {getattr(owner, what)}, sharing layer "
                    f"has {value}"
                )
            setattr(owner, what, value)
            setattr(owner, f"has_{what}", True)
        if owner not in self.learnable_params:
            self.learnable_params.append(owner)
            self._first_holders.add((layer.name, index))
        if owner.blob.shape == tuple(shape):
            return owner.blob
        view = Blob((), self.xp, self.dtype, owner.blob.name)
        view.data = owner.blob.data.reshape(shape)
        view.diff = owner.blob.diff.reshape(shape)
        self.store.alias(view, owner)
        return view

    @property
    def params(self) -> dict:
        """Layer name -> its param blobs (shared ones are the owner's memory), as pycaffe."""
        return {layer.name: layer.blobs for layer in self.layers if layer.blobs}

    # -- setup, need_backward, schedule -----------------------------------------
    def _setup_layers(self) -> None:
        for layer, bottoms, tops in zip(self.layers_run, self._bottoms, self._tops):
            try:
                layer.set_up(bottoms, tops)
            except NetError:
                raise
            except Exception as e:
                raise _layer_failure(layer, "cannot set up", e, bottoms) from e
        self._input_blobs = [t for layer, t in zip(self.layers_run, self._tops)
                             if layer.type == "Input" for t in t]
        self._input_shapes = [b.shape for b in self._input_blobs]

    def _loss_weights(self, layer) -> list[float]:
        n = len(layer.param.top)
        weights = list(layer.param.loss_weight)
        if weights and len(weights) != n:
            raise NetError(
                f"layer '{layer.name}' ({layer.type}): loss_weight gives {len(weights)} values "
                f"for {n} tops"
            )
        if not weights:
            weights = [1.0 if (layer.is_loss and i == 0) else 0.0 for i in range(n)]
        return weights

    def _compute_need_backward(self) -> None:
        force = self.net_param.force_backward
        need: dict[int, bool] = {}
        layer_need, bottom_need, loss_tops = [], [], []
        consumed = {id(b) for bottoms in self._bottoms for b in bottoms}
        for layer, bottoms, tops in zip(self.layers_run, self._bottoms, self._tops):
            pd = list(layer.param.propagate_down)
            if pd and len(pd) != len(bottoms):
                raise NetError(
                    f"layer '{layer.name}' ({layer.type}): propagate_down gives {len(pd)} values "
                    f"for {len(bottoms)} bottoms"
                )
            bneed = []
            for i, b in enumerate(bottoms):
                wanted = need.get(id(b), False) or (force and not pd)
                if pd:
                    wanted = pd[i] and (need.get(id(b), False) or force)
                bneed.append(bool(wanted) and layer.allow_force_backward(i))
            params_learn = any(self._lr_of(layer, k) != 0 for k in range(len(layer.blobs)))
            lneed = any(bneed) or params_learn or (force and bool(bottoms))
            for t in tops:
                need[id(t)] = lneed
            layer_need.append(lneed)
            bottom_need.append(bneed)
            if layer.type != "Split":
                for t, w in zip(tops, self._loss_weights(layer)):
                    if w == 0:
                        continue
                    if id(t) in consumed and t not in bottoms:
                        raise NetError(
                            f"layer '{layer.name}' ({layer.type}): top '{t.name}' has loss_weight "
                            f"{w} and is also read by another layer; give the reader its own copy"
                        )
                    loss_tops.append((t, float(w)))
        # Caffe: a layer whose tops reach no loss, or whose every top is refused by its
        # readers (propagate_down: false; Caffe's blobs_skip_backp), needs no backward
        under_loss = {id(t) for t, _ in loss_tops}
        refused = set()
        for i in reversed(range(len(self.layers_run))):
            tops, bottoms = self._tops[i], self._bottoms[i]
            skip = bool(tops) and all(id(t) in refused for t in tops)
            if any(id(t) in under_loss for t in tops) and not skip:
                under_loss.update(id(b) for b in bottoms)
            elif not force:
                layer_need[i] = False
                bottom_need[i] = [False] * len(bottoms)
            refused.update(id(b) for b, n in zip(bottoms, bottom_need[i]) if not n)
        self.layer_need_backward = layer_need
        self._bottom_need = bottom_need
        self._loss_tops = loss_tops

    def _lr_of(self, layer, k: int) -> float:
        spec = layer.param.param[k] if k < len(layer.param.param) else ParamSpec()
        return spec.lr_mult if layer.learnable else 0.0

    def _schedule(self) -> None:
        self._fwd = list(zip(self.layers_run, self._bottoms, self._tops))
        self._bwd = [
            (layer, tops, prop, bottoms)
            for layer, bottoms, tops, prop, need in zip(
                self.layers_run, self._bottoms, self._tops, self._bottom_need,
                self.layer_need_backward,
            )
            if need
        ][::-1]
        # run order, splits included (as pycaffe's): aligned with layer_need_backward
        self.layer_names = [layer.name for layer in self.layers_run]
        self.inputs = [b.name for b in self._input_blobs]

    # -- running ----------------------------------------------------------------
    def reshape(self) -> None:
        """Propagate new input shapes through every layer (allocates only what changed)."""
        for layer, bottoms, tops in self._fwd:
            try:
                layer.reshape(bottoms, tops)
            except NetError:
                raise
            except Exception as e:
                raise _layer_failure(layer, "cannot reshape", e, bottoms) from e
        self._input_shapes = [b.shape for b in self._input_blobs]

    def set_input(self, name: str, value) -> None:
        """Put ``value`` into input blob ``name``, reshaping it if needed.

        Host data is checked by the layers that read it (Embed ids, labels: see
        :mod:`unroll.host_checks`), then copied to the device. A device array of
        the net's dtype (a view of a batch packed into one transfer) becomes the
        blob's data without a copy; it is not checked, so check it on the host
        before it goes to the device.
        """
        if name not in self.inputs:
            raise NetError(f"'{name}' is not an input of this net; inputs: {self.inputs}")
        # the Input layer's own top: net.blobs[name] is the latest version, which an
        # in-place layer kept out of place (keep=, fan-out) writes, not the input
        blob = self._input_blobs[self.inputs.index(name)]
        if self.xp is np or not isinstance(value, self.xp.ndarray):
            value = np.asarray(value, self.dtype)
            check_host_input(self._input_readers, name, value)
        elif (value.dtype == self.dtype and value.flags.c_contiguous
              and len(self.blobs.versions(name)) == 1):  # no in-place layer writes into it
            if value.shape != blob.shape:
                blob.diff = None  # allocated again, in the new shape, when first used
            blob.data = self._borrowed[name] = value
            return
        if self._borrowed.pop(name, None) is blob.data:  # never write into the caller's array
            blob.data = self.xp.empty(blob.shape, self.dtype)
        blob.reshape(value.shape)
        blob.data[...] = value

    def check_inputs(self, **inputs) -> None:
        """Check host input values as :meth:`set_input` does, without setting them: for
        data that reaches the device another way (a batch packed into one transfer)."""
        for name, value in inputs.items():
            check_host_input(self._input_readers, name, np.asarray(value, self.dtype))

    @functools.cached_property
    def _input_readers(self) -> dict:
        return input_readers(self._fwd, self.inputs)

    def forward(self, **inputs) -> dict:
        """Run forward; returns {output blob name: data}. Keywords fill input blobs first."""
        for name, value in inputs.items():
            self.set_input(name, value)
        if [b.shape for b in self._input_blobs] != self._input_shapes:
            self.reshape()
        for layer, bottoms, tops in self._fwd:
            try:
                layer.forward(bottoms, tops)
            except NetError:
                raise
            except Exception as e:
                raise _layer_failure(layer, "failed in forward", e, bottoms) from e
        self._loss = self._device_loss = None
        return {name: self.blobs[name].data for name in self.outputs}

    @property
    def loss(self) -> float:
        """The last forward's loss: the sum of the loss tops times their loss weights.

        Read back from the device on the first access after a forward (one sync
        on a GPU), so a training step that nobody asks for its loss never waits.
        """
        if self._loss is None:
            self._loss = float(self.device_loss) if self._loss_tops else 0.0
        return self._loss

    @property
    def device_loss(self):
        """The last forward's loss as a 0-d float64 array on the net's device, not read back.

        >>> net = Net('''
        ...   layer { name: "in" type: "Input" top: "a" top: "b"
        ...           input_param { shape { dim: 2 dim: 1 } } }
        ...   layer { name: "l" type: "EuclideanLoss" bottom: "a" bottom: "b" top: "l" }''')
        >>> _ = net.forward(a=np.array([[1.0], [3.0]]), b=np.zeros((2, 1)))
        >>> net.device_loss.dtype, net.loss
        (dtype('float64'), 2.5)
        """
        if self._device_loss is None:
            xp = self.xp
            terms = [xp.multiply(blob.data.sum(), weight, dtype=xp.float64)
                     for blob, weight in self._loss_tops]
            self._device_loss = sum(terms[1:], terms[0]) if terms else xp.zeros((), xp.float64)
        return self._device_loss

    def backward(self) -> None:
        """Backpropagate the loss: writes blob diffs and ADDS into param diffs."""
        for blob, weight in self._loss_tops:
            blob.diff.fill(weight)
        for layer, tops, prop, bottoms in self._bwd:
            try:
                layer.backward(tops, prop, bottoms)
            except NetError:
                raise
            except Exception as e:
                raise _layer_failure(layer, "failed in backward", e, bottoms) from e

    def clear_param_diffs(self) -> None:
        """Zero every owner's diff (once per iteration; backward accumulates into them)."""
        for p in self.learnable_params:
            p.blob.diff.fill(0)

    # -- weights in Caffe's binary format -------------------------------------------
    def to_proto(self) -> NetParameter:
        """The net with its learned blobs, as Caffe writes a .caffemodel.

        Only the first layer of this net to hold each param is written; its
        sharers are left out (real Caffe skips absent layers when it loads,
        and their weights are that layer's), so the file does not grow with T.
        """
        out = NetParameter(name=self.name)
        for layer in self.layers:
            if not any((layer.name, k) in self._first_holders for k in range(len(layer.blobs))):
                continue
            lp = out.layer.add()
            lp.CopyFrom(layer.param)
            del lp.blobs[:]
            for blob in layer.blobs:
                lp.blobs.add().CopyFrom(blob_proto_from_array(to_numpy(blob.data)))
        return out

    def copy_from(self, source, strict: bool = False, allow_missing: bool = False) -> None:
        """Load weights from a NetParameter or a .caffemodel path, matching layers by name.

        Source layers that this net lacks are skipped, as Caffe does, unless
        ``strict``; a blob count or shape mismatch is a NetError. Every
        learnable param of this net must get a value, so that an empty or
        truncated file never leaves random weights in place; ``allow_missing``
        permits a partial load (fine-tuning from a net with fewer layers). A
        file that does not decode is a FileFormatError naming it.
        """
        origin = "the weights"
        if not isinstance(source, NetParameter):
            path = Path(source)
            origin = str(path)
            source = read_binary(path, NetParameter, ".caffemodel")
            if not any(lp.blobs for lp in source.layer):
                raise FileFormatError(path, "holds no weights (an empty or truncated .caffemodel?)")
        by_name = {layer.name: layer for layer in self.layers}
        loaded: set[str] = set()
        for lp in source.layer:
            if not lp.blobs:
                continue
            layer = by_name.get(lp.name)
            if layer is None:
                if strict:
                    raise NetError(f"{origin}: weights for layer '{lp.name}', which this net "
                                   f"does not have")
                continue
            if len(lp.blobs) != len(layer.blobs):
                raise NetError(
                    f"{origin}: layer '{lp.name}': the weights hold {len(lp.blobs)} blobs, the "
                    f"layer has {len(layer.blobs)}"
                )
            for k, (bp, blob) in enumerate(zip(lp.blobs, layer.blobs)):
                try:
                    value = array_from_blob_proto(bp)
                except ValueError as e:
                    raise NetError(f"{origin}: layer '{lp.name}' blob {k}: {e}") from None
                if value.shape != blob.shape:
                    raise NetError(
                        f"{origin}: layer '{lp.name}' blob {k}: the weights have shape "
                        f"{value.shape}, the layer has {blob.shape}"
                    )
                blob.data[...] = self.xp.asarray(value, self.dtype)
                loaded.add(blob.name)
        missing = [p.name for p in self.learnable_params if p.blob.name not in loaded]
        if missing and not allow_missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                              else "")
            raise NetError(f"{origin}: no weights for {len(missing)} of the net's "
                           f"{len(self.learnable_params)} learnable params ({shown}); pass "
                           f"allow_missing=True to load only some")

    def save(self, path) -> None:
        """Write the weights as a binary .caffemodel, atomically (temp file, then rename)."""
        write_atomic(path, self.to_proto().SerializeToString())
