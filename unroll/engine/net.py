"""Net: a Caffe NetParameter built into layers and blobs, run forward and backward.

:mod:`unroll.graph` applies Caffe's rules (name resolution, in-place rules,
splits, which layers run backward); :mod:`unroll.engine.memory` plans the
memory of that run order; ``Net`` builds the blobs and layers, applies the
layout (:mod:`unroll.engine.executor` binds it) and runs them. ``param { name: "W" }``
shares one weight between every layer that names it
(:mod:`unroll.engine.param_sharing`), so backward accumulates the gradient of every
timestep of an unrolled net into one blob.

Memory (docs/design.md, 6. Memory): params live in the :class:`ParamStore`; every
other buffer comes from the :class:`~unroll.engine.workspace.Workspace` of all nets
over that store, reused as the memory plan allows. After a run, inputs,
outputs, losses and ``keep=`` blobs are readable; reading another blob is an
error that names ``keep=``. A net whose plan needs more memory than
``max_bytes`` (by default, what the device has available) is refused before
anything of that size is allocated (:mod:`unroll.engine.memory_limit`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Mapping

import numpy as np

from unroll.core.errors import NetError
from unroll.core.proto import TEST, TRAIN, NetParameter, read_message
from unroll.core.sizes import byte_size
from unroll.engine import executor, memory, transfer, weights
from unroll.engine.backend import get_array_module, make_rng
from unroll.engine.blob import Blob
from unroll.engine.executor import layer_kind
from unroll.engine.host_checks import check_host_input, host_checks_of, input_readers
from unroll.engine.layer import layer_class
from unroll.engine.memory_limit import MemoryLimit, MemoryReport, memory_report
from unroll.engine.param_sharing import ParamMaker
from unroll.engine.param_store import ParamStore
from unroll.engine.workspace import Workspace, workspace_for
from unroll.graph import rules as graph

__all__ = ["BlobTable", "MemoryReport", "Net"]

PHASES = {"train": TRAIN, "test": TEST}


def _make_layer(param, allow_python: bool, **options):
    """The layer of LayerParameter ``param``; its constructor's failure is a NetError."""
    cls = layer_class(param, allow_python)
    try:
        return cls(param, **options)
    except NetError:
        raise
    except Exception as e:
        raise NetError(f"layer '{param.name}' ({layer_kind(param)}) cannot be made: "
                       f"{type(e).__name__}: {e}") from e


