"""The Solver: Caffe's Solver::Step and ApplyUpdate over a net, with callbacks and snapshots.

One :class:`Solver` runs every solver type with BVLC Caffe's update math,
step for step (``solver.cpp``, ``sgd_solver.cpp``, ``adam_solver.cpp``, ...),
and splits it as Caffe does:

- the update rules, one registered function per type (SGD, Nesterov,
  AdaGrad, RMSProp, AdaDelta, Adam, and AdamW): :mod:`unroll.train.update_rules`;
- the learning-rate policies, each one's fields, checks and formula in one
  place, with a warmup that composes with any: :mod:`unroll.train.lr_policies`;
- the callbacks (Caffe's ``Solver::Callback``) ``on_start``,
  ``on_gradients_ready`` and ``on_update``, into which the all-reduce over
  ranks, the non-finite check, gradient clipping and the CUDA-graph replay
  plug, in a fixed order: :mod:`unroll.train.solver_callbacks`;
- one update over the flat buffers (Normalize, Regularize, the rule, ``data
  -= diff``): :mod:`unroll.train.update_spans`; the history buffers:
  :mod:`unroll.train.solver_history`; the SolverParameter and its checks:
  :mod:`unroll.train.solver_param`; the snapshot files:
  :mod:`unroll.train.solver_snapshot`.

One iteration of :meth:`Solver.step` is, in this order: ``on_start``; the
``iter_size`` forward and backward passes (diffs cleared first, gradients
summed); the learning rate of ``iter``; ``on_gradients_ready`` (all-reduce,
non-finite check, clipping: as in Caffe, clipping sees the diffs summed over
passes and ranks, before they are averaged); per span: average over passes
(``diff *= 1 / (iter_size * ranks)``), weight decay (L2 ``diff += weight_decay
* decay_mult * data``, L1 with ``sign(data)``), the rule with ``local_lr = rate
* lr_mult``; ``data -= diff``; ``iter += 1``; ``on_update``.

Only the net's ``learnable_params`` are updated: the owners of shared params,
each exactly once, in place (sharers hold views of the owner's memory). A
param with ``lr_mult: 0`` is left alone entirely (its history stays zero).
After an update the diffs hold the applied step, not the gradient, as in
Caffe. Scalars enter the update in the net's dtype. Rank 0 broadcasts the
params at the start and after a restore, and writes the snapshots.
"""

from __future__ import annotations

import collections
import logging
import operator
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np

from unroll.core.proto import NetParameter, read_binary
from unroll.engine.backend import device_of, module_of
from unroll.engine.param_store import LearnableParam, ParamStore
from unroll.train import solver_snapshot as snapshots
from unroll.train.distributed import Comm
from unroll.train.lr_policies import LR_POLICIES, check_lr_policy, learning_rate
from unroll.train.solver_callbacks import (
    NONFINITE_POLICIES,
    AllReduce,
    GradientClipping,
    GraphReplay,
    Iteration,
    NonFiniteError,
    SkippedStep,
    SolverCallback,
    clip_gradients,
    nonfinite_check,
)
from unroll.train.solver_history import SolverHistory
from unroll.train.solver_param import (
    IGNORED_FIELDS,
    SolverError,
    build_param,
    check_common,
    is_set,
    require_set,
)
from unroll.train.update_rules import SOLVERS, UpdateRule, register_solver, rule_for, usual_fields
from unroll.train.update_spans import SpanCache, apply_update

__all__ = ["LR_POLICIES", "NONFINITE_POLICIES", "NonFiniteError", "SOLVERS", "SkippedStep",
           "Solver", "SolverCallback", "SolverError", "TrainableNet", "UpdateRule",
           "register_solver", "usual_fields"]

log = logging.getLogger(__name__)


class TrainableNet(Protocol):
    """The net interface a :class:`Solver` drives: a Net, a BucketedModel, or your own.

    ``forward(**inputs)`` sets ``loss`` (a net may also offer ``device_loss``, the
    same value left on its device: the solver then reads losses back only when
    they are displayed or asked for); ``backward()`` ADDS the gradients into
    the param diffs; ``learnable_params`` are the owners the solver updates,
    all held by ``store`` (the solver clears and reduces the store's diffs);
    ``to_proto()``/``copy_from()`` write and read the weights as a .caffemodel.
    """

    loss: float
    learnable_params: list[LearnableParam]
    store: ParamStore

    def forward(self, **inputs) -> dict: ...

    def backward(self) -> None: ...

    def to_proto(self) -> NetParameter: ...

    def copy_from(self, source, strict: bool = False) -> None: ...


