"""CUDA graphs: a training step's gradient pass captured once, then replayed in one launch.

One training step of an unrolled net is some 1,600 small kernels; launched one
by one from Python, a GPU spends its time waiting for the next launch. A pass
that never waits for the device (no sync), takes nothing from the host (no
transfer) and keeps its shapes can be captured once with CuPy's stream capture
and replayed as one CUDA graph. :class:`StepGraphs` does so for the gradient
pass of a step (clear the param diffs, forward, the loss, backward). The update
stays eager, after the replay: its host numbers (the learning rate of
``lr_policy``, Adam's bias correction) change every iteration, and a graph
would keep the first ones; over the flat parameter buffers it is some 20
launches.

    solver = Solver(model, type="Adam", base_lr=1e-3, momentum=0.9, momentum2=0.999)
    solver.graphs = StepGraphs(model)      # a model on device "gpu" (or "trace")
    solver.step(1000, feed=batches)

Each set of input shapes (a bucket's T) runs ``warmup`` eager passes (CuPy
compiles its kernels, diffs and scratch buffers are allocated), is captured on
the next, and replayed from then on. The batch is copied into buffers of the
graph's own before each replay; what the graph reads and writes must stay
where it was captured, so a graph is captured again when the workspace has
grown, the parameter store was repacked, or its net ran other shapes since.
Allocations during a capture come from a memory pool of the graph's own, so no
later allocation can take memory the graph writes into.

On device "trace" the capture is simulated (:func:`unroll.engine.trace.capture`
records the launches and replays them on the same buffers), so everything here
runs, and is tested, on the CPU; :func:`check_capturable` says there whether a
pass is capturable at all.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from unroll.engine import trace
from unroll.engine.backend import get_array_module

__all__ = ["GraphError", "StepGraphs", "check_capturable", "gradient_pass", "graphs_for"]


class GraphError(RuntimeError):
    """A pass that cannot be captured as a CUDA graph, or a model that cannot use one."""


def gradient_pass(model, inputs: Mapping):
    """Clear the param diffs, forward on ``inputs``, backward: the work a graph captures.
    Returns the loss, left on the device."""
    model.clear_param_diffs()
    model.forward(**inputs)
    loss = model.device_loss
    model.backward()
    return loss


def graphs_for(model, warmup: int = 2) -> StepGraphs | None:
    """A :class:`StepGraphs` for ``model`` where its device replays CUDA graphs ("gpu",
    and "trace", which simulates them), else None: the CPU runs its passes eagerly. What a
    training loop sets as its solver's ``graphs``.

    >>> import unroll
    >>> graphs_for(unroll.Net(unroll.expand("rnn", steps=2, input_dim=1, hidden=1))) is None
    True
    """
    if model.device in ("gpu", "trace"):
        return StepGraphs(model, warmup=warmup)
    return None


class _TraceCapture:
    """unroll.engine.trace's simulation: the captured block runs as it is recorded."""

    runs_work = True

    def __call__(self, run):
        try:
            with trace.capture() as graph:
                result = run()
        except trace.CaptureError as error:
            raise GraphError(f"the step cannot be captured as a CUDA graph: {error}") from None
        return graph, result, None


class _CuPyCapture:
    """CuPy's stream capture, on a stream and a memory pool of the graph's own."""

    runs_work = False  # a capture records work; the first launch does it

    def __call__(self, run):
        cupy = get_array_module("gpu")
        # capture needs a stream other than the legacy default one; the graph's
        # allocations come from its own pool, which nothing else allocates from, so
        # the buffers baked into the graph stay its own after the capture frees them
        stream = cupy.cuda.Stream(non_blocking=True)
        pool = cupy.cuda.MemoryPool()
        with cupy.cuda.using_allocator(pool.malloc), stream:
            stream.begin_capture()
            failure = graph = result = None
            try:
                result = run()
            except Exception as error:  # the capture must end whatever happened in it
                failure = error
            try:
                graph = stream.end_capture()
            except Exception as error:  # an invalidated capture fails here
                failure = failure or error
        if failure is not None:
            raise GraphError(
                f"the step cannot be captured as a CUDA graph ({type(failure).__name__}: "
                f"{failure}); a captured step must not read device values on the host "
                f"(float(), bool(), .get()) nor copy host arrays to the device"
            ) from failure
        return graph, result, (stream, pool)


def _capture_for(device: str):
    if device == "gpu":
        return _CuPyCapture()
    if device == "trace":
        return _TraceCapture()
    raise GraphError(f"CUDA graphs need a model on device 'gpu' (or 'trace', which simulates "
                     f"them on the CPU); this model runs on {device!r}")


@dataclass
class _Entry:
    """One set of input shapes: its input buffers, eager passes so far, and its graph."""

    inputs: dict
    runs: int = 0
    net: object = None
    graph: object = None
    keep: object = None  # what the graph's memory needs alive (CuPy: its stream and pool)
    loss: object = None
    memory: tuple = field(default=())


