"""Solver callbacks (Caffe's ``Solver::Callback``), and the built-in ones.

A callback is a :class:`SolverCallback` with up to three hooks, each given the
solver and the :class:`Iteration` under way:

- ``on_start``: at the start of an iteration of :meth:`Solver.step
  <unroll.train.solver.Solver.step>`, before its forward and backward passes.
  A callback that sets ``it.loss`` has run the passes itself (the CUDA-graph
  replay), and the solver runs none;
- ``on_gradients_ready``: the passes' gradients are summed in the param
  diffs, the learning rate is known (``it.rate``), nothing is updated yet. A
  callback that sets ``it.applied = False`` leaves the update out, and the
  later callbacks' ``on_gradients_ready`` do not run;
- ``on_update``: after the update (or its skipping, ``it.applied``);
  ``solver.iter`` already counts it.

:meth:`Solver.update <unroll.train.solver.Solver.update>` (for loops that run
the passes themselves) runs ``on_gradients_ready`` and ``on_update``. Every
hook runs the callbacks in this order (``solver.callbacks``), the built-ins
first:

1. :class:`AllReduce` -- sums the gradients (one all-reduce of the flat diff
   buffer) and the losses over the ranks of ``comm``;
2. :class:`NonFiniteCheck` -- under ``nonfinite="stop"`` or ``"skip"``;
3. :class:`GradientClipping` -- with ``clip_gradients`` set;
4. the callbacks given to :meth:`~unroll.train.solver.Solver.add_callback`, in
   the order added;
5. :class:`GraphReplay` -- the CUDA-graph replay of ``solver.graphs``, last of
   ``on_start`` because it stands in for the passes.

So a callback of your own sees the gradients summed over ranks, checked and
clipped, before they are averaged over ``iter_size`` and ranks.

>>> class Count(SolverCallback):
...     updates = 0
...     def on_update(self, solver, it):
...         self.updates += it.applied
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

import numpy as np

from unroll.engine.backend import module_of
from unroll.train.distributed import Comm
from unroll.train.solver_param import SolverError

__all__ = ["NONFINITE_POLICIES", "AllReduce", "GradientClipping", "GraphReplay", "Iteration",
           "NonFiniteCheck", "NonFiniteError", "SkippedStep", "SolverCallback", "clip_gradients",
           "nonfinite_check"]

# the solver's messages keep its logger, so a script's logging setup for it still applies
log = logging.getLogger("unroll.train.solver")

#: what a Solver does with an iteration whose loss or gradient is not finite: None applies
#: it (Caffe's behaviour, no read), "stop" raises, "skip" leaves it out (up to max_skipped)
NONFINITE_POLICIES = (None, "stop", "skip")


@dataclasses.dataclass
class Iteration:
    """One iteration under way, as its callbacks see and change it.

    ``iter``: its number (``solver.iter`` before the update); ``feed(k, i)``:
    the inputs of pass ``i`` (``k = iter * iter_size + i``), None under
    :meth:`Solver.update`; ``loss``: the sum of ``loss_count`` losses (on the
    device or read), None before the passes (and under ``update()`` without a
    non-finite policy); ``passes``: how many passes' gradients the diffs sum;
    ``rate``: the learning rate; ``applied``: whether the update is applied;
    ``checked``: the mean loss as read back by the non-finite check; ``squares``: the
    host diffs' sum of squares where the non-finite check found it finite (None: not
    taken), which clipping reads instead of a second pass over the diffs.
    """

    iter: int
    passes: int
    loss_count: int
    feed: Callable | None = None
    loss: object = None
    rate: float = math.nan
    applied: bool = True
    checked: float | None = None
    squares: object = None

    @property
    def mean_loss(self):
        """``loss / loss_count``: the iteration's loss, on the device if ``loss`` is."""
        return self.loss / self.loss_count