_NET_MEMBERS = tuple(TrainableNet.__annotations__) + tuple(
    name for name, value in vars(TrainableNet).items()
    if callable(value) and not name.startswith("_")
)


class Solver:
    """Trains ``net`` with one of Caffe's solvers; snapshots and restores exactly.

    ``solver_param`` is a SolverParameter, a solver prototxt path or text;
    keywords set SolverParameter fields on top of it (``type``, ``base_lr``,
    ``momentum``, ``momentum2``, ``delta``, ``weight_decay``, ``lr_policy``,
    ``gamma``, ``stepsize``, ``max_iter``, ``clip_gradients``, ``iter_size``,
    ``snapshot``, ``snapshot_prefix``, ...). ``type`` is one of ``SOLVERS``
    (any case), ``lr_policy`` one of ``LR_POLICIES`` (unset: "fixed"). Fields
    about test nets and devices are ignored with a warning; ``weights`` are
    loaded at construction, as Caffe does. Fields whose Caffe default would
    silently change the method must be given (:func:`usual_fields`, an lr
    policy's ``required``); a value given is used as given, 0 included.

    ``nonfinite`` says what an iteration whose loss or gradient is not finite
    does: None applies it, as Caffe does; ``"stop"`` raises
    :class:`NonFiniteError` before the update; ``"skip"`` leaves weights and
    history alone, counts the iteration and records it in ``skipped`` (a list
    of :class:`SkippedStep`); skip number ``max_skipped + 1`` raises. ``comm``
    (:func:`unroll.train.distributed.init`) trains data-parallel: gradients
    are summed over ranks before each update, rank 0 writes the snapshots.
    ``net`` is a :class:`TrainableNet`; its store is packed into flat buffers.

    Attributes: ``iter`` (updates done), ``loss`` (mean of the last
    ``average_loss`` iteration losses), ``rate`` (of the last update),
    ``param``, ``type``, ``history`` (Caffe's history blobs), ``graphs``,
    ``callbacks``.

    >>> from unroll.engine.net import Net
    >>> net = Net('''
    ...   layer { name: "in" type: "Input" top: "x" top: "y"
    ...           input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
    ...   layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p"
    ...           inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
    ...   layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y" top: "loss" }''')
    >>> solver = Solver(net, type="Adam", base_lr=0.01, momentum=0.9, momentum2=0.999,
    ...                 lr_policy="step", gamma=0.5, stepsize=100, nonfinite="stop")
    >>> x, y = np.ones((4, 3)), np.zeros((4, 2))
    >>> loss = solver.step(3, feed=lambda i: {"x": x, "y": y})
    >>> solver.iter
    3
    """

    def __init__(self, net: TrainableNet, solver_param=None, comm: Comm | None = None,
                 nonfinite: str | None = None, max_skipped: int | None = None, **fields):
        check = nonfinite_check(nonfinite, max_skipped)
        self.nonfinite, self.max_skipped = nonfinite, max_skipped
        #: the iterations skipped under nonfinite="skip", oldest first
        self.skipped: list[SkippedStep] = []
        missing = [name for name in _NET_MEMBERS if not hasattr(net, name)]
        if missing:
            raise TypeError(f"Solver needs a net with {', '.join(_NET_MEMBERS)}; "
                            f"{type(net).__name__} lacks {', '.join(missing)}")
        param = build_param(solver_param, fields)
        self._rule = rule_for(param)
        self.type = param.type = self._rule.name
        param.ClearField("solver_type")
        check_common(param)
        self._rule.check(param)
        require_set(param, self._rule.required, self._rule.name, "usually")
        self.lr_policy = check_lr_policy(param).name
        self.param, self.net, self._store = param, net, net.store
        self.comm = comm if comm is not None else Comm()
        self.iter, self.current_step, self.rate = 0, 0, float("nan")
        self._losses: collections.deque = collections.deque(maxlen=param.average_loss)
        self._spans = SpanCache(self._rule.elementwise)
        self._history = SolverHistory(net, self._rule.slots)
        self._replay = GraphReplay()
        builtins = [AllReduce(self.comm), check,
                    GradientClipping(param.clip_gradients) if param.clip_gradients >= 0 else None]
        self._callbacks = [c for c in builtins if c is not None] + [self._replay]
        _warn_ignored(param, net)
        for weights in param.weights:
            net.copy_from(weights)
        self._history.sync()
        if self._store.data is not None and self.comm.device not in (
            None, device_of(module_of(self._store.data))
        ):
            raise SolverError(
                f"the net's params are on the {device_of(module_of(self._store.data))}, but "
                f"{self.comm!r} reduces arrays on the {self.comm.device}: get the communicator "
                f"with unroll.train.distributed.init(device) for the net's device")
        self._broadcast()

    def __repr__(self) -> str:
        return (f"Solver(type={self.type!r}, iter={self.iter}, lr_policy={self.lr_policy!r}, "
                f"base_lr={self.param.base_lr:g})")

    @property
    def history(self) -> list:
        """The history arrays in Caffe's order: slot 0 of every param, then slot 1 (Adam: m, v)."""
        return self._history.arrays()

    @property
    def graphs(self):
        """None, or a :class:`unroll.engine.cuda_graph.StepGraphs` that replays each step's
        clear, forward and backward as one CUDA graph (iter_size 1); settable."""
        return self._replay.graphs

    @graphs.setter
    def graphs(self, graphs) -> None:
        self._replay.graphs = graphs

    @property
    def callbacks(self) -> tuple[SolverCallback, ...]:
        """The callbacks in the order each hook runs them (:mod:`unroll.train.solver_callbacks`)."""
        return tuple(self._callbacks)

    def add_callback(self, callback: SolverCallback) -> None:
        """Add ``callback`` after the built-ins and the callbacks added before it (Caffe's
        ``add_callback``); the CUDA-graph replay stays last."""
        if not isinstance(callback, SolverCallback):
            raise TypeError(f"add_callback: expected a SolverCallback, found "
                            f"{type(callback).__name__}")
        self._callbacks.insert(len(self._callbacks) - 1, callback)

    def _broadcast(self) -> None:
        """Rank 0's params and history on every rank."""
        if self._store.data is not None:
            for buffer in (self._store.data, *self._history.buffers):
                self.comm.broadcast(buffer)

    def get_learning_rate(self) -> float:
        """The learning rate the next update will use (at ``self.iter``); changes nothing."""
        return learning_rate(self.param, self.iter, self.current_step)[0]

    def clip_gradients(self) -> None:
        """Caffe's ClipGradients on the net's diffs, if ``clip_gradients`` is set (an
        iteration's :class:`~unroll.train.solver_callbacks.GradientClipping` calls it)."""
        if self.param.clip_gradients >= 0:
            clip_gradients(self._store.diff, self.param.clip_gradients)

    # -- one update ---------------------------------------------------------------------
    def update(self) -> bool:
        """Apply one update from the gradients now in the net's diffs (Caffe's ApplyUpdate),
        with ``on_gradients_ready`` and ``on_update``; for loops that run the passes
        themselves. Increments ``iter``. Returns whether the update was applied: False for
        an iteration skipped by ``nonfinite="skip"`` (the net's last loss is the one checked).
        """
        loss = _unread_loss(self.net) if self.nonfinite is not None else None
        it = Iteration(self.iter, passes=self.param.iter_size, loss_count=1, loss=loss)
        return self._update(it).applied

    def _update(self, it: Iteration) -> Iteration:
        params = self._history.sync()
        it.rate, current_step = learning_rate(self.param, self.iter, self.current_step)
        self.rate = it.rate
        if self.param.display and self.iter % self.param.display == 0 and self.comm.rank == 0:
            log.info("Iteration %d, lr = %g", self.iter, it.rate)
        for callback in self._callbacks:
            callback.on_gradients_ready(self, it)
            if not it.applied:
                break
        self.current_step = current_step
        if it.applied:
            apply_update(self._rule, self.param,
                         self._spans.get(params, self.param.weight_decay, self._store.data),
                         self._store.data, self._store.diff, self._history.buffers, it.rate,
                         self.iter, it.passes)
        self.iter += 1
        for callback in self._callbacks:
            callback.on_update(self, it)
        return it

    # -- iterations ---------------------------------------------------------------------
    def step(self, iters: int = 1, feed=None) -> float | None:
        """Run ``iters`` iterations; returns the last one's loss (None if ``iters`` is 0),
        the one loss this call reads back from the device.

        ``feed`` gives the inputs of each pass: a callable ``feed(k) -> {input
        name: array}`` with ``k = iter * iter_size + pass`` (so a restored solver
        asks for the batches it would have seen), an iterator of such dicts, or
        one dict for every pass; None uses what the input blobs hold.
        ``solver.loss`` is the mean loss of the last ``average_loss`` iterations.
        Under ``nonfinite="skip"`` a skipped iteration still counts (its loss,
        returned if it is the last, is the one checked); ``solver.skipped`` says
        which were. For example, ``solver.step(100, feed=lambda k: batches[k])``.
        """
        iters = operator.index(iters)
        if iters < 0:
            raise ValueError(f"step(iters): expected an integer >= 0, found {iters}")
        inputs_for = _feeder(feed, self)
        iter_size = self.param.iter_size
        # under a policy, overflow and NaN in the pass are reported once, by the check
        quiet = dict(over="ignore", invalid="ignore") if self.nonfinite is not None else {}
        last = None
        for _ in range(iters):
            self._history.sync()
            it = Iteration(self.iter, passes=iter_size, loss_count=iter_size, feed=inputs_for)
            with np.errstate(**quiet):
                for callback in self._callbacks:
                    callback.on_start(self, it)
                if it.loss is None:
                    it.loss = self._passes(inputs_for, iter_size)
            self._update(it)
            loss = it.checked if it.applied and it.checked is not None else it.mean_loss
            if it.applied:
                self._losses.append(loss)
            if self.param.display and it.iter % self.param.display == 0 and self.comm.rank == 0:
                log.info("Iteration %d, loss = %g (last %g)", it.iter, self.loss, float(loss))
            if self.param.snapshot and self.iter % self.param.snapshot == 0:
                self.snapshot()
            last = loss
        return None if last is None else float(last)

    def _passes(self, inputs_for, iter_size: int):
        """One iteration's passes: the param diffs cleared and summed; returns the loss sum.

        Each pass's gradients are summed as a whole into the ones before, as an all-reduce
        sums each rank's: so two ranks equal ``iter_size: 2`` bit for bit (a backward that
        added into the diffs directly would round its layers' terms in another order).
        """
        diff = self._store.diff
        if diff is not None:
            diff.fill(0)
        total, loss = None, 0.0
        for i in range(iter_size):
            self.net.forward(**inputs_for(self.iter * iter_size + i, i))
            loss = loss + _unread_loss(self.net)
            self.net.backward()
            if diff is None or iter_size == 1:
                continue
            if total is None:
                total = diff.copy()
            else:
                total += diff
            diff.fill(0)
        if total is not None:
            diff[...] = total
        return loss

    @property
    def loss(self) -> float:
        """The mean loss of the last ``average_loss`` iterations (NaN before any; skipped
        iterations are left out); the losses stay on the device until this is read."""
        if not self._losses:
            return float("nan")
        return float(sum(self._losses)) / len(self._losses)

    def solve(self, feed=None, resume=None) -> float:
        """Train to ``max_iter`` (from ``resume``, a .solverstate, if given); returns ``loss``.

        Snapshots every ``snapshot`` iterations and, with ``snapshot_after_train``
        and a ``snapshot_prefix``, once at the end, as Caffe's Solve does.
        """
        if resume is not None:
            self.restore(resume)
        self.step(max(0, self.param.max_iter - self.iter), feed)
        p = self.param
        if p.snapshot_after_train and p.snapshot_prefix and (
            not p.snapshot or self.iter % p.snapshot != 0
        ):
            self.snapshot()
        return self.loss

    # -- snapshots ----------------------------------------------------------------------
    def snapshot_paths(self, prefix=None) -> tuple[Path, Path]:
        """The (caffemodel, solverstate) paths a snapshot now would write."""
        return snapshots.snapshot_paths(
            prefix if prefix is not None else self.param.snapshot_prefix, self.iter)

    def snapshot(self, prefix=None) -> tuple[Path, Path]:
        """Write the weights and the solver state (:mod:`unroll.train.solver_snapshot`);
        returns their two paths, ``{prefix}_iter_{iter}.caffemodel`` and ``.solverstate``.

        ``prefix`` defaults to ``snapshot_prefix``; one ending in a separator puts
        the files in that folder. Both are written to temp files and renamed into
        place, so a crash never leaves a half-written snapshot. Under several ranks
        only rank 0 writes, and every rank returns once the files are in place.
        For example, ``solver.snapshot("runs/tagger")`` at iteration 1000 gives
        ``runs/tagger_iter_1000.caffemodel`` and ``runs/tagger_iter_1000.solverstate``.
        """
        model_path, state_path = self.snapshot_paths(prefix)
        if self.comm.rank == 0:
            snapshots.write_snapshot(model_path, state_path, self.iter, self.current_step,
                                     self.history, self.net.to_proto().SerializeToString())
            log.info("Snapshot at iteration %d: %s, %s", self.iter, model_path, state_path)
        self.comm.barrier()
        return model_path, state_path

    def restore(self, state_path) -> None:
        """Load a .solverstate and the weights it names: iter, history, weights, all exactly.

        ``learned_net`` is looked up in the state file's folder; a Caffe-written
        path relative to the working directory is accepted too. The solver must
        have the type of the one that wrote the state. Under several ranks every
        rank reads the files, then rank 0's values are broadcast.
        """
        state_path = Path(state_path)
        state = snapshots.read_state(state_path)
        params = self._history.sync()
        values = snapshots.history_values(state, state_path, params, self._rule.slots, self.type)
        if state.learned_net:
            self.net.copy_from(read_binary(snapshots.find_model(state_path, state.learned_net),
                                           NetParameter, "caffemodel"))
        for h, value in zip(self.history, values):
            h[...] = module_of(h).asarray(value, h.dtype)
        self._broadcast()
        self.iter, self.current_step = state.iter, state.current_step
        self._losses.clear()


