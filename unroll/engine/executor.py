"""Running a net's steps: a layout bound to the workspace, then the steps, serial or at once.

:func:`bind` gives every planned blob and scratch buffer the workspace memory
a :class:`~unroll.engine.memory.Layout` placed it at (and :func:`release` takes
it back when the workspace moves). :func:`schedule` cuts the run order into
serial runs and concurrent regions (:func:`unroll.engine.memory.concurrent_regions`);
:func:`run_forward` and :func:`run_backward` run them. The serial loop is a
bare call per layer: a layer's exception is named by the net afterwards
(:meth:`unroll.engine.net.Net._running`), not by a ``try`` around each call.
"""

from __future__ import annotations

import bisect
import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from unroll.core.errors import NetError
from unroll.engine import memory
from unroll.engine.threads import num_threads, run_threads

__all__ = ["NetMemory", "bind", "recompute_schedule", "release", "run_backward",
           "run_forward", "schedule", "Lives"]

#: layouts a net keeps, by input shapes: a bucket's full batches and its last one
LAYOUTS_KEPT = 2


class NetMemory:
    """A net's memory plan, applied: the liveness of its run order, the layouts of its last
    input shapes, and the one bound to the workspace now.

    ``blobs`` are the net's blobs by number, ``graph`` its run order
    (:class:`unroll.graph.Graph`) and ``layers`` its layers in that order;
    ``limit`` (a :class:`~unroll.engine.memory_limit.MemoryLimit`) refuses a layout
    too big before any of it is allocated. ``gemms``, ``zero_before`` and
    ``segments`` are what :func:`run_backward` takes; ``bound_wholes`` the ids
    of the blobs that other blobs are views into. ``budget`` (bytes) or a ``recompute``
    policy (:func:`unroll.engine.memory.policy_named`) plan recomputation
    (:func:`unroll.engine.memory.within_budget`) of ``fwd`` in backward (``bwd``); not
    with concurrent ``regions``.
    """

    def __init__(self, blobs, graph, layers, bottom_need, workspace, dtype, limit, fwd=(),
                 bwd=(), budget=None, recompute=None, regions=()):
        recompute = memory.policy_named(recompute)
        if self._recomputes(budget, recompute) and regions:
            raise NetError(f"net '{limit.name}': concurrent=True runs branches at once, and "
                           f"a memory budget recomputes segments in order; choose one")
        self.blobs, self.graph, self.layers, self.bottom_need = blobs, graph, layers, bottom_need
        self.workspace, self.dtype, self.limit = workspace, dtype, limit
        self.fwd, self.bwd, self.budget, self.recompute = fwd, bwd, budget, recompute
        self.make, self.base, self.segments = None, None, None
        self.liveness = self.layout = None
        self.layouts: dict = {}  # input shapes -> a recent layout
        self.bound, self.bound_wholes, self.gemms, self.zero_before = False, set(), {}, {}
        self.lives, self.in_backward = None, False

    @staticmethod
    def _recomputes(budget, policy) -> bool:
        """Whether a plan may recompute: a budget or a policy, but "none"."""
        return (budget is not None or policy is not None) and not isinstance(
            policy, memory.NoRecompute)

    def plan(self, make, gate) -> None:
        """Take a new liveness, ``make(recompute)`` for a recomputation plan: the layouts of
        the old one are dropped, and every planned blob is readable only while ``gate`` is
        open (its memory is the net's only then)."""
        liveness = self.base = make(None)
        for b, blob in enumerate(self.blobs):
            planned = (liveness.data_root[b] not in liveness.private
                       or liveness.diff_root[b] not in liveness.private)
            blob.guard = gate if planned else None
        self.make = make
        self._take(liveness)
        self.layouts.clear()

    def _take(self, liveness) -> None:
        self.liveness = liveness
        self.zero_before = {s: [self.blobs[r] for r in roots]
                            for s, roots in liveness.zero_before.items()}
        self.segments = (recompute_schedule(self.fwd, self.bwd, liveness.recompute)
                         if liveness.recompute is not None else None)

    def lay_out(self, key, planned: bool) -> None:
        """The layout for the blobs' current shapes (``key``: the input shapes), told to the
        layers; the workspace grows, and the blobs get their memory, at the next run
        (:meth:`bind`). ``planned=False``: every blob keeps memory of its own."""
        self.bound = False
        check = functools.partial(self.limit.check_plan, self.liveness, blobs=self.blobs,
                                  steps=self.graph.steps, layers=self.layers)
        if not planned:
            if self.budget is not None or self._recomputes(self.budget, self.recompute):
                raise NetError(f"net '{self.limit.name}': plan_memory=False keeps every blob, "
                               f"so a memory budget cannot be planned")
            check(None)
            self.layout = None
            return
        # a bucket's last batch is smaller than the others, so a net's shapes go back and
        # forth: the layouts of the last shapes are kept, not computed again (a layout
        # took as long as a training step of the word-level tagger)
        if key not in self.layouts:
            shapes = [b.shape for b in self.blobs]
            liveness, new = memory.within_budget(
                self.base, self.make, functools.partial(
                    memory.layout, steps=self.graph.steps, layers=self.layers,
                    bottom_need=self.bottom_need, shapes=shapes,
                    rewritten=self.graph.rewritten, itemsize=self.dtype.itemsize),
                self.graph.steps, self.layers, self.bottom_need, shapes, self.dtype.itemsize,
                self.budget, self.recompute, self.limit.name)
            self._take(liveness)
            # before the layers hear of it, or memory is taken
            self.limit.check_plan(liveness, new, self.blobs, self.graph.steps, self.layers)
            if len(self.layouts) >= LAYOUTS_KEPT:
                del self.layouts[next(iter(self.layouts))]
            self.layouts[key] = (liveness, new)
        liveness, self.layout = self.layouts[key]
        if liveness is not self.liveness:
            self._take(liveness)
        for s, flags in self.layout.flags:
            self.layers[s].apply_layout(*flags)

    def bind(self) -> None:
        """Give the blobs and scratch buffers the memory of the layout (:func:`bind`)."""
        self.gemms, self.bound_wholes, self.lives = bind(
            self.layout, self.liveness, self.blobs, self.layers, self.workspace, self.dtype)
        self.bound, self.in_backward = True, False

    def for_forward(self) -> None:
        """Bound, recomputed values in their forward memory."""
        if not self.bound:
            self.bind()
        elif self.in_backward:
            self.lives.restore()
            self.in_backward = False

    def for_backward(self) -> None:
        """Backward's forward runs bind values to other memory: the next forward binds
        them back."""
        if self.lives is not None:
            self.in_backward = True

    def release(self) -> None:
        """Drop every view of the workspace (it is about to move); :meth:`bind` gives them
        again."""
        if self.bound:
            release(self.liveness, self.blobs, self.layers)
            self.gemms, self.bound, self.lives, self.in_backward = {}, False, None, False