class StepGraphs:
    """The gradient passes of a model's training steps, each input shape captured once as a
    CUDA graph and replayed; give it to a :class:`~unroll.train.solver.Solver` as ``graphs``.

    ``model`` is a :class:`~unroll.engine.net.Net` or a
    :class:`~unroll.train.bucketed_model.BucketedModel` on device "gpu" (or "trace");
    ``warmup`` eager passes precede each capture.

    >>> import unroll
    >>> from unroll.train.solver import Solver
    >>> from unroll.train.bucketed_model import BucketedModel
    >>> make = lambda T: unroll.expand("rnn", steps=T, batch=2, input_dim=3, hidden=4)
    >>> model = BucketedModel(make, device="trace")
    >>> solver = Solver(model, type="SGD", base_lr=0.1)
    >>> solver.graphs = StepGraphs(model, warmup=1)
    >>> batch = {"x": np.ones((5, 2, 3)), "cont": np.ones((5, 2))}
    >>> _ = solver.step(4, feed=batch)
    >>> solver.graphs.captures, solver.graphs.replays
    (1, 2)
    """

    def __init__(self, model, warmup: int = 2):
        if warmup < 1:
            raise ValueError(f"warmup: expected at least 1 eager pass (CuPy compiles its "
                             f"kernels there), found {warmup}")
        self.model, self.warmup = model, warmup
        self._capture = _capture_for(model.device)
        self._xp = get_array_module(model.device)
        self._dtype = np.dtype(model.dtype)
        self._entries: dict[tuple, _Entry] = {}
        self._shaped_by: dict[int, _Entry] = {}  # id(net) -> the entry it last ran
        #: graphs captured and replays run so far
        self.captures = self.replays = 0

    def gradients(self, inputs: Mapping):
        """One gradient pass on ``inputs`` (host or device arrays): the param diffs hold the
        gradients after it; returns the loss, a 0-d array on the device."""
        entry = self._entry(inputs)
        for name, value in inputs.items():  # outside the graph: a copy, or the transfer
            entry.inputs[name][...] = value
        if entry.graph is not None and not self._intact(entry):
            entry.graph = entry.keep = None
            entry.runs = 0
        if entry.graph is not None:
            entry.graph.launch()
            self.replays += 1
            self._replayed(entry)
            return entry.loss
        if entry.runs < self.warmup:
            entry.runs += 1
            loss = gradient_pass(self.model, entry.inputs)
            self._ran(entry)
            return loss
        entry.graph, entry.loss, entry.keep = self._capture(
            lambda: gradient_pass(self.model, entry.inputs))
        self.captures += 1
        if not self._capture.runs_work:
            entry.graph.launch()
        self._ran(entry)
        entry.memory = self._memory(entry.net)
        return entry.loss

    def _entry(self, inputs: Mapping) -> _Entry:
        key = tuple(sorted((name, np.shape(value)) for name, value in inputs.items()))
        if key not in self._entries:
            self._entries[key] = _Entry({name: self._xp.zeros(shape, self._dtype)
                                         for name, shape in key})
        return self._entries[key]

    def _ran(self, entry: _Entry) -> None:
        """Note the net an eager pass or a capture ran: its memory now has entry's shapes."""
        entry.net = getattr(self.model, "active", self.model)  # a BucketedModel's bucket
        before = self._shaped_by.get(id(entry.net))
        if before is not None and before is not entry:
            # the net's blobs took other shapes: the graph of the shapes before would be
            # captured again before a replay, so its memory goes back now
            before.graph = before.keep = None
            before.runs = 0
        self._shaped_by[id(entry.net)] = entry

    def _replayed(self, entry: _Entry) -> None:
        """What the net's forward notes when it runs in Python, noted for a replay."""
        net = entry.net
        if hasattr(self.model, "active"):
            self.model.active = net
        net.workspace.holder = net
        net._loss = None  # the replay wrote a new loss into net.device_loss

    def _intact(self, entry: _Entry) -> bool:
        """Whether every buffer the graph was captured with is still where it was."""
        return (self._shaped_by.get(id(entry.net)) is entry
                and all(a is b for a, b in zip(entry.memory, self._memory(entry.net))))

    @staticmethod
    def _memory(net) -> tuple:
        # the net's blobs live in the workspace arena and the params in the store's flat
        # buffers: either moves (a larger net ran, a param was added) to a new array. The
        # entry holds these arrays themselves, not ids: a freed array's id can come back
        store = net.store
        return net.workspace.arena, store.data, store.diff


def check_capturable(model, inputs: Mapping, warmup: int = 2) -> trace.Counts:
    """Raise a GraphError unless a gradient pass of ``model`` (device "trace") on
    ``inputs`` could be captured: after ``warmup`` passes, one pass must make no sync and
    no transfer, and leave no new device buffer alive. Returns that pass's counts.

    >>> from unroll import Net
    >>> net = Net('''
    ...   layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
    ...   layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
    ...           inner_product_param { num_output: 1 } }
    ...   layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "y" top: "l" }''',
    ...   device="trace")
    >>> check_capturable(net, {"x": np.ones((2, 3))}).syncs
    0
    """
    if model.device != "trace":
        raise GraphError(f"check_capturable counts on device 'trace'; this model runs on "
                         f"{model.device!r}")
    dtype = np.dtype(model.dtype)
    on_device = {name: trace.asarray(value, dtype) for name, value in inputs.items()}
    for _ in range(warmup):
        gradient_pass(model, on_device)
    # only the pass frees memory while it runs (no collection of other garbage), and what
    # only cycles hold afterwards is garbage, not kept
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        before = trace.live_bytes()
        with trace.measure() as counts:
            gradient_pass(model, on_device)
    finally:
        if collecting:
            gc.enable()
    gc.collect()
    kept = trace.live_bytes() - before
    problems = []
    if counts.syncs:
        problems.append(f"{counts.syncs} host wait(s) ({', '.join(counts.sync_sites)})")
    if counts.transfers:
        problems.append(f"{counts.transfers} transfer(s)")
    if kept > 0:
        problems.append(f"{kept} bytes of new device memory kept")
    if problems:
        raise GraphError(f"a gradient pass of this model cannot be captured as a CUDA graph: "
                         f"after {warmup} warm-up passes one makes {', '.join(problems)}")
    return counts
