"""Running a net: a layout bound to the workspace, and one loop over one schedule.

:func:`bind` gives every planned blob and scratch buffer the workspace memory
a :class:`~unroll.engine.memory.Layout` placed it at (and :func:`release` takes
it back when the workspace moves). :func:`actions` turns the net's
:class:`~unroll.engine.memory.Schedule` (the forward pass, backward, the forward runs
backward makes again, the weight-gradient GEMMs, the zeroing of diffs) into the tuples
:func:`run` runs, in one loop; the memory of a value run again is an action of the
schedule too, not a mechanism of the executor. The loop is a bare call per layer: a
layer's exception is named by the net afterwards (:class:`running`), not by a ``try``
around each call.
"""

from __future__ import annotations

import functools
import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from unroll.core.errors import NetError
from unroll.engine import memory
from unroll.engine.threads import num_threads, run_threads

__all__ = ["NetMemory", "actions", "bind", "recomputes", "release", "run"]

#: layouts a net keeps, by input shapes: a bucket's full batches and its last one
LAYOUTS_KEPT = 2

#: what the tuples of :func:`actions` do (their first field)
FORWARD, BACKWARD, ZERO, GEMM, BIND, REGION = range(6)


def recomputes(budget, policy) -> bool:
    """Whether a net given memory ``budget`` (bytes, or None) and recompute ``policy`` (a
    :class:`~unroll.engine.memory.Policy` or None, as :func:`unroll.engine.memory.policy_named`
    gives it) may run forward again in backward: a budget or a policy, but ``"none"``.

    >>> from unroll.engine.memory import policy_named
    >>> recomputes(None, None), recomputes(10**6, None), recomputes(None, policy_named("sqrt"))
    (False, True, True)
    >>> recomputes(10**6, policy_named("none"))
    False
    """
    return (budget is not None or policy is not None) and not isinstance(
        policy, memory.NoRecompute)


class NetMemory:
    """A net's memory plan, applied: the liveness of its run order, the layouts of its last
    input shapes, the one bound to the workspace now, and the actions of its schedule.

    ``blobs`` are the net's blobs by number, ``graph`` its run order
    (:class:`unroll.graph.Graph`) and ``layers`` its layers in that order;
    ``limit`` (a :class:`~unroll.engine.memory_limit.MemoryLimit`) refuses a layout
    too big before any of it is allocated. ``fwd`` and ``bwd`` are the net's steps
    forward and backward; ``schedule`` the :class:`~unroll.engine.memory.Schedule` of the
    liveness and layout taken (made once per layout), ``actions`` its tuples
    (:func:`actions`), backward's from ``backward`` on, which :func:`run` runs;
    ``bound_wholes`` the ids of the blobs that other blobs are views into. ``budget``
    (bytes) or a ``recompute`` policy (:func:`unroll.engine.memory.policy_named`) plan recomputation
    (:func:`unroll.engine.memory.within_budget`) of ``fwd`` in backward (``bwd``); not
    with concurrent ``regions``.
    """

    def __init__(self, blobs, graph, layers, bottom_need, workspace, dtype, limit, fwd=(),
                 bwd=(), budget=None, recompute=None, regions=()):
        recompute = memory.policy_named(recompute)
        if recomputes(budget, recompute) and regions:
            raise NetError(f"net '{limit.name}': concurrent=True runs branches at once, and "
                           f"a memory budget recomputes segments in order; choose one")
        self.blobs, self.graph, self.layers, self.bottom_need = blobs, graph, layers, bottom_need
        self.workspace, self.dtype, self.limit = workspace, dtype, limit
        self.fwd, self.bwd, self.budget, self.recompute = fwd, bwd, budget, recompute
        self.regions = regions
        self.make, self.base = None, None
        self.liveness = self.layout = None
        self.layouts: dict = {}  # input shapes -> a recent layout
        self.bound, self.bound_wholes = False, set()
        self.schedule: memory.Schedule | None = None
        self.actions: list = []
        self.backward = 0

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
        self.liveness = liveness
        # the schedule comes with the layout (lay_out, which follows): a long chain's takes
        # a while to list, and a planned net's is another liveness's
        self.schedule, self.actions = None, []
        self.layouts.clear()

    def _schedule_of(self, liveness, layout) -> memory.Schedule:
        """The schedule of ``liveness`` with the weight-gradient GEMMs of ``layout``."""
        return memory.schedule(
            len(self.fwd), [entry[0] for entry in self.bwd], liveness.zero_before,
            liveness.recompute, [group.after for group in layout.groups] if layout else (),
            self.regions)

    def _actions(self, gemms=(), relive=((), {})) -> None:
        """The actions of the schedule; ``gemms`` and ``relive`` are what :func:`bind`
        gives (none where nothing is bound: no batched weight gradients, no lives run
        again)."""
        self.actions, self.backward = actions(self.schedule, self.fwd, self.bwd, self.blobs,
                                              gemms, relive)

    def lay_out(self, key, planned: bool) -> None:
        """The layout for the blobs' current shapes (``key``: the input shapes), told to the
        layers; the workspace grows, and the blobs get their memory, at the next run
        (:meth:`bind`). ``planned=False``: every blob keeps memory of its own."""
        self.bound = False
        check = functools.partial(self.limit.check_plan, self.liveness, blobs=self.blobs,
                                  steps=self.graph.steps, layers=self.layers)
        if not planned:
            if self.budget is not None or recomputes(self.budget, self.recompute):
                raise NetError(f"net '{self.limit.name}': plan_memory=False keeps every blob, "
                               f"so a memory budget cannot be planned")
            check(None)
            self.layout = None
            if self.schedule is None:
                self.schedule = self._schedule_of(self.liveness, None)
                self._actions()
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
                self.budget, self.recompute, self.limit.name, self.graph.rewritten)
            # before the layers hear of it, or memory is taken
            self.limit.check_plan(liveness, new, self.blobs, self.graph.steps, self.layers)
            if len(self.layouts) >= LAYOUTS_KEPT:
                del self.layouts[next(iter(self.layouts))]
            # a long chain's schedule takes a while to list: once per layout
            self.layouts[key] = (liveness, new, self._schedule_of(liveness, new))
        self.liveness, self.layout, self.schedule = self.layouts[key]
        self._actions()
        for s, flags in self.layout.flags:
            self.layers[s].apply_layout(*flags)

    def bind(self) -> None:
        """Give the blobs and scratch buffers the memory of the layout (:func:`bind`), and
        the schedule its GEMMs' rows and its lives."""
        gemms, self.bound_wholes, relive = bind(
            self.layout, self.liveness, self.blobs, self.layers, self.workspace, self.dtype)
        self.bound = True
        self._actions(gemms, relive)

    def for_forward(self) -> None:
        """Bound, before a forward pass."""
        if not self.bound:
            self.bind()

    def release(self) -> None:
        """Drop every view of the workspace (it is about to move); :meth:`bind` gives them
        again."""
        if self.bound:
            release(self.liveness, self.blobs, self.layers)
            self.bound = False
            self._actions()