class SolverCallback:
    """A callback's hooks, each a no-op here: override those you need (see the module)."""

    def on_start(self, solver, it: Iteration) -> None:
        """Before the iteration's passes (step only)."""

    def on_gradients_ready(self, solver, it: Iteration) -> None:
        """After the passes, before the update."""

    def on_update(self, solver, it: Iteration) -> None:
        """After the update, or its skipping."""


class AllReduce(SolverCallback):
    """Data-parallel training: the gradients and losses summed over the ranks of ``comm``.

    One all-reduce of the flat diff buffer; ``it.passes`` then counts every rank's
    passes, so the update's average over ``iter_size`` divides by ranks too, and N
    ranks on N batches equal one process with ``iter_size: N`` over them, as in
    Caffe's multi-GPU training (the losses are summed on the host: one read each).
    Every solver has one; with the one-process ``Comm()`` it changes nothing.
    """

    def __init__(self, comm: Comm):
        self.comm = comm

    def on_gradients_ready(self, solver, it: Iteration) -> None:
        if it.loss is not None:
            it.loss = self.comm.sum(it.loss)
            it.loss_count *= self.comm.size
        diff = solver.net.store.diff
        if diff is not None:
            self.comm.allreduce_sum(diff)
        it.passes *= self.comm.size


@dataclasses.dataclass(frozen=True)
class SkippedStep:
    """An iteration whose update was not applied: its loss or a gradient was not finite."""

    iter: int
    loss: float
    gradient_norm: float


class NonFiniteError(SolverError):
    """A non-finite loss or gradient that the solver's ``nonfinite`` policy does not allow
    (``"stop"``, or one more skip than ``max_skipped``); raised before the update, so the
    weights are those of the last good iteration. ``step`` says which iteration and why."""

    def __init__(self, message: str, step: SkippedStep):
        super().__init__(message)
        self.step = step


def nonfinite_check(nonfinite: str | None, max_skipped: int | None) -> NonFiniteCheck | None:
    """The check for a Solver's ``nonfinite=`` and ``max_skipped=`` (None: no check)."""
    if nonfinite not in NONFINITE_POLICIES:
        raise SolverError(f"nonfinite: expected one of {list(NONFINITE_POLICIES)}, found "
                          f"{nonfinite!r}")
    if (nonfinite == "skip") != (max_skipped is not None):
        raise SolverError(
            f"max_skipped goes with nonfinite=\"skip\" (how many iterations may be "
            f"skipped in all); found nonfinite={nonfinite!r}, max_skipped={max_skipped!r}"
        )
    if max_skipped is not None and (not isinstance(max_skipped, int) or max_skipped < 0):
        raise SolverError(f"max_skipped: expected an integer >= 0, found {max_skipped!r}")
    return None if nonfinite is None else NonFiniteCheck(nonfinite, max_skipped)