def _warn_ignored(param, net) -> None:
    """Warnings for the fields this solver does not use; ``random_seed`` seeds the net."""
    ignored = [name for name in IGNORED_FIELDS if is_set(param, name)]
    if ignored:
        warnings.warn(f"Solver ignores the SolverParameter fields {ignored}: it trains the net "
                      f"it is given, on that net's device, and runs no test nets", stacklevel=3)
    if param.random_seed >= 0:
        if callable(getattr(net, "seed", None)):
            net.seed(param.random_seed)
        else:
            warnings.warn(
                f"solver field 'random_seed' ({param.random_seed}) is ignored: "
                f"{type(net).__name__} has no seed() method; seed the net when you build it",
                stacklevel=3)


def _unread_loss(net):
    """The loss of the net's last forward, on its device if it keeps it there (``device_loss``)."""
    return net.device_loss if hasattr(net, "device_loss") else net.loss


def _feeder(feed, solver: Solver) -> Callable[[int, int], Mapping]:
    """``feed`` (see :meth:`Solver.step`) as a function of (k, pass) -> inputs."""
    if feed is None:
        return lambda k, i: {}
    if isinstance(feed, Mapping):
        return lambda k, i: feed
    if isinstance(feed, Iterator):
        def from_iterator(k, i):
            try:
                inputs = next(feed)
            except StopIteration:
                raise SolverError(
                    f"feed ran out of batches at iteration {solver.iter} (pass {i + 1} of "
                    f"iter_size {solver.param.iter_size})"
                ) from None
            return _check_inputs(inputs, k)
        return from_iterator
    if callable(feed):
        return lambda k, i: _check_inputs(feed(k), k)
    raise TypeError(
        f"feed: expected a callable k -> inputs dict, an iterator of dicts or a dict, "
        f"found {type(feed).__name__}"
    )


def _check_inputs(inputs, k: int) -> Mapping:
    if not isinstance(inputs, Mapping):
        raise TypeError(
            f"feed for pass {k}: expected a dict of input name -> array, "
            f"found {type(inputs).__name__}"
        )
    return inputs