# -- binding a layout ----------------------------------------------------------------------
def bind(layout, plan, blobs, layers, workspace, dtype) -> tuple[list, set[int], tuple]:
    """Give every planned blob (of ``blobs``, by number) and every scratch buffer of
    ``layers`` its memory in ``workspace``, as ``layout`` (of liveness ``plan``) places it.

    Returns, per weight-gradient group of the layout, its GEMM ``(layer, x rows, gy
    rows, the layer's batched backward)``; the ids of the blobs that other blobs are views
    into (the Slice parts of an input, say: a new array for one of them, a borrowed input,
    must bind its parts again); and, where backward runs forward again, the actions that bind the
    memory of the values run again (:func:`relive`; else none).
    """
    offset, whole, within = layout.offset, layout.whole, layout.within
    n_buffers = plan.buffers
    workspace.grow(layout.total)
    arrays: dict = {}
    wholes = np.unique(whole["data"][whole["data"] >= 0]).tolist()
    bound_wholes = {id(blobs[w]) for w in wholes if w < len(blobs)}

    def array(kind, r):
        if (kind, r) in arrays:
            return arrays[(kind, r)]
        host, at = int(whole[kind][r]), int(offset[kind][r])
        if r >= n_buffers:  # a buffer holding several blobs' rows
            a = workspace.view(at, (layout.sizes[(kind, r)] // dtype.itemsize,), dtype)
        else:
            blob = blobs[plan.root_of_buffer(r) if kind == "data" else r]
            if host >= 0:
                flat = array(kind, host)
                a = None if flat is None else _inside(flat, int(within[kind][r]), blob)
            elif at >= 0:
                a = workspace.view(at, blob.shape, dtype)
            elif r in plan.private:
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
        first = plan.data_buffers(r)[0]  # its buffer in the forward pass
        data = array("data", first) if first in plan.data_life else None
        if plan.relived(r):
            first_lives.append((blobs[r], data))
        blobs[r].bind(data, diff)
    for s, layer in enumerate(layers):
        for name, (shape, dtype_, _) in layer.scratch_specs.items():
            if (s, name, -1) in layout.scratch:
                layer.scratch_memory[name] = workspace.view(layout.scratch[(s, name, -1)],
                                                            shape, dtype_)
    gemms = []
    for group in layout.groups:
        layer = layers[group.after]
        (xr, x0), (gr, g0) = group.x, group.gy
        batched = layer.memory.batched_param_gradient
        K, n = batched.row_widths(layer)
        x = array("data", xr).reshape(-1)[x0 : x0 + group.rows * K].reshape(-1, K)
        gy = array("diff", gr).reshape(-1)[g0 : g0 + group.rows * n].reshape(-1, n)
        gemms.append((layer, x, gy, batched.backward))
    lives = ((), {})
    if plan.recompute is not None:
        # the buffers that hold buffers of values run again, for the views made at each run
        inside = whole["data"][len(blobs):n_buffers]
        hosts = {h: array("data", h) for h in np.unique(inside[inside >= 0]).tolist()}
        lives = relive(layout, plan, layers, workspace, first_lives, hosts, blobs)
    arrays.clear()  # array() refers to itself: left to the collector, the dict would
    # keep views of an old arena alive after the workspace grows
    return gemms, bound_wholes, lives


def relive(layout, plan, layers, workspace, first_lives, hosts, blobs) -> tuple[list, dict]:
    """The actions that bind the memory of values backward's forward runs write again:
    the forward pass's (its ``first_lives``, ``(blob, array)``, and its steps' scratch),
    and per forward run of ``plan.recompute``, the buffers it writes and its steps' scratch.
    Each is ``(BIND, None, binder, what, where)``; a run's views are made as it starts: a
    long chain keeps offsets, not arrays, for every buffer.
    """
    restore = [(BIND, None, _given, tuple(b for b, _ in first_lives),
                tuple(a for _, a in first_lives))] if first_lives else []
    n_blobs = len(blobs)
    offset, whole, within = (layout.offset["data"][n_blobs:], layout.whole["data"][n_blobs:],
                             layout.within["data"][n_blobs:])
    views = functools.partial(_views, workspace)
    born = np.asarray(plan.written_by, np.int64)
    ids = np.argsort(born, kind="stable")  # the buffers by the run writing them
    starts = np.searchsorted(born[ids], np.arange(len(plan.recompute.order) + 1))
    runs: dict[int, list] = {}
    roots = plan.root_of
    for i in range(len(plan.recompute.order)):
        lives = ids[starts[i] : starts[i + 1]]
        if not len(lives):
            continue
        own, inside = lives[whole[lives] < 0], lives[whole[lives] >= 0]
        runs[i] = [(BIND, None, views, tuple(blobs[roots[j]] for j in own.tolist()),
                    offset[own])]  # arrays: 8 bytes a buffer
        if len(inside):
            runs[i].append((BIND, None, functools.partial(
                _insides, tuple(hosts[h] for h in whole[inside].tolist())),
                tuple(blobs[roots[j]] for j in inside.tolist()), within[inside]))
    seen: dict[int, int] = {}
    for i, run_steps in enumerate(plan.recompute.runs):
        for s in run_steps if run_steps is not None else ():
            layer = layers[s]
            if not layer.scratch_specs:
                continue
            k = seen[s] = seen.get(s, -1) + 1
            table = layer.scratch_memory
            if k == 0:
                restore.append((BIND, None, _scratch_given, table,
                                tuple((name, table.get(name)) for name in layer.scratch_specs)))
            places = tuple((name, layout.scratch[(s, name, k)], shape, dtype_)
                           for name, (shape, dtype_, _) in layer.scratch_specs.items()
                           if (s, name, k) in layout.scratch)
            if places:
                runs.setdefault(i, []).append(
                    (BIND, None, functools.partial(_scratch_views, workspace), table, places))
    return restore, runs


def _views(workspace, blobs, offsets) -> None:
    """Bind the data of ``blobs`` to views of ``workspace`` at byte ``offsets``."""
    view = workspace.view
    for blob, at in zip(blobs, offsets.tolist()):
        blob.bind_data(view(at, blob.shape, blob.dtype))


def _insides(hosts, blobs, firsts) -> None:
    """Bind the data of ``blobs`` inside the flat ``hosts``, from elements ``firsts`` on."""
    for blob, flat, first in zip(blobs, hosts, firsts.tolist()):
        blob.bind_data(_inside(flat, first, blob))


def _given(blobs, arrays) -> None:
    for blob, data in zip(blobs, arrays):
        blob.bind_data(data)


def _scratch_views(workspace, table, places) -> None:
    """Give a layer's scratch ``table`` views of ``workspace``: ``(name, offset, shape,
    dtype)`` each."""
    for name, at, shape, dtype in places:
        table[name] = workspace.view(at, shape, dtype)


def _scratch_given(table, arrays) -> None:
    for name, a in arrays:
        if a is None:
            table.pop(name, None)
        else:
            table[name] = a


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
    check_tops = limit.tops_check()
    for layer, bottoms, tops in fwd:
        try:
            getattr(layer, method)(bottoms, tops)
        except NetError:
            raise
        except Exception as e:
            raise layer_failure(layer, what, e, bottoms) from e
        check_tops(layer, tops)


# -- the schedule's actions ----------------------------------------------------------------
def actions(plan, fwd, bwd, blobs, gemms=(), relive=((), {})) -> tuple[list, int]:
    """The tuples :func:`run` runs for schedule ``plan`` (a
    :class:`~unroll.engine.memory.Schedule`), and where backward's start.

    ``fwd`` lists ``(layer, bottoms, tops)`` per step, ``bwd`` the steps that run backward,
    ``(step, layer, tops, propagate_down, bottoms)``; ``blobs`` are the net's blobs by
    number, ``gemms`` the GEMMs of the layout's weight-gradient groups and ``relive`` the
    actions binding the lives of the values run again (:func:`bind`). Each tuple is
    ``(kind, who, a, b, c)``: ``who`` the layer that runs, if any.
    """
    restore, runs = relive
    # a step's tuple is made once, however many runs run it: a long chain's schedule is
    # pointers, not tuples
    forwards = [(FORWARD, layer, bottoms, tops, None) for layer, bottoms, tops in fwd]
    backwards = {s: (BACKWARD, layer, tops, prop, bottoms)
                 for s, layer, tops, prop, bottoms in bwd}
    zeros: dict[int, tuple] = {}

    def flat(part) -> list:
        out: list = []
        for action in part:
            kind, at = action.kind, action.at
            if kind == "forward":
                out.append(forwards[at])
            elif kind == "backward":
                out.append(backwards[at])
            elif kind == "zero":
                if at not in zeros:
                    zeros[at] = (ZERO, None, blobs[at], None, None)
                out.append(zeros[at])
            elif kind == "gemm":
                if gemms:  # else the sharers compute their own weight gradients
                    out.append((GEMM, *gemms[at]))
            elif kind == "relive":
                out += runs.get(at, ())
            elif kind == "restore":
                out += restore
            else:
                before, branches, after = action.parts
                out.append((REGION, None, flat(before), [flat(b) for b in branches],
                            flat(after)))
        return out

    forward = flat(plan.actions[: plan.backward])
    return forward + flat(plan.actions[plan.backward :]), len(forward)


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


def run(actions, start: int = 0, stop: int | None = None, at_once: bool = False) -> None:
    """Run ``actions[start:stop]`` (of :func:`actions`) in order: the one loop of every run.
    A region runs its actions before, then its branches, at once where ``at_once`` (one
    on this thread, the others on a pool), then its actions after."""
    for kind, who, a, b, c in itertools.islice(actions, start, stop):
        if kind == FORWARD:
            who.forward(a, b)
        elif kind == BACKWARD:
            who.backward(a, b, c)
        elif kind == GEMM:
            c(who, a, b)  # every sharer's rows: one GEMM
        elif kind == ZERO:
            a.diff.fill(0)
        elif kind == BIND:  # values run again: their memory
            a(b, c)
        else:
            _region(a, b, c, at_once)


_branch_pool: ThreadPoolExecutor | None = None


def _region(before, branches, after, at_once: bool) -> None:
    global _branch_pool
    run(before)
    if not at_once:
        for branch in branches:
            run(branch)
    else:
        if _branch_pool is None:
            _branch_pool = ThreadPoolExecutor(thread_name_prefix="unroll-branch")
        others = [_branch_pool.submit(run, branch) for branch in branches[1:]]
        try:
            run(branches[0])
        finally:
            for future in others:
                future.exception()  # every branch has finished before anything goes on
        for future in others:
            future.result()
    run(after)


def layer_failure(layer, what: str, error: Exception, bottoms) -> NetError:
    """A layer's unexpected exception as a NetError naming the layer and its bottoms."""
    shapes = ", ".join(f"'{b.name}' {b.shape}" for b in bottoms) or "none"
    kind = layer.type if layer.type != "Python" else layer_kind(layer.param)
    return NetError(f"layer '{layer.name}' ({kind}) {what}: "
                    f"{type(error).__name__}: {error}; bottoms: {shapes}")


def failure_in(error: Exception, fwd, what: str) -> NetError | None:
    """``error`` as a NetError naming the layer of ``fwd`` (``(layer, bottoms, tops)`` per
    step) whose run raised it: the one :func:`run` was calling (on whichever thread),
    else the outermost frame of the traceback whose ``self`` is one of them. None where no
    layer's code raised it."""
    bottoms_of = {id(layer): bottoms for layer, bottoms, _ in reversed(fwd)}
    tb, found = error.__traceback__, None
    while tb is not None:
        local = tb.tb_frame.f_locals
        if tb.tb_frame.f_code is run.__code__ and id(local.get("who")) in bottoms_of:
            found = local["who"]
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