class NonFiniteCheck(SolverCallback):
    """The ``nonfinite`` policy: an iteration whose loss or gradient is not finite raises
    (``"stop"``) or is left out and recorded in ``solver.skipped`` (``"skip"``, up to
    ``max_skipped``). One read per iteration: the mean loss, made NaN on the device where
    a gradient is not finite; after the all-reduce, so every rank decides alike."""

    def __init__(self, policy: str, max_skipped: int | None):
        self.policy, self.max_skipped = policy, max_skipped

    def on_gradients_ready(self, solver, it: Iteration) -> None:
        loss = it.mean_loss
        diff = solver.net.store.diff
        xp = None if diff is None else module_of(diff)
        # on the host, a finite sum of squares (one BLAS pass) proves every diff finite; the
        # float64 sum (a pass that casts every element, 7x the dot's time on the tagger's
        # 4.5M params) decides only when it is not (an overflow, or a diff that is not)
        squares = _finite_squares(diff) if xp is np else None
        if diff is None or squares is not None:
            it.checked, it.squares = float(loss), squares
        else:
            # a float64 sum of the diffs is finite exactly when they all are, short of
            # overflowing it
            it.checked = float(xp.where(xp.isfinite(xp.sum(diff, dtype=xp.float64)), loss,
                                        xp.nan))
        if not math.isfinite(it.checked):
            self._skip(solver, loss, diff)
            it.applied = False

    def _skip(self, solver, loss, diff) -> None:
        """Record a non-finite iteration, or raise where the policy does not allow it."""
        with np.errstate(over="ignore", invalid="ignore"):
            norm = math.nan if diff is None else float(module_of(diff).sqrt(diff @ diff))
        step = SkippedStep(solver.iter, float(loss), norm)
        what = (f"iteration {step.iter}: loss {step.loss:g}, gradient norm {step.gradient_norm:g}"
                f"; not updated, the weights are those of the iteration before")
        if self.policy == "stop":
            raise NonFiniteError(f"{what} (nonfinite=\"stop\")", step)
        if len(solver.skipped) >= self.max_skipped:
            raise NonFiniteError(
                f"{what}: one skip more than max_skipped={self.max_skipped} (skipped before: "
                f"iterations {[s.iter for s in solver.skipped]})", step)
        solver.skipped.append(step)
        log.warning("Skipped %s (%d of at most %d)", what, len(solver.skipped), self.max_skipped)


def _finite_squares(diff: np.ndarray):
    """The host ``diff``'s sum of squares where it is finite (an overflow is not), else None."""
    with np.errstate(over="ignore", invalid="ignore"):
        squares = diff @ diff
    return squares if math.isfinite(squares) else None


def clip_gradients(diff, clip: float, squares=None) -> None:
    """Caffe's ClipGradients, on the host or the device: ``diff *= clip / max(norm, clip)``.

    The scale is 1 (bit for bit) while the norm is within ``clip``, and a NaN
    norm scales nothing (``fmax`` ignores it), as Caffe's ``norm > clip`` test;
    nothing is read back unless INFO logging wants the norm. ``squares`` is
    ``diff @ diff`` where the caller has it (the non-finite check's), so the diffs
    are not walked twice.

    >>> diff = np.array([3.0, 4.0])
    >>> clip_gradients(diff, 1.0)
    >>> diff
    array([0.6, 0.8])
    """
    xp = module_of(diff)
    norm = xp.sqrt(diff @ diff if squares is None else squares, dtype=xp.float64)
    scale = (clip / xp.fmax(norm, clip)).astype(diff.dtype)
    # on the host a pass that would change nothing is skipped (0.6 ms a tagger batch); on a
    # device reading the scale back would wait for the stream, so it always multiplies
    if xp is not np or scale != 1:
        diff *= scale
    if log.isEnabledFor(logging.INFO) and float(norm) > clip:
        log.info("Gradient clipping: scaling down gradients (L2 norm %g > %g) by %g",
                 float(norm), clip, clip / float(norm))


class GradientClipping(SolverCallback):
    """``clip_gradients``: the diffs, summed over passes and ranks, scaled to that global
    L2 norm where they exceed it, before they are averaged (as Caffe's)."""

    def __init__(self, clip: float):
        self.clip = clip

    def on_gradients_ready(self, solver, it: Iteration) -> None:
        if solver.net.store.diff is not None:
            clip_gradients(solver.net.store.diff, self.clip, it.squares)


class GraphReplay(SolverCallback):
    """The passes of each iteration as a CUDA graph replay: ``graphs``, None or a
    :class:`unroll.engine.cuda_graph.StepGraphs` (``solver.graphs``); one pass each."""

    def __init__(self):
        self.graphs = None

    def on_start(self, solver, it: Iteration) -> None:
        if self.graphs is None:
            return
        if it.passes != 1:
            raise SolverError(f"graphs replay one pass per iteration; iter_size is {it.passes}")
        it.loss = self.graphs.gradients(it.feed(it.iter, 0))