@contextlib.contextmanager
def _collector_paused():
    """The cyclic garbage collector off for a block, then as it was.

    A build makes ~100 objects per layer and frees none: the collector would
    rescan every live object of the process many times per net, for nothing
    (it took over half of the build time of a tagger's nets).
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class BlobTable(Mapping):
    """``net.blobs``: a name gives its latest version (as in pycaffe), ``"name@k"`` version k.

    Versions come from in-place layers: ``bn`` written by BatchNorm is
    ``bn@0``; an in-place ReLU on it makes ``bn@1``, which ``bn`` now means.
    Versions share memory unless the net had to keep them apart (``keep=``).
    """

    def __init__(self, blobs=()):
        self._latest: dict[str, Blob] = {}
        # only names written in place have several versions; most have one, their latest
        self._versions: dict[str, list[Blob]] = {}
        for name, blob in blobs:  # (name, blob) of every version, first producer first
            self._add(name, blob)

    def _add(self, name: str, blob: Blob) -> None:
        latest = self._latest.get(name)
        if latest is not None:
            self._versions.setdefault(name, [latest]).append(blob)
        self._latest[name] = blob

    def __getitem__(self, key: str) -> Blob:
        if key in self._latest:
            return self._latest[key]
        name, sep, version = key.rpartition("@")
        if sep and name in self._latest and version.isdigit():
            versions = self.versions(name)
            if int(version) < len(versions):
                return versions[int(version)]
        raise KeyError(f"no blob named {key!r}")

    def __iter__(self):
        return iter(self._latest)

    def __len__(self) -> int:
        return len(self._latest)

    def versions(self, name: str) -> list[Blob]:
        """Every version of ``name``, first producer first."""
        return list(self._versions.get(name) or [self._latest[name]])

    def __repr__(self) -> str:
        names = list(self._latest)
        shown = ", ".join(repr(n) for n in names[:6]) + (", ..." if len(names) > 6 else "")
        return f"BlobTable({len(names)} blobs: {shown})"


class _Gate:
    """Open while the net runs: a planned blob's memory is the net's only then."""

    __slots__ = ("open", "net")

    def __init__(self, net):
        self.open, self.net = False, net

    @contextlib.contextmanager
    def opened(self):
        """Open for a block (building, reshaping), then as it was."""
        was, self.open = self.open, True
        try:
            yield
        finally:
            self.open = was

    def closed_error(self, blob) -> NetError:
        return NetError(
            f"blob '{blob.name}' of net '{self.net.name}' is not kept: the memory plan reuses "
            f"its memory once its last reader has run; build the net with keep=['{blob.name}'] "
            f"(or forward(blobs=['{blob.name}'])) to read it after a run, or with "
            f"plan_memory=False to keep every blob"
        )


class Net:
    """A net built from a NetParameter, run with Caffe's semantics.

    ``source`` is a NetParameter, a path to a prototxt file or prototxt text.
    ``keep`` names blobs that stay readable after a run (and that in-place
    layers must not overwrite); so do inputs, outputs, losses and, in the test
    phase, the bottoms of losses and accuracies (the predictions). Nets built
    over one ``param_store`` share every named param and one workspace
    (bucketed models). ``plan_memory=False`` gives every blob memory of its
    own, as pycaffe does, for debugging. ``concurrent=True`` (CPU only) runs
    independent branches, such as the two directions of a bidirectional layer,
    on threads at once; results are bit-identical to the serial order, and the
    memory plan keeps every buffer of such a region live through all of it.
    ``max_bytes`` bounds the memory the net may plan (its params, kept blobs
    and workspace, as :meth:`memory_report` counts them; by default what the
    device has available): a net planning more is a NetError, naming its
    largest blobs and their layers, before any of them is allocated.
    ``memory_budget`` (bytes of activations, diffs, scratch and kept blobs but the inputs) has
    backward recompute segments of the forward, as few as fit, with the same
    results bit for bit: one level of Chen et al.'s segments, or in a chain of
    three weight-gradient chunks or more, for budgets one level cannot reach,
    Gruslys et al.'s BPTT-HSM over the chunks; a loss over the whole (T, N, ...) output
    then runs by chunks of time (:mod:`unroll.engine.memory.separable`: ``layer_names``
    show its pieces). ``recompute`` names a policy
    (:mod:`unroll.engine.memory.policy`): ``"sqrt"`` takes Chen's square-root
    segments, ``"hsm"`` BPTT-HSM (without a budget, in its fewest slots: the
    least memory), ``"none"`` never recomputes; or it is a policy of the
    user's own, such as ``Checkpoints(lambda k, n: k % 4 == 0)`` (a checkpoint
    where every fourth weight-gradient chunk starts).
    ``net.memory`` is the memory plan applied (:class:`unroll.engine.executor.NetMemory`):
    its ``liveness``, and its ``layout`` for the current shapes (None with
    ``plan_memory=False``), as :mod:`unroll.engine.memory` documents them.

    >>> net = Net('''
    ...   layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
    ...   layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
    ...           param { name: "W" } inner_product_param { num_output: 4 } }''')
    >>> net.forward()["y"].shape
    (2, 4)
    >>> [p.name for p in net.learnable_params]
    ['W', 'ip.1']
    """

    def __init__(self, source, phase: str = "train", device: str = "cpu", dtype="float32",
                 keep=(), seed: int = 0, param_store: ParamStore | None = None,
                 allow_python_layers: bool = False, plan_memory: bool = True,
                 workspace: Workspace | None = None, concurrent: bool = False,
                 max_bytes: int | None = None, memory_budget: int | str | None = None,
                 recompute: str | memory.Policy | None = None):
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {list(PHASES)}, found {phase!r}")
        net_param = read_message(source, NetParameter)
        self.name, self._force_backward = net_param.name, net_param.force_backward
        self.phase, self.device = phase, device
        self.xp = get_array_module(device)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f":
            raise ValueError(f"dtype must be a float type (float32, float64), found {dtype!r}")
        self.allow_python_layers = allow_python_layers  # see layer_class: imports run code
        self.keep, self._rng = set(keep), make_rng(self.xp, seed)
        self.store = param_store if param_store is not None else ParamStore()
        self.plan_memory = plan_memory
        # independent branches at once: CPU only (a GPU would need streams), see _build
        self.concurrent = concurrent and self.xp is np
        self.workspace = workspace if workspace is not None else workspace_for(self.store, self.xp)
        self.workspace.attach(self)
        self.max_bytes, self.recompute = max_bytes, recompute
        self.memory_budget = memory_budget if memory_budget is None else byte_size(
            memory_budget, "memory_budget")  # bytes, or a size string such as '500MB'
        self._limit = MemoryLimit(self.name, max_bytes, self.xp, self.store, self.workspace)
        self._params = ParamMaker(self.store, self.xp, self.dtype, np.random.default_rng(seed),
                                  param_store is not None, self._limit.check_param)
        self.learnable_params = self._params.learnable_params
        self._gate = _Gate(self)
        self._kept_blobs: set[int] = set()  # asked for by forward(blobs=...)
        self._loss, self._device_loss = 0.0, None  # read back on first access (see loss)
        self._borrowed: dict = {}  # input name -> the caller's device array it holds
        with _collector_paused():  # reading the layers' messages makes objects too
            layer_params = graph.legacy_inputs(net_param) + graph.filter_layers(
                net_param, PHASES[phase])
            if plan_memory and phase == "train" and executor.recomputes(
                    self.memory_budget, memory.policy_named(recompute)):
                # a budget can reach below a whole-output loss only by chunks of time
                layer_params = memory.separate_losses(layer_params, self.keep)
            with self._gate.opened():
                self._build(layer_params)
        # the parsed messages cost ~2 KB a layer (bucketed models keep many nets): from
        # now on the net and its layers keep them as bytes (see net_param, Layer.param)
        self._net_param_bytes = net_param.SerializeToString()
        self._compact_layers()

    @property
    def net_param(self) -> NetParameter:
        """The NetParameter the net was built from (parsed again from its bytes)."""
        return NetParameter.FromString(self._net_param_bytes)

    @property
    def bottom_need_backward(self) -> list[tuple[bool, ...]]:
        """Per layer in run order (as ``layer_names``), which bottoms get a diff: Caffe's
        ``Net::bottom_need_backward``. A layer reading an input has False there, unless
        ``force_backward``."""
        return list(self._bottom_need)

    def _compact_layers(self) -> None:
        for layer in self.layers_run:
            layer.compact()
        self.graph.layer_params = None  # the layers hold their own parameters

    # -- building -------------------------------------------------------------
    def _build(self, layer_params) -> None:
        self.layers = [
            _make_layer(lp, self.allow_python_layers, xp=self.xp, dtype=self.dtype,
                        phase=self.phase, rng=self._rng, make_param=self._params)
            for lp in layer_params
        ]
        for layer, lp in zip(self.layers, layer_params):
            layer.check_counts(len(lp.bottom), len(lp.top))
        g = self.graph = graph.build_graph(layer_params, self.layers, self.keep)
        self.in_place_fallbacks = g.in_place_fallbacks
        self._blob_list = [Blob((), self.xp, self.dtype, name) for name in g.names]
        self.blobs = BlobTable((g.names[b], self._blob_list[b]) for b in g.order)
        self.outputs = g.outputs
        splits = [layer_class(lp)(lp, xp=self.xp, dtype=self.dtype, phase=self.phase)
                  for lp in g.layer_params[len(layer_params):]]
        everyone = self.layers + splits
        self.layers_run = [everyone[step.layer] for step in g.steps]
        blob_list = self._blob_list
        bottoms = [tuple([blob_list[b] for b in step.bottoms]) for step in g.steps]
        tops = [tuple([blob_list[b] for b in step.tops]) for step in g.steps]
        self._fwd = list(zip(self.layers_run, bottoms, tops))
        executor.set_up(self._fwd, self._limit)
        self._input_blobs = [t for layer, _, tops in self._fwd if layer.type == "Input"
                             for t in tops]
        self._input_shapes = [b.shape for b in self._input_blobs]
        self.layer_need_backward, self._bottom_need, loss_tops = graph.backward_needs(
            g.steps, self.layers_run, self._force_backward)
        self._loss_tops = [(blob_list[b], w) for b, w in loss_tops]
        self._loss_blobs = [b for b, _ in loss_tops]
        self._bwd = [(s, layer, t, prop, b) for s, ((layer, b, t), prop, need) in enumerate(
            zip(self._fwd, self._bottom_need, self.layer_need_backward)) if need][::-1]
        self.regions = (memory.concurrent_regions(g.steps, self.layers_run)
                        if self.concurrent else [])
        self.memory = executor.NetMemory(blob_list, g, self.layers_run, self._bottom_need,
                                          self.workspace, self.dtype, self._limit, self._fwd,
                                          self._bwd, self.memory_budget, self.recompute,
                                          self.regions)
        # run order, splits included (as pycaffe's): aligned with layer_need_backward
        self.layer_names = [layer.name for layer in self.layers_run]
        self.inputs = [b.name for b in self._input_blobs]
        self._plan()

    def __repr__(self) -> str:
        values = sum(p.blob.count for p in self.learnable_params)
        return (f"Net({self.name!r}, phase={self.phase!r}, {len(self.layers)} layers, "
                f"{len(self.blobs)} blobs, {len(self.learnable_params)} learnable params "
                f"({values:,} values), {self.dtype} on {self.device}, inputs={self.inputs}, "
                f"outputs={list(self.outputs)})")

    # -- the memory plan: lifetimes from the graph, a layout per shapes -----------------
    def _plan(self) -> None:
        g = self.graph
        private = (set(range(len(self._blob_list))) if not self.plan_memory else
                   memory.private_blobs(g.steps, self.layers_run, g.table,
                                        set(self.outputs) | self.keep, self.phase,
                                        self._loss_blobs) | self._kept_blobs)
        # a test-phase net runs backward only when asked to (force_backward): inference
        # memory must not hold what only a backward would read
        self._plans_backward = self.phase == "train" or self._force_backward
        need = (self.layer_need_backward if self._plans_backward
                else [False] * len(self.layer_need_backward))
        self.memory.plan(functools.partial(
            memory.liveness, g.steps, self.layers_run, len(self._blob_list), private, need,
            self._bottom_need, self._loss_blobs, self.regions), self._gate)
        self._layout()

    def _layout(self) -> None:
        self.memory.lay_out(tuple(b.shape for b in self._input_blobs), self.plan_memory)

    def release_memory(self) -> None:
        """Drop every view of the workspace (it is about to move); the next run re-binds."""
        self.memory.release()

    @property
    def batched_param_gradients(self) -> dict[str, int]:
        """Params whose gradient backward computes in GEMMs over the rows of several
        layers sharing them (one per chunk of up to ``memory.GRADIENT_CHUNK``
        timesteps), for the current shapes: param name -> how many layers they cover.

        >>> from unroll import expand
        >>> net_param = expand("rnn", steps=5, batch=2, input_dim=3, hidden=4)
        >>> net_param.force_backward = True
        >>> Net(net_param).batched_param_gradients
        {'W_hh': 5}
        """
        groups = self.memory.layout.groups if self.memory.layout is not None else ()
        covered: dict[str, int] = {}
        for g in groups:  # a param's GEMMs, one per chunk of its sharers
            name = self.layers_run[g.after].blobs[0].name
            covered[name] = covered.get(name, 0) + len(g.steps)
        return covered

    def inspect(self):
        """What this net decided: each learnable param's owner, holders, shape and
        multipliers; the layers run in place and those given memory of their own (why);
        the splits inserted; the memory plan. ``str()`` of it is a table,
        ``.as_dict()`` the same as data (:mod:`unroll.engine.inspection`)."""
        from unroll.engine.inspection import inspect_net

        return inspect_net(self)

    def memory_report(self, solver=None, largest: int = 10) -> MemoryReport:
        """What the net's memory costs, planned against unplanned (see :class:`MemoryReport`).

        >>> net = Net('layer { name: "in" type: "Input" top: "x" '
        ...           'input_param { shape { dim: 4 dim: 8 } } }')
        >>> net.memory_report().activations
        128
        """
        history = sum(int(h.nbytes) for h in solver.history) if solver is not None else 0
        return memory_report(self.memory.liveness, self.memory.layout, self._blob_list,
                             self.layers_run, self.store.nbytes, history, largest)

    @property
    def params(self) -> dict:
        """Layer name -> its param blobs (shared ones are the owner's memory), as pycaffe."""
        return {layer.name: layer.blobs for layer in self.layers if layer.blobs}

    # -- running ----------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """Reseed what draws randomness at run time (Dropout masks), so runs repeat."""
        self._rng = make_rng(self.xp, seed)
        for layer in self.layers_run:
            layer.rng = self._rng

    def reshape(self) -> None:
        """Propagate new input shapes through every layer, then lay out memory anew."""
        self._input_shapes = None  # until every layer has taken the new shapes, and they fit
        with self._gate.opened():
            executor.reshape(self._fwd, self._limit)
        self._compact_layers()  # what reshape parsed again
        self.release_memory()
        self._layout()
        self._input_shapes = [b.shape for b in self._input_blobs]

    def set_input(self, name: str, value) -> None:
        """Put ``value`` into input blob ``name``, reshaping it if needed. Host data is checked
        by the layers that read it (:mod:`unroll.engine.host_checks`), then copied to the
        device; a device array of the net's dtype (:meth:`device_inputs`) becomes the blob's
        data without a copy, unchecked."""
        entry = self._input_entries.get(name)
        if entry is None:
            raise NetError(f"'{name}' is not an input of this net; inputs: {self.inputs}")
        blob, checks, borrowable = entry
        if self.xp is np or not isinstance(value, self.xp.ndarray):
            value = np.asarray(value, self.dtype)
            for check in checks:
                check(value)
        elif value.dtype == self.dtype and value.flags.c_contiguous and borrowable:
            if value.shape != blob.shape:
                blob.diff = None  # allocated again, in the new shape, when first used
            blob.data = self._borrowed[name] = value
            if id(blob) in self.memory.bound_wholes:  # its parts still view the array it had
                self.memory.bound = False
            return
        if self._borrowed and self._borrowed.pop(name, None) is blob.data:
            blob.data = self.xp.empty(blob.shape, self.dtype)  # never write into the caller's
        blob.reshape(value.shape)
        blob.data[...] = value

    @functools.cached_property
    def _input_entries(self) -> dict:
        """Input name -> (its blob, the host checks of its values, whether a device array
        may become its data), decided once per net rather than on every set_input. The
        blob is the Input layer's own top: net.blobs[name] is the latest version, which an
        in-place layer kept out of place (keep=, fan-out) writes, not the input; a device
        array is borrowed only where no in-place layer writes into the input."""
        return {name: (blob, host_checks_of(self._input_readers, name),
                       len(self.blobs.versions(name)) == 1)
                for name, blob in zip(self.inputs, self._input_blobs)}

    def device_inputs(self, **inputs) -> dict:
        """Host ``inputs`` checked as :meth:`set_input` checks them and sent to the device in
        ONE transfer (:mod:`unroll.engine.transfer`): views of one buffer of the net's dtype.

        >>> net = Net('''layer { name: "in" type: "Input" top: "a" top: "b"
        ...                       input_param { shape { dim: 2 } shape { dim: 3 } } }''')
        >>> sent = net.device_inputs(a=np.zeros(2), b=np.ones(3))
        >>> sent["b"].base is sent["a"].base, sent["b"].dtype
        (True, dtype('float32'))
        """
        buffer, layout = transfer.pack(inputs, self.dtype)
        self.check_inputs(**transfer.unpack(buffer, layout))
        return transfer.unpack(self.xp.asarray(buffer), layout)

    def check_inputs(self, **inputs) -> None:
        """Check host input values as :meth:`set_input` does, without setting them: for
        data that reaches the device another way (a batch packed into one transfer)."""
        for name, value in inputs.items():
            check_host_input(self._input_readers, name, np.asarray(value, self.dtype))

    @functools.cached_property
    def _input_readers(self) -> dict:
        return input_readers(self._fwd, self.inputs)

    def _keep_also(self, names) -> None:
        """Make blobs ``names`` readable after a run from now on (forward(blobs=...))."""
        for name in names:
            if name not in self.blobs:
                raise NetError(f"forward(blobs=...): net '{self.name}' has no blob '{name}'")
        index = {id(blob): b for b, blob in enumerate(self._blob_list)}
        wanted = {index[id(self.blobs[name])] for name in names} - self._kept_blobs
        if wanted:
            self._kept_blobs |= wanted
            self.release_memory()
            self._plan()

    def forward(self, blobs=(), **inputs) -> dict:
        """Run forward; returns {output blob name: data}, and the blobs named in ``blobs``.

        Keywords fill input blobs first. Blobs named in ``blobs`` are kept from
        now on (as if given to ``keep=``), so they are readable after the run.
        """
        if blobs:
            self._keep_also(blobs)
        for name, value in inputs.items():
            self.set_input(name, value)
        if [b.shape for b in self._input_blobs] != self._input_shapes:
            self.reshape()
        with executor.running(self._gate, self.regions, self._fwd, "forward") as at_once:
            if self.memory.layout is not None:
                self.memory.for_forward()
            executor.run(self.memory.actions, 0, self.memory.backward, at_once)
        self.workspace.holder = self
        self._loss = self._device_loss = None
        out = {name: blob.data for name, blob in self._output_blobs}
        if blobs:
            out.update((name, self.blobs[name].data) for name in blobs)
        return out

    @functools.cached_property
    def _output_blobs(self) -> list:
        """(name, blob) of every output: looked up once, not on every forward."""
        return [(name, self.blobs[name]) for name in self.outputs]

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
        if self.memory.layout is not None and not self._plans_backward:
            raise NetError(
                f"net '{self.name}' was built for phase 'test' without force_backward, so its "
                f"memory plan keeps nothing for a backward; build it with phase='train', "
                f"force_backward: true, or plan_memory=False"
            )
        if self.memory.layout is not None and self.workspace.holder is not self:
            raise NetError(
                f"net '{self.name}': backward must follow this net's own forward; another "
                f"net on the shared workspace has run since (or this net never ran forward)"
            )
        for blob, weight in self._loss_tops:
            blob.diff.fill(weight)
        with executor.running(self._gate, self.regions, self._fwd, "backward") as at_once:
            executor.run(self.memory.actions, self.memory.backward, None, at_once)

    def clear_param_diffs(self) -> None:
        """Zero every owner's diff (once per iteration; backward accumulates into them)."""
        for p in self.learnable_params:
            p.blob.diff.fill(0)

    # -- weights in Caffe's binary format -------------------------------------------
    def to_proto(self) -> NetParameter:
        """The net with its learned blobs, as Caffe writes a .caffemodel
        (:func:`unroll.engine.weights.to_proto`): only the first layer to hold each param."""
        return weights.to_proto(self.name, self.layers, self._params.first_holders)

    def copy_from(self, source, strict: bool = False, allow_missing: bool = False) -> None:
        """Load weights from a NetParameter or a .caffemodel path, matching layers by name,
        as Caffe's CopyTrainedLayersFrom (:func:`unroll.engine.weights.copy_into`)."""
        weights.copy_into(self.layers, self.learnable_params, self.xp, self.dtype, source,
                          strict=strict, allow_missing=allow_missing)

    def save(self, path) -> None:
        """Write the weights as a binary .caffemodel, atomically (temp file, then rename)."""
        weights.save(self.to_proto(), path)
