"""The epoch loop every application shares: Caffe's ``caffe train``, Keras' ``fit``.

An application (:class:`Application`) supplies its nets, its batches, its
evaluation and the reading and writing of its own files; :class:`Trainer`
does the rest, the same way for every application (docs/design.md,
10. Training):

- **Seeding.** Every epoch's draws come from ``(seed, rank, epoch)`` alone:
  the sampler's shuffles (``sampler.epoch_batches(epoch)``), the nets' dropout
  (``model.seed``) and the application's own draws (word dropout, through
  its optional ``seed_epoch``). So an epoch run again after a resume
  draws what the uninterrupted run drew.
- **The model folder** (:mod:`unroll.train.model_folder`): claimed and locked
  for the run; each epoch is evaluated, then committed (snapshot, averaged
  weights, carried state, ``log.json``, ``last`` and ``best``), then logged on
  one line, and the loss and dev curve is drawn into ``curve.png``.
- **Best, last and averaged weights.** The params are averaged
  (:class:`ParamAverage`); the average is what is evaluated and saved.
- **Resume, bit for bit.** A snapshot holds what continuing needs: solver
  state, params, average, and the application's carried recurrent state
  (truncated BPTT: ``Application.carried_state``), gathered from every
  rank. The sampler's position needs no saving: a snapshot ends an epoch,
  and the next epoch's batches are a function of (seed, rank, epoch).
- **Time.** ``max_minutes``: no epoch starts once that much time has passed
  since :meth:`Trainer.fit` began, the time logged by earlier runs of the
  folder included; ``log.json`` and the result say where it stopped.
- **Non-finite batches.** The solver's ``nonfinite="skip"`` policy: up to
  ``skip_bad_batches`` batches whose loss or gradient is not finite are
  dropped (said on one line); one more stops training with
  :class:`TrainingDiverged` before anything of it is saved, as do weights or a dev
  score that are not finite after an epoch. Overflow in the passes and in
  evaluation warns nothing: the one-line error, or the score, says so.
- **Ranks.** Under ``mpirun -n N`` (:mod:`unroll.train.distributed`) each
  rank trains on its share of every epoch; rank 0 evaluates, prints and
  writes, and all ranks snapshot together.

A tiny application (``tests/train/test_trainer.py`` has a complete one):

>>> import numpy as np, tempfile
>>> from unroll.engine.net import Net
>>> class Line:
...     '''Fit y = 2x with one InnerProduct; 4 batches an epoch.'''
...     files = folder.ModelFiles(log_schema({"dev_error": json_files.finite()},
...                                          ["dev_error"], averaged=False))
...     metric = Metric("dev_error", "dev error", mode="min")
...     curve_title = "a line"
...     def read_data(self): self.x = np.linspace(-1, 1, 32).reshape(8, 4, 1)
...     def create(self, model_dir): pass
...     def load(self, model_dir, log): pass
...     def model(self, model_dir, seed):
...         self.net = Net('''layer { name: "in" type: "Input" top: "x" top: "y"
...             input_param { shape { dim: 4 dim: 1 } shape { dim: 4 dim: 1 } } }
...           layer { name: "ip" type: "InnerProduct" bottom: "x" top: "p"
...             inner_product_param { num_output: 1 weight_filler { type: "constant" } } }
...           layer { name: "loss" type: "EuclideanLoss" bottom: "p" bottom: "y"
...                   top: "loss" }''', seed=seed)
...         return self.net
...     def sampler(self, seed, rank, size): return Batches(8, seed, rank, size, 2)
...     def solver_fields(self, steps_per_epoch): return {"type": "SGD", "base_lr": 0.5}
...     def batch(self, rows):
...         x = self.x[rows].reshape(-1, 1)
...         return {"x": x, "y": 2 * x}, len(x)
...     def evaluate(self, epoch):
...         self.net.forward(x=self.x[0], y=2 * self.x[0])
...         return {"dev_error": float(self.net.loss)}
>>> model_dir = tempfile.mkdtemp()
>>> result = Trainer(Line(), model_dir, epochs=3, quiet=True, average=None, curve=False).fit()
... # doctest: +ELLIPSIS
epoch 1: loss 0.4884  dev error 0.3122  (best 0.3122)  ...
epoch 2: ...
epoch 3: loss 0.0105  dev error 0.0069  (best 0.0069)  ...
>>> result["epoch"], result["dev_error"] < 0.01
(3, True)
>>> sorted(p for p in __import__("os").listdir(model_dir) if not p.startswith("snapshot"))
['best.caffemodel', 'last.caffemodel', 'log.json', 'train.lock']
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from tqdm import tqdm

from unroll.core import json_files
from unroll.core.atomic import write_atomic
from unroll.core.errors import FileFormatError, NetError
from unroll.core.proto import NetParameter, array_from_blob_proto, blob_proto_from_array
from unroll.engine.backend import get_array_module, module_of, to_numpy
from unroll.engine.cuda_graph import graphs_for
from unroll.engine.kernels import default_engine, fused_kernels
from unroll.train import distributed
from unroll.train import model_folder as folder
from unroll.train.solver import NonFiniteError, Solver

__all__ = ["RECORDED_OPTIONS", "RECORD_FIELDS", "Application", "Batches", "Metric",
           "ParamAverage", "Trainer", "TrainingDiverged", "bad_batch", "diverged", "epoch_streams",
           "log_schema", "make_solver"]


class TrainingDiverged(RuntimeError):
    """A non-finite loss, gradient or weight: training stopped before saving anything of it."""


@dataclass(frozen=True)
class Metric:
    """The dev score that chooses the best epoch: its ``key`` in the epoch record, how it is
    named on the epoch line and the curve (``label``), ``mode`` "max" or "min" (Keras'
    and Lightning's word for which way is better), and whether it prints as a percentage.

    >>> Metric("dev_accuracy", "dev UPOS", percent=True).format(0.9512)
    'dev UPOS 95.12%'
    >>> Metric("dev_bpc", "dev bits/char", mode="min").better(1.2, 1.5)
    True
    """

    key: str
    label: str
    mode: str = "max"
    percent: bool = False

    def __post_init__(self):
        if self.mode not in ("max", "min"):
            raise ValueError(f"Metric {self.key}: mode must be 'max' or 'min', found "
                             f"{self.mode!r}")

    def format(self, value: float) -> str:
        return f"{self.label} {100 * value:.2f}%" if self.percent else f"{self.label} {value:.4f}"

    def better(self, value: float, than: float | None) -> bool:
        """Whether ``value`` beats ``than`` (None: nothing yet, which anything beats)."""
        if than is None:
            return True
        return value > than if self.mode == "max" else value < than


class Application(Protocol):
    """What an application gives the :class:`Trainer`: its nets, batches, evaluation and
    files. Nothing else: the loop, the folder, seeding, time, ranks are the Trainer's.

    Attributes: ``files`` (a :class:`~unroll.train.model_folder.ModelFiles`: the JSON
    files the application keeps in the folder, which ``log.json`` checksums, and the
    schema of ``log.json``, :func:`log_schema` with the application's own epoch fields),
    ``metric`` (a :class:`Metric`, whose key :meth:`evaluate` returns) and
    ``curve_title`` (the title of ``curve.png``).

    Optional: ``seed_epoch(rng)``, where the application draws randomness of its own
    each epoch (word dropout), from ``rng``, a :class:`numpy.random.Generator` of
    (seed, rank, epoch) alone (:func:`epoch_streams`); called on every rank before the
    epoch's first batch.

    Optional: ``recorded_options``, {command-line option: SolverParameter field} of the
    training options that are part of the run's record besides :data:`RECORDED_OPTIONS`
    (``--lr``, which every run records): each epoch's log entry holds their values
    (``options``), as :meth:`solver_fields` gave them. A resume takes the recorded value
    of each one not given (the Trainer's ``given``), and refuses one given that differs,
    naming the option, the recorded value and the given one
    (:func:`unroll.train.model_folder.options_differ`).

    Optional, for truncated BPTT: ``carried_state() -> {name: array}`` (the recurrent
    state the training nets carry into the next batch, as it is after an epoch; called
    on every rank after the epoch's last batch, before :meth:`evaluate`) and
    ``restore_carried_state({name: NumPy array})`` (put this rank's back on resume). The
    Trainer saves it with every snapshot, every rank's, so a resumed run carries what the
    uninterrupted one did. An application that starts every epoch from zero state needs
    neither: a snapshot ends an epoch.
    """

    files: folder.ModelFiles
    metric: Metric
    curve_title: str

    def read_data(self) -> None:
        """Read the training and dev data (before the folder is claimed, so that a bad
        data file leaves no folder behind)."""

    def create(self, model_dir: Path) -> None:
        """A fresh run: build the application's own files (``files.json``: vocabularies,
        config) from the data and write them into ``model_dir``."""

    def load(self, model_dir: Path, log: list[dict]) -> None:
        """A resumed run (``log``: its epochs), or a rank other than 0: read the
        application's files from ``model_dir`` (:func:`unroll.train.model_folder.read_declared`
        checks them against ``log``), refusing settings given that differ from them
        (:func:`unroll.train.model_folder.settings_differ`)."""

    def model(self, model_dir: Path, seed: int):
        """The net to train (a :class:`~unroll.train.solver.TrainableNet`), its weights and
        dropout drawn from ``seed``: the run's seed plus the rank, so that each rank draws its
        own dropout (the solver broadcasts rank 0's weights)."""

    def sampler(self, seed: int, rank: int, size: int):
        """The batches: ``len(sampler)`` steps an epoch, ``sampler.epoch_batches(epoch)``
        this rank's share of epoch ``epoch`` (a function of seed, rank and epoch alone),
        e.g. a :class:`~unroll.train.bucketing.BucketSampler` or :class:`Batches`."""

    def solver_fields(self, steps_per_epoch: int) -> dict:
        """The SolverParameter fields (type, base_lr, lr_policy, clip_gradients, ...)."""

    def batch(self, batch) -> tuple[dict, int]:
        """``(inputs of the net, tokens in them)`` of one batch of the sampler."""

    def evaluate(self, epoch: int) -> dict:
        """The dev scores after epoch ``epoch`` (from 0; with ``metric.key``) and any other
        fields to log, with the averaged weights in the net."""


class Batches:
    """The simplest sampler: ``n`` items in batches of ``batch_size``, shuffled per epoch
    from ``(seed, epoch)`` (``shuffle=False``: in order, every epoch alike), each of
    ``size`` ranks taking every size-th batch (the last incomplete batches dropped, so
    every rank takes as many steps).

    >>> b = Batches(10, seed=0, batch_size=3)
    >>> len(b), [len(rows) for rows in b.epoch_batches(0)]
    (3, [3, 3, 3])
    >>> b.epoch_batches(1) == Batches(10, seed=0, batch_size=3).epoch_batches(1)
    True
    >>> Batches(5, batch_size=2, shuffle=False).epoch_batches(7)
    [[0, 1], [2, 3]]
    """

    def __init__(self, n: int, seed: int = 0, rank: int = 0, size: int = 1,
                 batch_size: int = 1, shuffle: bool = True):
        self.n, self.seed, self.rank, self.size, self.batch_size = n, seed, rank, size, batch_size
        self.shuffle = shuffle

    def __len__(self) -> int:
        return self.n // self.batch_size // self.size

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        order = (np.random.default_rng([self.seed, epoch]).permutation(self.n).tolist()
                 if self.shuffle else list(range(self.n)))
        batches = [order[k * self.batch_size:(k + 1) * self.batch_size]
                   for k in range(len(self) * self.size)]
        return batches[self.rank::self.size]


#: the training options every run records, {command-line option: SolverParameter field};
#: an application's ``recorded_options`` adds its own (:class:`Application`)
RECORDED_OPTIONS = {"--lr": "base_lr"}

#: the fields of an epoch record that the Trainer writes, beside the folder's own
#: (:data:`unroll.train.model_folder.ENTRY_PROPERTIES`)
RECORD_FIELDS = {
    "train_loss": {"type": ["number", "null"], "minimum": 0,
                   "description": "a finite number >= 0, or null"},
    "seconds": json_files.finite(), "tokens_per_s": json_files.finite(),
    "options": {"type": "object", "maxProperties": 64, "description": "an object {option: value}",
                "propertyNames": {"pattern": "^--[a-z][a-z0-9-]{0,40}$"},
                "additionalProperties": json_files.finite()},
}


def log_schema(fields: dict, required=(), averaged: bool = True, carried: bool = False) -> dict:
    """The schema of the ``log.json`` a :class:`Trainer` writes for an application whose
    epoch records add ``fields`` (name: JSON schema; those in ``required`` always there):
    averaged weights unless the Trainer's ``average`` is None, ``carried`` state where the
    application has :meth:`~Application.carried_state`.

    >>> schema = log_schema({"dev_bpc": json_files.finite()}, required=["dev_bpc"])
    >>> sorted(schema["items"]["required"])  # doctest: +NORMALIZE_WHITESPACE
    ['average', 'dev_bpc', 'epoch', 'iter', 'options', 'seconds', 'seed', 'sha256', 'snapshot',
     'train_loss']
    """
    return folder.epoch_log_schema(RECORD_FIELDS | fields,
                                   ["train_loss", "seconds", "seed", "options", *required],
                                   averaged=averaged, carried=carried)


class ParamAverage:
    """An exponential moving average of the learned params (Polyak averaging).

    The application is evaluated and saved with the average in place of the
    params: it smooths the last updates' noise. The decay warms up as
    (1 + n) / (10 + n) so that the first epoch's average is not held back by
    the initial weights.
    """

    def __init__(self, params, decay: float = 0.998):
        self.params = [p for p in params if p.lr_mult]
        self.decay = decay
        self.updates = 0
        self.values = [p.blob.data.copy() for p in self.params]
        # on the host, one compiled pass (the same bits, 2.2x faster in the tagger, where
        # it is a memory-bound walk over 4.5M params); elsewhere, the array form through one
        # work array as large as the largest param: a temporary the size of the word
        # embedding cost its allocation (page faults) at every update, 2.4x the update's time
        on_host = bool(self.values) and module_of(self.values[0]) is np
        self.compiled = on_host and default_engine() == "fused"
        largest = max(self.values, key=lambda v: v.size, default=None)
        self._work = (None if largest is None or self.compiled
                      else module_of(largest).empty_like(largest).ravel())

    def update(self) -> None:
        self.updates += 1
        rate = 1 - min(self.decay, (1 + self.updates) / (10 + self.updates))
        # the kernel module is imported at the first update, not at init: numba loaded before
        # the nets are built sends their planning through its compiled placement pass, whose
        # load raised the tagger's RSS after building by about 90 MB
        kernel = fused_kernels(np).average_update if self.compiled else None
        for avg, p in zip(self.values, self.params):
            if kernel is not None:
                kernel(avg, p.blob.data, rate)
                continue
            step = self._work[: avg.size].reshape(avg.shape)
            module_of(avg).subtract(p.blob.data, avg, out=step)
            step *= rate
            avg += step

    @contextlib.contextmanager
    def applied(self):
        """The averaged values in the params for the duration of the block."""
        trained = [p.blob.data.copy() for p in self.params]
        for avg, p in zip(self.values, self.params):
            p.blob.data[...] = avg
        try:
            yield
        finally:
            for value, p in zip(trained, self.params):
                p.blob.data[...] = value


def make_solver(model, fields: dict, comm=None, skip_bad_batches: int = 0) -> Solver:
    """The Trainer's solver of ``model``: the application's SolverParameter ``fields``,
    the non-finite policy (skip up to ``skip_bad_batches`` batches, then stop) and, on a
    GPU, each batch shape's gradient pass replayed as a CUDA graph (``solver.graphs``)."""
    solver = Solver(model, comm=comm, nonfinite="skip", max_skipped=skip_bad_batches, **fields)
    solver.graphs = graphs_for(model)
    return solver


def epoch_streams(seed: int, rank: int, epoch: int) -> tuple[int, np.random.Generator]:
    """(the nets' dropout seed, the application's generator) of one epoch of one rank:
    functions of (seed, rank, epoch) alone.

    >>> a, b = epoch_streams(0, 0, 3), epoch_streams(0, 0, 3)
    >>> a[0] == b[0] and a[1].random() == b[1].random()
    True
    >>> epoch_streams(0, 1, 3)[0] == a[0]
    False
    """
    dropout, own = np.random.SeedSequence([seed, rank, epoch]).spawn(2)
    return int(dropout.generate_state(1)[0]), np.random.default_rng(own)


def bad_batch(epoch: int, k: int, step) -> str:
    """Where a non-finite step (a :class:`~unroll.train.solver.SkippedStep`) was: for messages."""
    return (f"epoch {epoch + 1}, batch {k + 1} (iteration {step.iter}): loss {step.loss:g}, "
            f"gradient norm {step.gradient_norm:g}")


def diverged(where: str, model_dir: Path, log: list, lr: float, resumable: bool = True,
             skip_option: str | None = None) -> TrainingDiverged:
    """The one-line error of a training stopped at a non-finite ``where``, saying what the
    folder keeps and how to go on."""
    kept = (f"{model_dir} keeps epoch {log[-1]['epoch']}" if log
            else f"no epoch had ended, so {model_dir} holds no weights")
    again = "--resume" if log and resumable else "--overwrite"
    skip = f", or allow a few bad batches with {skip_option} N" if skip_option else ""
    return TrainingDiverged(f"training diverged at {where}. Nothing of it was saved; {kept}. "
                            f"Lower --lr (now {lr:g}) and run again with {again}{skip}")


def _all_finite(arrays) -> bool:
    return all(bool(module_of(a).isfinite(a).all()) for a in arrays)


class Trainer:
    """Train ``app`` (an :class:`Application`) into the model folder ``model_dir``.

    ``epochs`` in all (a resumed run counts those logged); ``seed`` of the
    weights, shuffles and dropout (None: 0, or on ``resume`` the folder's; a
    different one is refused); ``resume`` continues the folder's last epoch,
    ``overwrite`` replaces the model it holds (a folder that holds no model yet
    is trained either way); ``max_minutes`` and ``skip_bad_batches`` as in the
    module; ``quiet`` hides the progress bar; ``device`` is where the nets run
    (and which communicator ranks use); ``average`` the decay of the weight
    average (None: no average, the params themselves are evaluated and saved);
    ``curve`` draws ``curve.png`` (needs matplotlib); ``clock`` gives the time in
    seconds (None: ``time.perf_counter``; tests inject their own); ``given`` the values of
    the recorded options (:data:`RECORDED_OPTIONS` and the application's own) given on
    the command line (``{"--lr": 0.01}``; None or absent: not given, so that a resume
    takes the folder's).

    :meth:`fit` returns the last epoch's record (``{"stopped": ...}`` alone
    when the time limit came before the first epoch).
    """

    def __init__(self, app: Application, model_dir, *, epochs: int, seed: int | None = None,
                 resume: bool = False, overwrite: bool = False, max_minutes: float | None = None,
                 skip_bad_batches: int = 0, quiet: bool = False, device: str = "cpu",
                 average: float | None = 0.998, curve: bool = True, clock=None,
                 given: dict | None = None):
        if not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"--epochs: expected an integer >= 1, found {epochs!r}")
        if max_minutes is not None and not max_minutes >= 0:
            raise ValueError(f"--max-minutes: expected a number >= 0, found {max_minutes!r}")
        if seed is not None and not 0 <= seed < 1 << 63:
            raise ValueError(f"--seed: expected an integer in [0, 2**63), found {seed!r}")
        if skip_bad_batches < 0:
            raise ValueError(f"--skip-bad-batches: expected an integer >= 0, found "
                             f"{skip_bad_batches!r}")
        if curve and importlib.util.find_spec("matplotlib") is None:
            raise ValueError("the curve plot (curve.png) needs matplotlib: pip install "
                             "'unroll[examples]', or train with curve=False")
        self.app = app
        self.model_dir = Path(model_dir)
        self.epochs, self.seed, self.resume, self.overwrite = epochs, seed, resume, overwrite
        self.max_minutes, self.skip_bad_batches = max_minutes, skip_bad_batches
        self.quiet, self.device, self.average, self.curve = quiet, device, average, curve
        self.clock = clock or time.perf_counter
        self.given = given or {}

    def fit(self) -> dict:
        """Train (or resume) and return the log of the last epoch (see the class)."""
        started = self.clock()
        self.app.read_data()
        # a rank that fails ends every rank (they would wait in the next all-reduce)
        with distributed.init(self.device) as comm:
            return self._fit(comm, self.app.files, started)

    def _fit(self, comm, files: folder.ModelFiles, started: float) -> dict:
        try:
            if comm.rank == 0:  # the rank that prints, evaluates and writes
                with folder.claimed(self.model_dir, self.resume, self.overwrite,
                                    files) as model_dir:
                    log = folder.read_log(model_dir, files) if self.resume else []
                    self._open(model_dir, log)
                    comm.barrier()
                    return self._train(comm, model_dir, log, started)
            comm.barrier()  # rank 0 has claimed the folder and written what the others read
            log = folder.read_log(self.model_dir, files)
            self.app.load(self.model_dir, log)
            return self._train(comm, self.model_dir, log, started)
        except OSError as e:
            if e.filename is not None or e.errno is None:
                raise
            # a failed write (a full disk) names no file: the folder being written is the place
            raise type(e)(e.errno, e.strerror, str(self.model_dir)) from e

    def _open(self, model_dir: Path, log: list) -> None:
        """The application's files: the folder's when resuming, else new ones, saved."""
        if not log:  # (the folder says so where --resume found no epoch to continue)
            self.app.create(model_dir)
            return
        self.app.load(model_dir, log)
        if self.seed is not None:
            folder.settings_differ(model_dir, {"seed": self.seed}, {"seed": log[-1]["seed"]})

    def _train(self, comm, model_dir: Path, log: list, started: float) -> dict:
        app, metric, lead = self.app, self.app.metric, comm.rank == 0
        seed = log[-1]["seed"] if log else self.seed or 0
        # each rank its own dropout masks; the solver broadcasts rank 0's params
        model = app.model(model_dir, seed + comm.rank)
        sampler = app.sampler(seed, comm.rank, comm.size)
        fields, options = app.solver_fields(len(sampler)), {}
        for option, name in {**RECORDED_OPTIONS, **getattr(app, "recorded_options", {})}.items():
            if log and self.given.get(option) is None:  # not given: the folder's
                fields[name] = log[-1]["options"].get(option, fields[name])
            options[option] = fields[name]
        if log:  # a rate given now that differs from the record would change it silently
            folder.options_differ(model_dir, log[-1]["options"], options)
        solver = make_solver(model, fields, comm, self.skip_bad_batches)
        lr = solver.param.base_lr
        average = (ParamAverage(model.learnable_params, self.average)
                   if self.average is not None else None)
        if log:
            self._restore(solver, average, model, comm, model_dir, log[-1])
        best = None
        for entry in log:
            best = entry[metric.key] if metric.better(entry[metric.key], best) else best
        earlier = sum(e["seconds"] for e in log)  # training time before a resume
        result = log[-1] if log else {}
        skipped = 0
        for epoch in range(len(log), self.epochs):
            elapsed = self.clock() - started + earlier
            if self.max_minutes is not None and comm.sum(elapsed > self.max_minutes * 60):
                # all ranks stop together; how far it got is in the result and the log
                result = self._stopped_early(model_dir, log, epoch) if lead else result
                break
            epoch_start = self.clock()
            dropout_seed, own = epoch_streams(seed, comm.rank, epoch)
            model.seed(dropout_seed)
            if hasattr(app, "seed_epoch"):
                app.seed_epoch(own)
            tokens, losses, compute = 0, [], 0.0
            bar = tqdm(sampler.epoch_batches(epoch), desc=f"epoch {epoch + 1}/{self.epochs}",
                       unit="batch", disable=self.quiet or not lead, dynamic_ncols=True,
                       mininterval=1.0)
            for k, batch in enumerate(bar):
                inputs, batch_tokens = app.batch(batch)
                t0 = self.clock()
                try:
                    loss = solver.step(1, feed=inputs)
                except NonFiniteError as e:
                    raise diverged(bad_batch(epoch, k, e.step), model_dir, log, lr,
                                   skip_option="--skip-bad-batches") from None
                if len(solver.skipped) > skipped:
                    skipped = len(solver.skipped)
                    if lead:
                        tqdm.write(f"skipped a bad batch at "
                                   f"{bad_batch(epoch, k, solver.skipped[-1])} ({skipped} of "
                                   f"at most {self.skip_bad_batches})")
                    continue
                losses.append(loss)
                if average is not None:
                    average.update()
                compute += self.clock() - t0
                tokens += batch_tokens
                bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}",
                                tok_s=f"{tokens / max(compute, 1e-9):.0f}")
            tokens = comm.sum(tokens)  # of all ranks
            carried = self._carried(comm)
            if not lead:  # rank 0 evaluates and writes; the others join in the snapshot
                solver.snapshot(model_dir / folder.SNAPSHOT_PREFIX)
                continue
            weights = [p.blob.data for p in model.learnable_params]
            if not _all_finite(weights + (average.values if average else [])):
                raise diverged(f"the end of epoch {epoch + 1}: weights are not finite",
                               model_dir, log, lr, skip_option="--skip-bad-batches")
            with average.applied() if average else contextlib.nullcontext():
                # finite weights that grew huge overflow in the dev nets: the score says so,
                # or the one-line error below, not NumPy's warnings before it
                with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                    scores = app.evaluate(epoch)
                averaged = (model.to_proto().SerializeToString() if average else None)
            if not math.isfinite(scores[metric.key]):
                raise diverged(f"the evaluation of epoch {epoch + 1}: {metric.label} is "
                               f"{scores[metric.key]:g}", model_dir, log, lr,
                               skip_option="--skip-bad-batches")
            result = {
                "epoch": epoch + 1, "iter": solver.iter,
                "train_loss": float(np.mean(losses)) if losses else None,  # JSON has no NaN
                **scores, "tokens_per_s": tokens / max(compute, 1e-9),
                "seconds": self.clock() - epoch_start, "seed": seed, "options": options,
            }
            is_best = metric.better(scores[metric.key], best)
            folder.commit_epoch(model_dir, solver, log, result, is_best, averaged, carried,
                                files=app.files)
            best = scores[metric.key] if is_best else best
            if self.curve:
                plot(log, model_dir / folder.CURVE, metric, app.curve_title)
            loss = math.nan if result["train_loss"] is None else result["train_loss"]
            tqdm.write(f"epoch {epoch + 1}: loss {loss:.4f}  {metric.format(scores[metric.key])}"
                       f"  (best {metric.format(best).removeprefix(metric.label + ' ')})  "
                       f"{result['tokens_per_s']:.0f} tokens/s  {result['seconds']:.0f} s")
        return result

    def _carried(self, comm) -> bytes | None:
        """The application's carried state of every rank, serialized (rank 0 receives it)."""
        state = getattr(self.app, "carried_state", None)
        if state is None:
            return None
        carried = NetParameter(name="carried state")
        for name, array in state().items():
            layer = carried.layer.add(name=name)
            layer.blobs.add().CopyFrom(blob_proto_from_array(_gathered(comm, to_numpy(array))))
        return carried.SerializeToString()

    def _restore(self, solver: Solver, average, model, comm, model_dir: Path, entry: dict):
        """The solver, params, average and carried state of the epoch ``entry`` logs."""
        folder.restore_solver(solver, model_dir, entry)
        try:
            if average is not None:
                with average.applied():
                    model.copy_from(folder.inside(model_dir, entry["average"]))
                    average.values = [p.blob.data.copy() for p in average.params]
                average.updates = solver.iter
            if hasattr(self.app, "restore_carried_state"):
                self.app.restore_carried_state(_read_carried(model_dir, entry, comm))
        except (NetError, FileFormatError, ValueError) as e:  # files that do not fit the app
            raise folder.resume_error(model_dir, str(e)) from None

    def _stopped_early(self, model_dir: Path, log: list, epoch: int) -> dict:
        """The last epoch's record, marked as stopped by the time limit (in log.json too)."""
        stopped = f"stopped by --max-minutes after {epoch} of {self.epochs} epochs"
        if not log:  # no epoch ended, so there is no record to mark
            return {"stopped": stopped}
        log[-1]["stopped"] = stopped
        folder.write_json(model_dir / folder.LOG, log)
        return log[-1]


def _gathered(comm, array: np.ndarray) -> np.ndarray:
    """``array`` of every rank stacked, rank by rank (bit for bit: summed as integers, into
    zeros everywhere but the rank's own row)."""
    stacked = np.zeros((comm.size, *array.shape), array.dtype)
    stacked[comm.rank] = array
    if comm.size > 1:
        xp = get_array_module(comm.device or "cpu")
        bits = xp.asarray(stacked.view(f"i{array.dtype.itemsize}"))
        comm.allreduce_sum(bits)
        stacked = to_numpy(bits).view(array.dtype)
    return stacked


def _read_carried(model_dir: Path, entry: dict, comm) -> dict:
    """This rank's carried state from the snapshot of ``entry`` (checksummed)."""
    if "carried" not in entry:
        raise ValueError(f"{model_dir / folder.LOG}: epoch {entry['epoch']} names no carried "
                         f"state, which this application needs")
    path = folder.inside(model_dir, entry["carried"])
    carried = NetParameter()
    carried.ParseFromString(folder.verified(path, entry["sha256"][entry["carried"]]))
    state = {}
    for layer in carried.layer:
        if len(layer.blobs) != 1 or layer.blobs[0].shape.dim[:1] != [comm.size]:
            raise ValueError(f"{path}: {layer.name!r} holds the state of another number of "
                             f"ranks than {comm.size}")
        state[layer.name] = array_from_blob_proto(layer.blobs[0])[comm.rank]
    return state


def plot(log: list, path: Path, metric: Metric, title: str) -> None:
    """``curve.png``: the train loss and the dev metric per epoch of ``log``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = 100 if metric.percent else 1
    epochs = [e["epoch"] for e in log]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    losses = [math.nan if e["train_loss"] is None else e["train_loss"] for e in log]
    ax.plot(epochs, losses, "o-", color="tab:blue")
    ax.set_xlabel("epoch")
    ax.set_ylabel("train loss", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(epochs, [scale * e[metric.key] for e in log], "s-", color="tab:red")
    ax2.set_ylabel(metric.label + (" (%)" if metric.percent else ""), color="tab:red")
    ax.set_title(title)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, png.getvalue())
