"""Net: a Caffe NetParameter built into layers and blobs, run forward and backward.

:mod:`unroll.graph.rules` plans the net (Caffe's name resolution, in-place rules,
splits, which layers run backward, and the memory plan); ``Net`` builds the
blobs and layers of that plan and runs them. ``param { name: "W" }`` shares
one weight between every layer that names it (the first owns it, the others
point at its data and diff), so backward accumulates the gradient of every
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
import math
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from unroll.core.errors import NetError
from unroll.core.proto import (
    TEST,
    TRAIN,
    NetParameter,
    ParamSpec,
    array_from_blob_proto,
    read_message,
)
from unroll.engine import transfer, weights
from unroll.engine.backend import get_array_module, make_rng
from unroll.engine.blob import Blob
from unroll.engine.fillers import fill
from unroll.engine.host_checks import check_host_input, input_readers
from unroll.engine.layer import layer_class
from unroll.engine.memory_limit import available_bytes, plan_too_big
from unroll.engine.param_store import LearnableParam, ParamStore
from unroll.engine.threads import num_threads, run_threads
from unroll.engine.workspace import Workspace, place, workspace_for
from unroll.graph import rules as graph

PHASES = {"train": TRAIN, "test": TEST}


def _layer_kind(param) -> str:
    """A LayerParameter's type, and for a Python layer the module and class it runs."""
    if param.type != "Python":
        return param.type
    spec = param.python_param
    return f"Python, module '{spec.module}', class '{spec.layer}'"


def _layer_failure(layer, what: str, error: Exception, bottoms) -> NetError:
    """A layer's unexpected exception as a NetError naming the layer and its bottoms."""
    shapes = ", ".join(f"'{b.name}' {b.shape}" for b in bottoms) or "none"
    kind = layer.type if layer.type != "Python" else _layer_kind(layer.param)
    return NetError(f"layer '{layer.name}' ({kind}) {what}: "
                    f"{type(error).__name__}: {error}; bottoms: {shapes}")


def _make_layer(param, allow_python: bool, **options):
    """The layer of LayerParameter ``param``; its constructor's failure is a NetError."""
    cls = layer_class(param, allow_python)
    try:
        return cls(param, **options)
    except NetError:
        raise
    except Exception as e:
        raise NetError(f"layer '{param.name}' ({_layer_kind(param)}) cannot be made: "
                       f"{type(e).__name__}: {e}") from e


def _failing_layer(error: Exception, net):
    """The layer whose run raised ``error``: the one the net's run loop was calling (its
    ``layer``), else the outermost frame of the traceback whose ``self`` is one of the
    net's layers; None where no layer's code raised it."""
    ids = {id(layer) for layer in net.layers_run}
    tb, found = error.__traceback__, None
    while tb is not None:
        local = tb.tb_frame.f_locals
        if local.get("self") is net and id(local.get("layer")) in ids:
            return local["layer"]
        if found is None and id(local.get("self")) in ids:
            found = local["self"]
        tb = tb.tb_next
    return found


def _call(layer, what: str, method, *args) -> None:
    """``method(*args)`` of ``layer``; an unexpected exception becomes a NetError."""
    try:
        method(*args)
    except NetError:
        raise
    except Exception as e:
        bottoms = args[0] if method.__name__ != "backward" else args[2]
        raise _layer_failure(layer, what, e, bottoms) from e


_branch_pool: ThreadPoolExecutor | None = None


def _forward_entry(entry) -> None:
    layer, bottoms, tops = entry
    layer.forward(bottoms, tops)


def _backward_entry(entry, zero_before, gemms) -> None:
    s, layer, tops, prop, bottoms = entry
    for blob in zero_before.get(s, ()):
        blob.diff.fill(0)
    layer.backward(tops, prop, bottoms)
    for sharer, x, gy in gemms.get(s, ()):
        sharer.param_backward(x, gy)


def _run_branch(entries, run, what: str) -> None:
    for entry in entries:
        try:
            run(entry)
        except NetError:
            raise
        except Exception as e:
            layer, bottoms = (entry[0], entry[1]) if len(entry) == 3 else (entry[1], entry[4])
            raise _layer_failure(layer, what, e, bottoms) from e