# -- binding a layout ----------------------------------------------------------------------
def bind(layout, plan, blobs, layers, workspace, dtype) -> tuple[dict, set[int], Lives | None]:
    """Give every planned blob (of ``blobs``, by number) and every scratch buffer of
    ``layers`` its memory in ``workspace``, as ``layout`` (of liveness ``plan``) places it.

    Returns the weight-gradient GEMMs, step -> ``[(layer, x rows, gy rows)]``,
    the ids of the blobs that other blobs are views into (the Slice parts of
    an input, say: a new array for one of them, a borrowed input, must bind
    its parts again), and, where backward runs forward again, the
    :class:`Lives` that binds each run's memory.
    """
    offset, whole, within = layout.offset, layout.whole, layout.within
    n_blobs, n_lives = len(blobs), len(plan.re_root)
    workspace.grow(layout.total)
    arrays: dict = {}
    wholes = np.unique(whole["data"][whole["data"] >= 0]).tolist()
    bound_wholes = {id(blobs[w]) for w in wholes if w < n_blobs}

    def array(kind, r):
        if (kind, r) in arrays:
            return arrays[(kind, r)]
        relives = kind == "data_re"  # keys are life ids
        host, at = int(whole[kind][r]), int(offset[kind][r])
        if r >= (n_lives if relives else n_blobs):  # a buffer holding several blobs' rows
            a = workspace.view(at, (layout.sizes[(kind, r)] // dtype.itemsize,), dtype)
        else:
            blob = blobs[plan.re_root[r]] if relives else blobs[r]
            if host >= 0:
                flat = array(kind, host)
                a = None if flat is None else _inside(flat, int(within[kind][r]), blob)
            elif at >= 0:
                a = workspace.view(at, blob.shape, dtype)
            elif not relives and r in plan.private:
                a = getattr(blob, kind)  # its own memory
            else:
                a = None  # never used by this net (no backward: no diff)
        arrays[(kind, r)] = a
        return a

    first_lives = []
    for r in set(plan.data_root) | set(plan.diff_root):
        if r in plan.private:
            continue
        # a root no step touches (a diff where nothing runs backward) gets no memory
        diff = array("diff", r) if r in plan.diff_life else None
        if plan.relived(r):  # its life in the forward pass
            data = array("data_re", int(plan.re_index[r]))
            first_lives.append((blobs[r], data))
        else:
            data = array("data", r) if r in plan.data_life else None
        blobs[r].bind(data, diff)
    for s, layer in enumerate(layers):
        for name, (shape, dtype_, _) in layer.scratch_specs.items():
            if (s, name) in layout.scratch:
                layer.scratch_memory[name] = workspace.view(layout.scratch[(s, name)], shape,
                                                            dtype_)
    gemms: dict = {}
    for group in layout.groups:
        layer = layers[group.after]
        (xr, x0), (gr, g0) = group.x, group.gy
        K, n = layer.param_row_widths()
        x = array(group.x_kind, xr).reshape(-1)[x0 : x0 + group.rows * K].reshape(-1, K)
        gy = array("diff", gr).reshape(-1)[g0 : g0 + group.rows * n].reshape(-1, n)
        gemms.setdefault(group.after, []).append((layer, x, gy))
    lives = None
    if plan.recompute is not None:
        # the buffers that hold lives inside them, for the views made at each run
        hosts = {h: array("data_re", h)
                 for h in np.unique(whole["data_re"][whole["data_re"] >= 0]).tolist()}
        lives = Lives(layout, plan, layers, workspace, dtype, first_lives, hosts, blobs)
    arrays.clear()  # array() refers to itself: left to the collector, the dict would
    # keep views of an old arena alive after the workspace grows
    return gemms, bound_wholes, lives


class Lives:
    """The memory of values that backward's forward runs write again: before each run
    (:meth:`run`), the lives it writes and its steps' scratch bound; before a forward
    pass (:meth:`restore`), the forward pass's. A run's views are made as it starts, so a
    long chain keeps offsets, not arrays, for every life."""

    def __init__(self, layout, plan, layers, workspace, dtype, first_lives, hosts, blobs):
        self.workspace, self.dtype, self.blobs, self.hosts = workspace, dtype, blobs, hosts
        self.re_root, self.offset = plan.re_root, layout.offset["data_re"]
        self.whole, self.within = layout.whole["data_re"], layout.within["data_re"]
        born = np.asarray(plan.re_born, np.int32)
        self.born = np.argsort(born, kind="stable")  # life ids by the action starting them
        self.starts = np.searchsorted(born[self.born],
                                      np.arange(len(plan.recompute.order) + 1))
        self.first = first_lives
        self.scratch_first, self.scratch_runs = [], {}
        runs_seen: dict[int, int] = {}
        for i, run in enumerate(plan.recompute.runs):
            for s in run if run is not None else ():
                layer = layers[s]
                if not layer.scratch_specs:
                    continue
                k = runs_seen[s] = runs_seen.get(s, -1) + 1
                table = layer.scratch_memory
                if k == 0:
                    self.scratch_first += [(table, name, table.get(name))
                                           for name in layer.scratch_specs]
                self.scratch_runs.setdefault(i, []).extend(
                    (table, name, layout.scratch_re[(s, name, k)], shape, dtype_)
                    for name, (shape, dtype_, _) in layer.scratch_specs.items()
                    if (s, name, k) in layout.scratch_re)

    def restore(self) -> None:
        """Bind the forward pass's lives and scratch."""
        for blob, data in self.first:
            blob.bind_data(data)
        for table, name, a in self.scratch_first:
            if a is None:
                table.pop(name, None)
            else:
                table[name] = a

    def run(self, action: int) -> None:
        """Bind the lives that forward action ``action`` writes, and its steps' scratch."""
        view, dtype, blobs = self.workspace.view, self.dtype, self.blobs
        for j in self.born[self.starts[action] : self.starts[action + 1]].tolist():
            blob, host = blobs[self.re_root[j]], int(self.whole[j])
            if host >= 0:
                blob.bind_data(_inside(self.hosts[host], int(self.within[j]), blob))
            else:
                blob.bind_data(view(int(self.offset[j]), blob.shape, dtype))
        for table, name, at, shape, dtype_ in self.scratch_runs.get(action, ()):
            table[name] = view(at, shape, dtype_)


def _inside(flat, first: int, blob):
    """The elements of ``flat`` from ``first`` on, as the memory of ``blob``."""
    return flat.reshape(-1)[first : first + blob.count].reshape(blob.shape)


def release(plan, blobs, layers) -> None:
    """Drop every view of the workspace that :func:`bind` gave (the arena is about to move)."""
    for r in set(plan.data_root) | set(plan.diff_root):
        if r not in plan.private:
            blobs[r].bind(None, None)
    for layer in layers:
        layer.scratch_memory.clear()


# -- setting up --------------------------------------------------------------------------
def set_up(fwd, limit) -> None:
    """Set up every layer of ``fwd`` (``(layer, bottoms, tops)`` per step) in order, each
    top refused by ``limit`` (a :class:`~unroll.engine.memory_limit.MemoryLimit`) as soon as its
    shape is known; a layer's unexpected exception becomes a NetError naming it."""
    _each_layer(fwd, limit, "set_up", "cannot set up")


def reshape(fwd, limit) -> None:
    """Reshape every layer of ``fwd`` in order to new input shapes, as :func:`set_up`."""
    _each_layer(fwd, limit, "reshape", "cannot reshape")


def _each_layer(fwd, limit, method: str, what: str) -> None:
    most = limit.bytes()
    for layer, bottoms, tops in fwd:
        try:
            getattr(layer, method)(bottoms, tops)
        except NetError:
            raise
        except Exception as e:
            raise layer_failure(layer, what, e, bottoms) from e
        limit.check_tops(layer, tops, most)


# -- the schedule ----------------------------------------------------------------------------
def schedule(fwd, bwd, regions) -> tuple[list, list]:
    """The run order as serial runs and concurrent regions, forward and backward.

    ``fwd`` lists ``(layer, bottoms, tops)`` per step, ``bwd`` the steps that
    run backward, ``(step, layer, tops, propagate_down, bottoms)``, last step
    first. Each item is a list of entries (run in order) or a region as
    (entries run before, [entries of each branch], entries run after):
    forward, the region's ``first`` steps run before its branches; backward
    (each list reversed) they run after them.
    """
    forward, backward, s = [], [], 0
    by_step = {entry[0]: entry for entry in bwd}
    for region in regions:
        forward.append(fwd[s : region.start])
        forward.append(([fwd[t] for t in region.first],
                        [[fwd[t] for t in b] for b in region.branches], []))
        backward.append([by_step[t] for t in range(region.start - 1, s - 1, -1)
                         if t in by_step])
        backward.append(([], [[by_step[t] for t in reversed(b) if t in by_step]
                              for b in region.branches],
                         [by_step[t] for t in reversed(region.first) if t in by_step]))
        s = region.stop
    forward.append(fwd[s:])
    backward.append([by_step[t] for t in range(len(fwd) - 1, s - 1, -1) if t in by_step])
    return forward, backward[::-1]


# -- running ---------------------------------------------------------------------------------
class running:
    """One run of a net: the policy's BLAS threads and the memory ``gate`` open; a layer's
    exception becomes a NetError naming it (one try around the loop: the hot path stays a
    bare call per layer). Entering gives whether the concurrent ``regions`` run at once: with
    two free cores or more, one BLAS thread a branch (two threads asking one OpenBLAS pool
    for all cores were slower than one serial run); else in the serial order, which their
    memory plan also allows. A class, not a generator: every net run pays for it."""

    __slots__ = ("gate", "fwd", "what", "at_once", "blas")

    def __init__(self, gate, regions, fwd, what: str):
        free = num_threads()
        self.at_once = bool(regions) and free >= 2
        self.blas = run_threads(1 if self.at_once else free)
        self.gate, self.fwd, self.what = gate, fwd, what

    def __enter__(self) -> bool:
        self.blas.__enter__()
        self.gate.open = True
        return self.at_once

    def __exit__(self, kind, error, traceback) -> None:
        self.gate.open = False
        self.blas.__exit__(kind, error, traceback)
        if kind is None or issubclass(kind, NetError) or not issubclass(kind, Exception):
            return
        failure = failure_in(error, self.fwd, f"failed in {self.what}")
        if failure is not None:
            raise failure from error
        # else not a layer's: the engine's own bug, raised on with its traceback


def run_forward(fwd, items) -> None:
    """Every layer's forward: ``fwd`` in order, or the ``items`` of :func:`schedule`."""
    if items is None:
        for layer, bottoms, tops in fwd:
            layer.forward(bottoms, tops)
    else:
        _run_items(items, _forward_entry, "failed in forward")


def recompute_schedule(fwd, bwd, recompute) -> list:
    """Backward as the actions of a :class:`~unroll.engine.memory.Recompute` plan:
    ``(action, fwd entries, None)`` for a forward run, ``(None, None, bwd entries)`` for
    a segment's backward."""
    bounds = [0, *recompute.cuts, len(fwd)]
    entries: list[list] = [[] for _ in bounds[1:]]
    for e in bwd:  # in backward's order within each segment
        entries[bisect.bisect_right(bounds, e[0]) - 1].append(e)
    return [(i, [fwd[s] for s in recompute.runs[i]], None) if a >= 0 else
            (None, None, entries[~a]) for i, a in enumerate(recompute.order)]


def run_backward(bwd, items, zero_before, gemms, segments=None, lives=None) -> None:
    """Every backward of ``bwd`` (or of the ``items`` of :func:`schedule`): diffs that
    backward reads before anything writes them are zeroed first (``zero_before``, by step),
    and after the last sharer's backward the weight-gradient GEMM of ``gemms`` runs. With
    ``segments`` (:func:`recompute_schedule`), its actions in order, each forward run in
    the memory ``lives`` (:class:`Lives`) binds for it."""
    if segments is not None:
        for action, again, entries in segments:
            if entries is not None:
                run_backward(entries, None, zero_before, gemms)
                continue
            lives.run(action)
            for layer, bottoms, tops in again:
                layer.forward(bottoms, tops)
    elif items is None:
        for s, layer, tops, prop, bottoms in bwd:
            if s in zero_before:
                for blob in zero_before[s]:
                    blob.diff.fill(0)
            layer.backward(tops, prop, bottoms)
            if s in gemms:
                for sharer, x, gy in gemms[s]:
                    sharer.param_backward(x, gy)  # every sharer's rows: one GEMM
    else:
        _run_items(items, functools.partial(_backward_entry, zero_before=zero_before,
                                            gemms=gemms), "failed in backward")


def layer_failure(layer, what: str, error: Exception, bottoms) -> NetError:
    """A layer's unexpected exception as a NetError naming the layer and its bottoms."""
    shapes = ", ".join(f"'{b.name}' {b.shape}" for b in bottoms) or "none"
    kind = layer.type if layer.type != "Python" else layer_kind(layer.param)
    return NetError(f"layer '{layer.name}' ({kind}) {what}: "
                    f"{type(error).__name__}: {error}; bottoms: {shapes}")


def failure_in(error: Exception, fwd, what: str) -> NetError | None:
    """``error`` as a NetError naming the layer of ``fwd`` (``(layer, bottoms, tops)`` per
    step) whose run raised it: the one a run loop here was calling, else the outermost
    frame of the traceback whose ``self`` is one of them. None where no layer's code
    raised it."""
    bottoms_of = {id(layer): bottoms for layer, bottoms, _ in reversed(fwd)}
    tb, found = error.__traceback__, None
    while tb is not None:
        local = tb.tb_frame.f_locals
        if tb.tb_frame.f_code in _RUN_LOOPS and id(local.get("layer")) in bottoms_of:
            found = local["layer"]
            break
        if found is None and id(local.get("self")) in bottoms_of:
            found = local["self"]
        tb = tb.tb_next
    return None if found is None else layer_failure(found, what, error, bottoms_of[id(found)])


def layer_kind(param) -> str:
    """A LayerParameter's type, and for a Python layer the module and class it runs."""
    if param.type != "Python":
        return param.type
    spec = param.python_param
    return f"Python, module '{spec.module}', class '{spec.layer}'"


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
            raise layer_failure(layer, what, e, bottoms) from e


def _run_items(items, run, what: str) -> None:
    """Run a schedule: serial lists in order; for a region, its entries before, then its
    branches at once (one on this thread, the others on a pool), then its entries after."""
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


#: the loops whose ``layer`` is the one running (see failure_in)
_RUN_LOOPS = (run_forward.__code__, run_backward.__code__, _forward_entry.__code__,
              _backward_entry.__code__)