def _run_items(items, run, what: str) -> None:
    """Run a schedule (see Net._schedule): serial lists in order; for a region, its
    entries before, then its branches at once (one on this thread, the others on a
    pool), then its entries after."""
    global _branch_pool
    for item in items:
        if isinstance(item, list):
            _run_branch(item, run, what)
            continue
        before, branches, after = item
        _run_branch(before, run, what)
        if _branch_pool is None:
            _branch_pool = ThreadPoolExecutor(thread_name_prefix="unroll-branch")
        others = [_branch_pool.submit(_run_branch, b, run, what) for b in branches[1:]]
        try:
            _run_branch(branches[0], run, what)
        finally:
            for future in others:
                future.exception()  # every branch has finished before anything goes on
        for future in others:
            future.result()
        _run_branch(after, run, what)


class BlobTable(Mapping):
    """``net.blobs``: a name gives its latest version (as in pycaffe), ``"name@k"`` version k.

    Versions come from in-place layers: ``bn`` written by BatchNorm is
    ``bn@0``; an in-place ReLU on it makes ``bn@1``, which ``bn`` now means.
    Versions share memory unless the net had to keep them apart (``keep=``).
    """

    def __init__(self):
        self._latest: dict[str, Blob] = {}
        # only names written in place have several versions; most have one, their latest
        self._versions: dict[str, list[Blob]] = {}

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

    def closed_error(self, blob) -> NetError:
        return NetError(
            f"blob '{blob.name}' of net '{self.net.name}' is not kept: the memory plan reuses "
            f"its memory once its last reader has run; build the net with keep=['{blob.name}'] "
            f"(or forward(blobs=['{blob.name}'])) to read it after a run, or with "
            f"plan_memory=False to keep every blob"
        )


#: layouts a net keeps, by input shapes: a bucket's full batches and its last one
LAYOUTS_KEPT = 2


@dataclass
class _Placement:
    """A net's memory layout for its current shapes (see :meth:`Net._layout`).

    Per kind ("data", "diff"), arrays by root: ``offset`` the workspace byte
    offset of its own buffer, ``whole`` the root it lives inside (-1: none)
    and ``within`` its element offset there. ``scratch`` maps (step, name)
    to offsets; then the total, the weight-gradient groups and the sizes of
    their buffers (roots numbered after the blobs).
    """

    offset: dict
    whole: dict
    within: dict
    scratch: dict
    total: int
    groups: list
    sizes: dict


@dataclass
class MemoryReport:
    """Bytes a net needs, planned against unplanned (every blob its own memory).

    ``activations``, ``diffs`` and ``scratch`` are the unplanned sizes;
    ``kept`` is the private part (inputs, outputs, losses, ``keep=``),
    ``workspace`` this net's share of the shared workspace, so ``planned =
    kept + workspace``. ``params`` counts the parameter store (data and diff
    of every param, shared by every net over it), ``history`` the solver's.
    ``largest`` lists ``(blob, shape, bytes, where)`` for the biggest blobs.
    """

    params: int
    history: int
    activations: int
    diffs: int
    scratch: int
    kept: int
    workspace: int
    largest: list

    @property
    def unplanned(self) -> int:
        return self.activations + self.diffs + self.scratch

    @property
    def planned(self) -> int:
        return self.kept + self.workspace

    def __str__(self) -> str:
        kib = 1024.0
        lines = [
            f"params         {self.params / kib:12.1f} KiB",
            f"solver history {self.history / kib:12.1f} KiB",
            f"activations    {self.activations / kib:12.1f} KiB  (unplanned)",
            f"diffs          {self.diffs / kib:12.1f} KiB  (unplanned)",
            f"scratch        {self.scratch / kib:12.1f} KiB  (unplanned)",
            f"unplanned      {self.unplanned / kib:12.1f} KiB",
            f"planned        {self.planned / kib:12.1f} KiB  = kept {self.kept / kib:.1f} "
            f"+ workspace {self.workspace / kib:.1f}",
            "largest blobs:",
        ]
        lines += [f"  {name:<32} {str(shape):<18} {n / kib:10.1f} KiB  {where}"
                  for name, shape, n, where in self.largest]
        return "\n".join(lines)


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
    and workspace, as :meth:`memory_report` counts them); by default it is
    what the device has available. A net planning more is a NetError at
    build, or at the forward whose input shapes would need it, naming its
    largest blobs and their layers, before any of them is allocated.

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
        plan_memory: bool = True,
        workspace: Workspace | None = None,
        concurrent: bool = False,
        max_bytes: int | None = None,
    ):
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {list(PHASES)}, found {phase!r}")
        net_param = read_message(source, NetParameter)
        self.name = net_param.name
        self._force_backward = net_param.force_backward
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
        self.plan_memory = plan_memory
        # independent branches at once: CPU only (a GPU would need streams), see _build
        self.concurrent = concurrent and self.xp is np
        self.workspace = workspace if workspace is not None else workspace_for(self.store, self.xp)
        self.workspace.attach(self)
        self.max_bytes = max_bytes
        self._gate = _Gate(self)
        self._kept_blobs: set[int] = set()  # asked for by forward(blobs=...)
        self.learnable_params: list[LearnableParam] = []
        self._first_holders: set[tuple[str, int]] = set()  # (layer, index) first to hold a param
        self._loss: float | None = 0.0  # read back on first access (see loss)
        self._device_loss = None
        self._borrowed: dict = {}  # input name -> the caller's device array it holds
        self._bound_wholes: set[int] = set()
        self._gemms: dict = {}  # step -> [(layer, x rows, gy rows)]: see _bind
        # input shapes -> (placement, layer flags) of recent layouts: see _layout
        self._layouts: dict = {}
        self._gate.open = True
        collecting = gc.isenabled()
        # a build makes ~100 objects per layer and frees none: the cyclic collector would
        # rescan every live object of the process many times per net, for nothing (it
        # took over half of the build time of a tagger's nets)
        gc.disable()
        try:
            self._build(graph.legacy_inputs(net_param)
                        + graph.filter_layers(net_param, PHASES[phase]))
        finally:
            self._gate.open = False
            if collecting:
                gc.enable()
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
        ``Net::bottom_need_backward``.

        >>> net = Net('''layer { name: "in" type: "Input" top: "x" input_param { shape {
        ...   dim: 2 dim: 3 } } }
        ... layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
        ...   inner_product_param { num_output: 2 } }''')
        >>> net.bottom_need_backward[net.layer_names.index("ip")]  # x is an input: no diff
        (False,)
        """
        return list(self._bottom_need)

    def _compact_layers(self) -> None:
        for layer in self.layers_run:
            layer.compact()
        self.graph.layer_params = None  # the layers hold their own parameters

    # -- building -------------------------------------------------------------
    def _build(self, layer_params) -> None:
        self.layers = [
            _make_layer(lp, self.allow_python_layers, xp=self.xp, dtype=self.dtype,
                        phase=self.phase, rng=self._rng, make_param=self._make_param)
            for lp in layer_params
        ]
        for layer, lp in zip(self.layers, layer_params):
            layer.check_counts(len(lp.bottom), len(lp.top))
        g = graph.build_graph(layer_params, self.layers, self.keep)
        self.graph = g
        self.in_place_fallbacks = g.in_place_fallbacks
        self._blob_list = [Blob((), self.xp, self.dtype, name) for name in g.names]
        self.blobs = BlobTable()
        for b in g.order:
            self.blobs._add(g.names[b], self._blob_list[b])
        self.outputs = g.outputs
        splits = [layer_class(lp)(lp, xp=self.xp, dtype=self.dtype, phase=self.phase)
                  for lp in g.layer_params[len(layer_params):]]
        everyone = self.layers + splits
        self.layers_run = [everyone[step.layer] for step in g.steps]
        blob_list = self._blob_list
        self._bottoms = [tuple([blob_list[b] for b in step.bottoms]) for step in g.steps]
        self._tops = [tuple([blob_list[b] for b in step.tops]) for step in g.steps]
        self._setup_layers()
        self.layer_need_backward, self._bottom_need, loss_tops = graph.backward_needs(
            g.steps, self.layers_run, self._force_backward, self._learns)
        self._loss_tops = [(self._blob_list[b], w) for b, w in loss_tops]
        self._loss_blobs = [b for b, _ in loss_tops]
        self._fwd = list(zip(self.layers_run, self._bottoms, self._tops))
        self._bwd = [
            (s, layer, tops, prop, bottoms)
            for s, (layer, bottoms, tops, prop, need) in enumerate(zip(
                self.layers_run, self._bottoms, self._tops, self._bottom_need,
                self.layer_need_backward))
            if need
        ][::-1]
        self.regions = (graph.concurrent_regions(g.steps, self.layers_run)
                        if self.concurrent else [])
        self._schedule()
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

    def _schedule(self) -> None:
        """The run order as serial runs and concurrent regions, forward and backward.

        Each item is a list of entries (run in order) or a region as (entries
        run before, [entries of each branch], entries run after): forward, the
        region's ``first`` steps run before its branches; backward (entries of
        ``_bwd``, each list reversed) they run after them.
        """
        forward, backward, s = [], [], 0
        bwd = {entry[0]: entry for entry in self._bwd}
        for region in self.regions:
            forward.append(self._fwd[s : region.start])
            forward.append(([self._fwd[t] for t in region.first],
                            [[self._fwd[t] for t in b] for b in region.branches], []))
            backward.append([bwd[t] for t in range(region.start - 1, s - 1, -1) if t in bwd])
            backward.append(([], [[bwd[t] for t in reversed(b) if t in bwd]
                                  for b in region.branches],
                             [bwd[t] for t in reversed(region.first) if t in bwd]))
            s = region.stop
        forward.append(self._fwd[s:])
        backward.append([bwd[t] for t in range(len(self._fwd) - 1, s - 1, -1) if t in bwd])
        self._forward_items, self._backward_items = forward, backward[::-1]

    def _setup_layers(self) -> None:
        limit = self._memory_limit(self._param_bytes() + self.workspace.nbytes)
        for layer, bottoms, tops in zip(self.layers_run, self._bottoms, self._tops):
            try:
                layer.set_up(bottoms, tops)
            except NetError:
                raise
            except Exception as e:
                raise _layer_failure(layer, "cannot set up", e, bottoms) from e
            self._check_tops(layer, tops, limit)
        self._input_blobs = [t for layer, t in zip(self.layers_run, self._tops)
                             if layer.type == "Input" for t in t]
        self._input_shapes = [b.shape for b in self._input_blobs]

    def _learns(self, step: int) -> bool:
        layer = self.layers_run[step]
        return layer.learnable and any(
            (layer.param.param[k].lr_mult if k < len(layer.param.param) else 1.0) != 0
            for k in range(len(layer.blobs)))

    # -- the memory plan -----------------------------------------------------------
    def _private_blobs(self) -> set[int]:
        """Blobs readable after a run: inputs, outputs, losses, keep=, and in the test
        phase what losses and accuracies read (the predictions, as pycaffe users read them)."""
        g = self.graph
        named = set(self.outputs) | self.keep
        private = {b for name, b in g.table if name in named}
        for step, layer in zip(g.steps, self.layers_run):
            if layer.type == "Input":
                private.update(step.tops)
            elif self.phase == "test" and (layer.is_loss or layer.type == "Accuracy"):
                private.update(step.bottoms)
        private.update(self._loss_blobs)
        return private | self._kept_blobs

    def _plan(self) -> None:
        """The lifetimes (from the graph), then the layout (from the shapes)."""
        g = self.graph
        private = (set(range(len(self._blob_list))) if not self.plan_memory
                   else self._private_blobs())
        # a test-phase net runs backward only when asked to (force_backward): inference
        # memory must not hold what only a backward would read
        self._plans_backward = self.phase == "train" or self._force_backward
        need = (self.layer_need_backward if self._plans_backward
                else [False] * len(self.layer_need_backward))
        self.memory_plan = graph.plan_memory(
            g.steps, self.layers_run, len(self._blob_list), private, need,
            self._bottom_need, self._loss_blobs, self.regions)
        plan = self.memory_plan
        for b, blob in enumerate(self._blob_list):
            planned = plan.data_root[b] not in plan.private or plan.diff_root[b] not in plan.private
            blob.guard = self._gate if planned else None
        self._zero_before = {s: [self._blob_list[r] for r in roots]
                             for s, roots in plan.zero_before.items()}
        self._layouts.clear()  # laid out for the old plan
        self._layout()

    def _layout(self) -> None:
        """Where every planned buffer sits in the workspace, for the current shapes.

        Computes offsets only: the workspace grows, and the blobs get their
        memory, when the net next runs. Besides each blob's own buffer: parts
        placed inside their whole (Concat, Slice), diffs passed through
        unchanged (Eltwise SUM) sharing one buffer, and the rows of layers that
        share a param placed back to back, so that its gradient is one GEMM
        (:func:`unroll.graph.rules.plan_weight_gradients`).
        """
        self._bound = False
        if not self.plan_memory:
            self._check_plan(None)
            self._placement = None
            return
        # a bucket's last batch is smaller than the others, so a net's shapes go back and
        # forth: the layouts of the last shapes are kept, not computed again (a layout
        # took as long as a training step of the word-level tagger)
        key = tuple(blob.shape for blob in self._input_blobs)
        if key in self._layouts:
            self._placement, flags = self._layouts[key]
        else:
            placement, flags = self._new_layout()
            self._check_plan(placement)  # before the layers hear of it, or memory is taken
            self._placement = placement
            if len(self._layouts) >= LAYOUTS_KEPT:
                del self._layouts[next(iter(self._layouts))]
            self._layouts[key] = (self._placement, flags)
        layers = self.layers_run
        for s, told in flags:
            layers[s].apply_layout(**told)

    def _new_layout(self) -> tuple[_Placement, list[tuple[int, dict]]]:
        """The layout of :meth:`_layout` for the current shapes, and what it tells each
        layer that takes part in one (:meth:`Layer.apply_layout`'s arguments by step)."""
        plan, g, layers = self.memory_plan, self.graph, self.layers_run
        told = {s: {} for s, layer in enumerate(layers)
                if layer.parts_of_whole or layer.passes_diffs or layer.batches_param_diffs}
        shapes = [blob.shape for blob in self._blob_list]
        data_host, diff_host, flags = graph.group_parts(g.steps, layers, plan, shapes,
                                                        g.rewritten)
        skipped = {}
        for s, (data_flags, diff_flags) in flags.items():
            told[s]["parts_in_whole"] = (data_flags, diff_flags)
            # a Slice writes its whole's diff unless every part is inside it
            skipped[s] = diff_flags if layers[s].parts_of_whole == "bottoms" else [
                all(diff_flags)]
        aliased = graph.alias_pass_through_diffs(g.steps, layers, plan, self._bottom_need,
                                                 diff_host, g.rewritten)
        for s, fl in aliased.items():
            told[s]["diff_aliased"] = skipped[s] = fl
        groups, sizes = graph.plan_weight_gradients(
            g.steps, layers, plan, self._bottom_need, shapes, data_host, diff_host,
            g.rewritten, skipped, len(self._blob_list))
        for group in groups:
            for s in group.steps:
                told[s]["param_diffs_batched"] = True
        sizes = {key: n * self.dtype.itemsize for key, n in sizes.items()}
        buffers, keys = [], []
        for kind, life, host in (("data", plan.data_life, data_host),
                                 ("diff", plan.diff_life, diff_host)):
            spans = dict(life.items())
            for r in host:  # a buffer inside another lives as long as either
                if r in life:
                    top = r
                    while top in host:
                        top = host[top][0]
                    first, last = life[r]
                    a, b = spans.get(top, (first, last))
                    spans[top] = (min(a, first), max(b, last))
            for r, (first, last) in spans.items():
                if r not in host and r not in plan.private:
                    nbytes = sizes[(kind, r)] if (kind, r) in sizes else self._blob_list[r].nbytes
                    buffers.append((first, last, nbytes))
                    keys.append((kind, r))
        for s, layer in enumerate(layers):
            for name, (shape, dtype, lives) in layer.scratch_specs.items():
                span = plan.scratch_life(s, lives)
                if span is not None:
                    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                    buffers.append((span[0], span[1], n))
                    keys.append(("scratch", (s, name)))
        offsets, total = place(buffers)
        # kept per net, and a bucketed model keeps many nets: arrays by root, not dicts
        n = len(self._blob_list) + len(sizes)  # the groups' buffers are numbered after blobs
        offset = {kind: np.full(n, -1, np.int64) for kind in ("data", "diff")}
        scratch = {}
        for (kind, r), at in zip(keys, offsets):
            if kind == "scratch":
                scratch[r] = at
            else:
                offset[kind][r] = at
        whole, within = {}, {}
        for kind, host in (("data", data_host), ("diff", diff_host)):
            whole[kind], within[kind] = np.full(n, -1, np.int32), np.zeros(n, np.int64)
            if host:
                roots = np.fromiter(host, np.int64, len(host))
                whole[kind][roots], within[kind][roots] = zip(*host.values())
        return _Placement(offset, whole, within, scratch, total, groups, sizes), list(told.items())

    # -- the memory limit ----------------------------------------------------------
    def _param_bytes(self) -> int:
        # from the shapes: reading a param's diff would allocate it
        return sum(2 * p.blob.nbytes for p in self.store)

    def _memory_limit(self, held: int) -> int:
        """``max_bytes``, or what the device has available plus ``held``: the bytes of the
        need already allocated, no longer available but counted in the need."""
        return self.max_bytes if self.max_bytes is not None else available_bytes(self.xp) + held

    def _check_tops(self, layer, tops, limit: int) -> None:
        # a blob larger than the limit is refused as soon as its shape is known: the
        # layers after it could allocate in proportion to it (the whole plan comes later)
        for top in tops:
            if top.nbytes > limit:
                raise plan_too_big(self.name, top.nbytes, limit, self.max_bytes is not None,
                                   [(f"blob '{top.name}'", top.shape, top.nbytes,
                                     f"layer '{layer.name}' ({layer.type})")])

    def _check_plan(self, placement) -> None:
        """Refuse a plan (its params, kept blobs and workspace) larger than the limit."""
        plan, blobs = self.memory_plan, self._blob_list
        kept_roots = [r for r in set(plan.data_root) if r in plan.private]
        kept = sum(blobs[r].nbytes for r in kept_roots)
        kept += sum(blobs[r].nbytes for r in set(plan.diff_root)
                    if r in plan.private and r in plan.diff_life)
        if placement is not None:
            workspace = placement.total
        else:  # every blob is kept; the layers' scratch is their own
            workspace = sum(math.prod(shape) * np.dtype(dtype).itemsize
                            for layer in self.layers_run
                            for shape, dtype, _ in layer.scratch_specs.values())
        params = self._param_bytes()
        need = params + kept + workspace
        held = params + self.workspace.nbytes + sum(
            blobs[r].nbytes for r in kept_roots if blobs[r]._data is not None)
        limit = self._memory_limit(held)
        if need <= limit:
            return
        producer = {}
        for step, layer in zip(self.graph.steps, self.layers_run):
            for b in step.tops:
                producer.setdefault(b, f"layer '{layer.name}' ({layer.type})")
        culprits = [(f"blob '{blobs[r].name}'", blobs[r].shape, blobs[r].nbytes,
                     producer.get(r, "no layer")) for r in set(plan.data_root)]
        culprits += [(f"param '{p.name}'", p.blob.shape, 2 * p.blob.nbytes,
                      f"layer '{p.owner}'") for p in self.store]
        culprits.sort(key=lambda c: -c[2])
        raise plan_too_big(self.name, need, limit, self.max_bytes is not None, culprits[:3])

    def _bind(self) -> None:
        """Give every planned blob and scratch buffer its memory in the workspace."""
        placement = self._placement
        offset, whole, within = placement.offset, placement.whole, placement.within
        ws, n_blobs = self.workspace, len(self._blob_list)
        ws.grow(placement.total)
        arrays: dict = {}
        # blobs that other blobs are views into (Slice parts of an input, say): a new array
        # for one of them (a borrowed input) must re-bind its parts
        wholes = np.unique(whole["data"][whole["data"] >= 0]).tolist()
        self._bound_wholes = {id(self._blob_list[w]) for w in wholes if w < n_blobs}

        def array(kind, r):
            if (kind, r) in arrays:
                return arrays[(kind, r)]
            host, at = int(whole[kind][r]), int(offset[kind][r])
            if r >= n_blobs:  # a buffer holding several blobs' rows
                a = ws.view(at, (placement.sizes[(kind, r)] // self.dtype.itemsize,),
                            self.dtype)
            elif host >= 0:
                blob, flat = self._blob_list[r], array(kind, host)
                first = int(within[kind][r])
                a = None if flat is None else (
                    flat.reshape(-1)[first : first + blob.count].reshape(blob.shape))
            elif at >= 0:
                a = ws.view(at, self._blob_list[r].shape, self.dtype)
            elif r in self.memory_plan.private:
                a = getattr(self._blob_list[r], kind)  # its own memory
            else:
                a = None  # never used by this net (no backward: no diff)
            arrays[(kind, r)] = a
            return a

        plan = self.memory_plan
        for r in set(plan.data_root) | set(plan.diff_root):
            if r in plan.private:
                continue
            # a root no step touches (a diff where nothing runs backward) gets no memory
            data = array("data", r) if r in plan.data_life else None
            diff = array("diff", r) if r in plan.diff_life else None
            self._blob_list[r].bind(data, diff)
        for s, layer in enumerate(self.layers_run):
            for name, (shape, dtype, _) in layer.scratch_specs.items():
                if (s, name) in placement.scratch:
                    layer.scratch_memory[name] = ws.view(placement.scratch[(s, name)],
                                                         shape, dtype)
        self._gemms = {}
        for group in placement.groups:
            layer = self.layers_run[group.after]
            (xr, x0), (gr, g0) = group.x, group.gy
            K, n = layer.param_row_widths()
            x = array("data", xr).reshape(-1)[x0 : x0 + group.rows * K].reshape(-1, K)
            gy = array("diff", gr).reshape(-1)[g0 : g0 + group.rows * n].reshape(-1, n)
            self._gemms.setdefault(group.after, []).append((layer, x, gy))
        arrays.clear()  # array() refers to itself: left to the collector, the dict would
        # keep views of an old arena alive after the workspace grows
        self._bound = True

    def release_memory(self) -> None:
        """Drop every view of the workspace (it is about to move); the next run re-binds."""
        if not self._bound:
            return
        plan = self.memory_plan
        for r in set(plan.data_root) | set(plan.diff_root):
            if r not in plan.private:
                self._blob_list[r].bind(None, None)
        for layer in self.layers_run:
            layer.scratch_memory.clear()
        self._gemms = {}
        self._bound = False

    @property
    def batched_param_gradients(self) -> dict[str, int]:
        """Params whose gradient backward computes in ONE GEMM over every layer sharing
        them, for the current shapes: param name -> how many layers that GEMM covers.

        >>> from unroll import expand
        >>> net_param = expand("rnn", steps=5, batch=2, input_dim=3, hidden=4)
        >>> net_param.force_backward = True
        >>> Net(net_param).batched_param_gradients
        {'W_hh': 5}
        """
        if self._placement is None:
            return {}
        return {self.layers_run[g.after].blobs[0].name: len(g.steps)
                for g in self._placement.groups}

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
        plan = self.memory_plan
        roots = sorted(set(plan.data_root))
        blobs = self._blob_list
        activations = sum(blobs[r].nbytes for r in roots)
        diffs = sum(blobs[r].nbytes for r in set(plan.diff_root)
                    if r in plan.diff_life or (r in plan.private and blobs[r]._diff is not None))
        scratch = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                      for layer in self.layers_run
                      for shape, dtype, _ in layer.scratch_specs.values())
        kept = sum(blobs[r].nbytes for r in roots if r in plan.private)
        kept += sum(blobs[r].nbytes for r in set(plan.diff_root)
                    if r in plan.private and blobs[r]._diff is not None)
        if self._placement is None:
            kept, workspace = activations + diffs + scratch, 0
        else:
            workspace = self._placement.total
        history = sum(int(h.nbytes) for h in solver.history) if solver is not None else 0
        inside = self._placement.whole["data"] if self._placement else None

        def where(r):
            if r in plan.private:
                return "kept"
            return "inside another blob" if inside is not None and inside[r] >= 0 else "workspace"

        big = sorted(roots, key=lambda r: -blobs[r].nbytes)[:largest]
        return MemoryReport(self.store.nbytes, history, activations, diffs, scratch, kept,
                            workspace, [(blobs[r].name, blobs[r].shape, blobs[r].nbytes,
                                         where(r)) for r in big])

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
        have, nbytes = self._param_bytes(), 2 * blob.nbytes  # its data and its diff
        limit = self._memory_limit(have + self.workspace.nbytes)
        if have + nbytes > limit:
            raise plan_too_big(self.name, have + nbytes, limit, self.max_bytes is not None,
                               [(f"param {index} ('{blob.name}')", shape, nbytes,
                                 f"layer '{layer.name}' ({layer.type})")])
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
        if not any(p is owner for p in self.learnable_params):  # by identity: no field compare
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

    # -- running ----------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """Reseed what draws randomness at run time (Dropout masks), so runs repeat."""
        self._rng = make_rng(self.xp, seed)
        for layer in self.layers_run:
            layer.rng = self._rng

    def reshape(self) -> None:
        """Propagate new input shapes through every layer, then lay out memory anew."""
        self._input_shapes = None  # until every layer has taken the new shapes, and they fit
        limit = self._memory_limit(self._param_bytes() + self.workspace.nbytes)
        opened, self._gate.open = self._gate.open, True
        try:
            for layer, bottoms, tops in self._fwd:
                _call(layer, "cannot reshape", layer.reshape, bottoms, tops)
                self._check_tops(layer, tops, limit)
        finally:
            self._gate.open = opened
        self._compact_layers()  # what reshape parsed again
        self.release_memory()
        self._layout()
        self._input_shapes = [b.shape for b in self._input_blobs]

    def set_input(self, name: str, value) -> None:
        """Put ``value`` into input blob ``name``, reshaping it if needed.

        Host data is checked by the layers that read it (Embed ids, labels: see
        :mod:`unroll.engine.host_checks`), then copied to the device. A device array of
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
            if id(blob) in self._bound_wholes:  # its parts still view the array it had
                self._bound = False
            return
        if self._borrowed.pop(name, None) is blob.data:  # never write into the caller's array
            blob.data = self.xp.empty(blob.shape, self.dtype)
        blob.reshape(value.shape)
        blob.data[...] = value

    def device_inputs(self, **inputs) -> dict:
        """Host ``inputs`` checked as :meth:`set_input` checks them, then moved to the net's
        device in ONE transfer (:mod:`unroll.engine.transfer`): {name: a view of one device
        buffer of the net's dtype}, which :meth:`forward` takes without a copy.

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
        with self._running("forward") as at_once:
            if not self._bound and self._placement is not None:
                self._bind()
            if not at_once:
                for layer, bottoms, tops in self._fwd:
                    layer.forward(bottoms, tops)
            else:
                _run_items(self._forward_items, _forward_entry, "failed in forward")
        self.workspace.holder = self
        self._loss = self._device_loss = None
        out = {name: self.blobs[name].data for name in self.outputs}
        out.update((name, self.blobs[name].data) for name in blobs)
        return out

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
        if self._placement is not None and not self._plans_backward:
            raise NetError(
                f"net '{self.name}' was built for phase 'test' without force_backward, so its "
                f"memory plan keeps nothing for a backward; build it with phase='train', "
                f"force_backward: true, or plan_memory=False"
            )
        if self._placement is not None and self.workspace.holder is not self:
            raise NetError(
                f"net '{self.name}': backward must follow this net's own forward; another "
                f"net on the shared workspace has run since (or this net never ran forward)"
            )
        for blob, weight in self._loss_tops:
            blob.diff.fill(weight)
        gemms, zero_before = self._gemms, self._zero_before
        with self._running("backward") as at_once:
            if not at_once:
                for s, layer, tops, prop, bottoms in self._bwd:
                    if s in zero_before:
                        for blob in zero_before[s]:
                            blob.diff.fill(0)
                    layer.backward(tops, prop, bottoms)
                    if s in gemms:
                        for sharer, x, gy in gemms[s]:
                            sharer.param_backward(x, gy)  # every sharer's rows: one GEMM
            else:
                _run_items(self._backward_items, functools.partial(
                    _backward_entry, zero_before=zero_before, gemms=gemms),
                    "failed in backward")

    @contextlib.contextmanager
    def _running(self, what: str):
        """One run (forward or backward): the BLAS threads of the policy and the memory gate
        open for it; a layer's unexpected exception becomes a NetError naming the layer.
        Yields whether the concurrent regions run at once: only with two free cores or
        more, each branch on one BLAS thread (two threads asking one OpenBLAS pool for all
        cores were slower than one serial run, and on a busy machine serial is faster);
        else the serial order, which the regions' memory plan also allows.

        One try around the whole loop, not one per layer, so the hot path stays a bare
        call per layer; the failing layer is found from the traceback afterwards.
        """
        free = num_threads()
        at_once = bool(self.regions) and free >= 2
        blas = run_threads(1 if at_once else free)
        self._gate.open = True
        try:
            with blas:
                yield at_once
        except NetError:
            raise
        except Exception as e:
            layer = _failing_layer(e, self)
            if layer is None:
                raise  # not a layer's: the engine's own bug, with its traceback
            bottoms = next(b for lay, b, _ in self._fwd if lay is layer)
            raise _layer_failure(layer, f"failed in {what}", e, bottoms) from e
        finally:
            self._gate.open = False

    def clear_param_diffs(self) -> None:
        """Zero every owner's diff (once per iteration; backward accumulates into them)."""
        for p in self.learnable_params:
            p.blob.diff.fill(0)

    # -- weights in Caffe's binary format -------------------------------------------
    def to_proto(self) -> NetParameter:
        """The net with its learned blobs, as Caffe writes a .caffemodel
        (:func:`unroll.engine.weights.to_proto`): only the first layer to hold each param."""
        return weights.to_proto(self.name, self.layers, self._first_holders)

    def copy_from(self, source, strict: bool = False, allow_missing: bool = False) -> None:
        """Load weights from a NetParameter or a .caffemodel path, matching layers by name,
        as Caffe's CopyTrainedLayersFrom (:func:`unroll.engine.weights.copy_into`)."""
        weights.copy_into(self.layers, self.learnable_params, self.xp, self.dtype, source,
                          strict=strict, allow_missing=allow_missing)

    def save(self, path) -> None:
        """Write the weights as a binary .caffemodel, atomically (temp file, then rename)."""
        weights.save(self.to_proto(), path)
