"""Train the tagger: bucketed batches, Adam, dev accuracy per epoch, best checkpoint.

Everything lands in the model folder (files, write order and lock in
:mod:`unroll.train.model_folder`): ``best.caffemodel`` (the averaged params
of the best dev epoch), ``last.caffemodel`` (the last epoch's average), a
snapshot of the last epoch to resume from, ``features.json``,
``config.json``, ``log.json`` and ``curve.png``.

A batch whose loss or gradient norm is not finite stops training with
:class:`TrainingDiverged` before the update, so nothing non-finite reaches the
params or any file: the folder keeps the last good epoch, to ``--resume``
from with a lower learning rate. ``skip_bad_batches`` instead drops up to that
many such batches (their update is not applied), as large-scale trainers do.
The check is the solver's ``nonfinite`` policy (:class:`unroll.train.solver.Solver`):
one read from the device per batch, the loss, which the device turns into
NaN when a gradient is not finite; the same number feeds the progress bar.

Under ``mpirun -n N`` it trains data-parallel (:mod:`unroll.train.distributed`):
each rank takes its share of every epoch's batches and rank 0 prints,
evaluates and writes the model folder.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from examples.pos_tagging.evaluate import score
from examples.pos_tagging.features import Featurizer
from examples.pos_tagging.packing import batch_inputs, training_sampler
from examples.pos_tagging.schemas import LOG_SCHEMA
from examples.pos_tagging.tagger import (
    Tagger,
    TaggerConfig,
    builtin_cells,
    cell_template,
    tag_ids,
)
from unroll.core.atomic import write_atomic
from unroll.core.errors import FileFormatError, NetError
from unroll.engine.backend import module_of
from unroll.engine.cuda_graph import graphs_for
from unroll.tools.ewt import DEV_FILE, TRAIN_FILE, read_split
from unroll.train import distributed
from unroll.train import model_folder as folder
from unroll.train.solver import NonFiniteError, Solver

__all__ = ["BUCKETED_LR", "DEV_FILE", "PACKED_LR", "TRAIN_FILE", "TrainOptions",
           "TrainingDiverged", "bad_batch", "checked_step", "diverged", "train"]


#: Adam's default learning rates with length buckets and with packed rows
BUCKETED_LR, PACKED_LR = 2e-3, 4e-3


@dataclass
class TrainOptions:
    """What to train on, where, and how.

    ``sizes`` are :class:`TaggerConfig` fields to set: a fresh run's config is
    ``TaggerConfig(**sizes)``; a resumed run keeps the folder's config, and a
    size given here that differs from it is an error naming both. The same
    holds for ``seed``, which a resumed run takes from the folder's log.
    """

    data: Path
    model_dir: Path
    epochs: int = 14
    max_minutes: float | None = None  # None: no time limit; else stop before the next epoch
    lr: float | None = None  # None: PACKED_LR, or BUCKETED_LR with pack=False
    lr_gamma: float = 0.85
    clip: float = 5.0
    seed: int | None = None  # None: 0, or on --resume the folder's
    limit: int = 0
    resume: bool = False
    overwrite: bool = False
    skip_bad_batches: int = 0
    device: str = "cpu"
    quiet: bool = False
    pack: bool = True  # rows of whole sentences back to back (packing.py); --no-pack
    memory_budget: int | None = None  # bytes a training net may plan (Net's memory_budget)
    sizes: dict = field(default_factory=dict)

    @property
    def learning_rate(self) -> float:
        """``lr``, else the default for the batches: a packed epoch takes 188 steps of about
        2.2x the tokens where a bucketed one takes 405 (on EWT), so its rate is 2x (best
        dev UPOS, seeds 0 and 2: 95.54% and 95.45% at 2x, 95.47% and 95.32% at 1.5x,
        95.32% for seed 0 at the bucketed rate)."""
        if self.lr is not None:
            return self.lr
        return PACKED_LR if self.pack else BUCKETED_LR


def training_solver(model, opts: TrainOptions, steps_per_epoch: int, comm=None) -> Solver:
    """The tagger's Adam: ``opts``' learning rate, decayed by ``lr_gamma`` every epoch of
    ``steps_per_epoch`` steps (Caffe's lr_policy "step"), gradients clipped at ``clip``;
    a non-finite batch is skipped, ``skip_bad_batches`` times at most. On a GPU each batch
    shape's gradient pass is replayed as a CUDA graph (``solver.graphs``)."""
    solver = Solver(model, type="Adam", base_lr=opts.learning_rate, momentum=0.9,
                    momentum2=0.999, delta=1e-8, lr_policy="step", gamma=opts.lr_gamma,
                    stepsize=steps_per_epoch, clip_gradients=opts.clip, comm=comm,
                    nonfinite="skip", max_skipped=opts.skip_bad_batches)
    solver.graphs = graphs_for(model)
    return solver


class TrainingDiverged(RuntimeError):
    """A non-finite loss, gradient or weight: training stopped before saving anything of it."""


class ParamAverage:
    """An exponential moving average of the learned params (Polyak averaging).

    The tagger is evaluated and saved with the average in place of the params:
    it smooths the last updates' noise. The decay warms up as (1 + n) / (10 + n)
    so that the first epoch's average is not held back by the initial weights.
    """

    def __init__(self, params, decay: float = 0.998):
        self.params = [p for p in params if p.lr_mult]
        self.decay = decay
        self.updates = 0
        self.values = [p.blob.data.copy() for p in self.params]

    def update(self) -> None:
        self.updates += 1
        rate = 1 - min(self.decay, (1 + self.updates) / (10 + self.updates))
        for avg, p in zip(self.values, self.params):
            avg += rate * (p.blob.data - avg)

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


def evaluate(tagger: Tagger, sentences) -> dict:
    predicted = tagger.predict([forms for forms, _ in sentences])
    return score(tag_ids([tags for _, tags in sentences]), predicted)


def plot(log: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [e["epoch"] for e in log]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    losses = [math.nan if e["train_loss"] is None else e["train_loss"] for e in log]
    ax.plot(epochs, losses, "o-", color="tab:blue")
    ax.set_xlabel("epoch")
    ax.set_ylabel("train loss", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(epochs, [100 * e["dev_accuracy"] for e in log], "s-", color="tab:red")
    ax2.set_ylabel("dev UPOS accuracy (%)", color="tab:red")
    ax.set_title("unroll BiLSTM tagger, UD English EWT")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, png.getvalue())


def all_finite(arrays) -> bool:
    return all(bool(module_of(a).isfinite(a).all()) for a in arrays)


def train(opts: TrainOptions) -> dict:
    """Train (or resume) and return the log of the last epoch."""
    started = time.perf_counter()
    train_sents = read_split(opts.data, TRAIN_FILE, opts.limit)
    dev_sents = read_split(opts.data, DEV_FILE, opts.limit)
    comm = distributed.init(opts.device)
    try:
        if comm.rank == 0:  # the rank that prints, evaluates and writes
            with folder.claimed(opts.model_dir, opts.resume, opts.overwrite,
                                LOG_SCHEMA) as model_dir:
                described = _describe(opts, model_dir, train_sents)
                comm.barrier()
                return _train(opts, comm, model_dir, described, train_sents, dev_sents,
                              started)
        comm.barrier()  # rank 0 has claimed the folder and written what the others read
        model_dir = opts.model_dir
        described = (Featurizer.load(model_dir / folder.FEATURES),
                     TaggerConfig.load(model_dir / folder.CONFIG),
                     folder.read_log(model_dir, LOG_SCHEMA))
        return _train(opts, comm, model_dir, described, train_sents, dev_sents, started)
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        # a failed write (a full disk) names no file: the folder being written is the place
        raise type(e)(e.errno, e.strerror, str(opts.model_dir)) from e


def _describe(opts: TrainOptions, model_dir: Path, train_sents):
    """(featurizer, config, log): the folder's own when resuming, else new ones, saved."""
    config_path, features_path = model_dir / folder.CONFIG, model_dir / folder.FEATURES
    log = folder.read_log(model_dir, LOG_SCHEMA) if opts.resume else []
    if log:  # folder.claimed let only a complete, consistent folder through
        try:
            config = TaggerConfig.load(config_path)
            cell_template(config.cell, model_dir)
            featurizer = Featurizer.load(features_path)
        except FileFormatError as e:
            raise folder.resume_error(model_dir, str(e)) from None
        asked = dict(opts.sizes, **({} if opts.seed is None else {"seed": opts.seed}))
        folder.settings_differ(model_dir, asked, dict(asdict(config), seed=log[-1]["seed"]))
        return featurizer, config, log
    config = TaggerConfig(**opts.sizes)
    if config.cell not in builtin_cells():  # the folder keeps its own copy of the template
        template = Path(config.cell)
        if not template.is_file():
            raise ValueError(f"--cell {config.cell}: neither a built-in step template "
                             f"({', '.join(builtin_cells())}) nor a template file")
        if template.name in folder.TRAINER_NAMES or template.suffix in folder.WEIGHT_SUFFIXES:
            raise ValueError(f"--cell {config.cell}: the model folder keeps its own files "
                             f"under that name; rename the template (e.g. to "
                             f"{template.stem}.prototxt.j2)")
        write_atomic(model_dir / template.name, template.read_bytes())
        config.cell = template.name
    featurizer = Featurizer.build([forms for forms, _ in train_sents])
    featurizer.save(features_path)
    config.save(config_path)  # last: a folder with config.json has its features.json
    return featurizer, config, []


def _train(opts: TrainOptions, comm, model_dir: Path, described, train_sents, dev_sents,
           started) -> dict:
    featurizer, config, log = described
    lead = comm.rank == 0
    seed = log[-1]["seed"] if log else opts.seed or 0
    # each rank its own dropout masks; the solver broadcasts rank 0's params
    tagger = Tagger(featurizer, config, device=opts.device, seed=seed + comm.rank,
                    folder=model_dir, memory_budget=opts.memory_budget)
    encoded = tagger.encode([forms for forms, _ in train_sents])
    gold = tag_ids([tags for _, tags in train_sents])
    lengths = [len(forms) for forms, _ in train_sents]
    sampler = training_sampler(lengths, config.batch, seed, comm.rank, comm.size, opts.pack)
    solver = training_solver(tagger.train_model, opts, len(sampler), comm)
    average = ParamAverage(tagger.train_model.learnable_params)
    if log:
        _restore(solver, average, tagger, model_dir, log[-1])
    elif opts.resume and lead:
        tqdm.write(f"--resume: {model_dir} holds no model yet; starting from the first epoch")
    best = max((e["dev_accuracy"] for e in log), default=-1.0)
    earlier = sum(e["seconds"] for e in log)  # training time before a resume
    result = log[-1] if log else {}
    skipped = 0
    for epoch in range(len(log), opts.epochs):
        elapsed = time.perf_counter() - started + earlier
        if opts.max_minutes is not None and comm.sum(elapsed > opts.max_minutes * 60):
            # all ranks stop together; how far it got is in the result and the log
            result = _stopped_early(model_dir, log, epoch, opts.epochs) if lead else result
            break
        epoch_start = time.perf_counter()
        _seed_epoch(tagger, seed, comm.rank, epoch)
        tokens, losses, compute = 0, [], 0.0
        bar = tqdm(sampler.epoch_batches(epoch), desc=f"epoch {epoch + 1}/{opts.epochs}",
                   unit="batch", disable=opts.quiet or not lead, dynamic_ncols=True,
                   mininterval=1.0)
        for k, batch in enumerate(bar):
            # --pack: the call site of packing.py (packed rows or padded sentences)
            inputs, batch_tokens = batch_inputs(tagger, encoded, gold, batch, sampler)
            t0 = time.perf_counter()
            try:
                loss = solver.step(1, feed=inputs)
            except NonFiniteError as e:
                raise diverged(bad_batch(epoch, k, e.step), model_dir, log, opts.learning_rate,
                               skip_option="--skip-bad-batches") from None
            if len(solver.skipped) > skipped:
                skipped = len(solver.skipped)
                where = bad_batch(epoch, k, solver.skipped[-1])
                if lead:
                    tqdm.write(f"skipped a bad batch at {where} ({skipped} of at most "
                               f"{opts.skip_bad_batches})")
                continue
            losses.append(loss)
            average.update()
            compute += time.perf_counter() - t0
            tokens += batch_tokens
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}", tok_s=f"{tokens / compute:.0f}")
        tokens = comm.sum(tokens)  # of all ranks
        if not lead:  # rank 0 evaluates and writes; the others join in the snapshot
            solver.snapshot(model_dir / folder.SNAPSHOT_PREFIX)
            continue
        if not all_finite([p.blob.data for p in average.params] + average.values):
            raise diverged(f"the end of epoch {epoch + 1}: weights are not finite", model_dir,
                           log, opts.learning_rate, skip_option="--skip-bad-batches")
        with average.applied():
            dev = evaluate(tagger, dev_sents)
            averaged = tagger.train_model.to_proto().SerializeToString()
        result = {
            "epoch": epoch + 1, "iter": solver.iter,
            "train_loss": float(np.mean(losses)) if losses else None,  # JSON has no NaN
            "dev_accuracy": dev["accuracy"], "tokens_per_s": tokens / max(compute, 1e-9),
            "seconds": time.perf_counter() - epoch_start,
            "padding_fraction": sampler.padding_fraction(epoch), "seed": seed,
        }
        folder.commit_epoch(model_dir, solver, log, result, dev["accuracy"] > best, averaged)
        best = max(best, dev["accuracy"])
        plot(log, model_dir / "curve.png")
        loss = math.nan if result["train_loss"] is None else result["train_loss"]
        tqdm.write(f"epoch {epoch + 1}: loss {loss:.4f}  dev UPOS "
                   f"{100 * dev['accuracy']:.2f}%  (best {100 * best:.2f}%)  "
                   f"{result['tokens_per_s']:.0f} tokens/s  {result['seconds']:.0f} s")
    return result


def _seed_epoch(tagger: Tagger, seed: int, rank: int, epoch: int) -> None:
    """Dropout and word dropout draw from streams of (seed, rank, epoch) alone (the shuffles
    already do, in the sampler), so a resumed epoch draws what the uninterrupted one did."""
    streams = np.random.SeedSequence([seed, rank, epoch])
    dropout, words = streams.spawn(2)
    tagger.train_model.seed(int(dropout.generate_state(1)[0]))
    tagger.rng = np.random.default_rng(words)


def _restore(solver: Solver, average: ParamAverage, tagger: Tagger, model_dir: Path,
             entry: dict) -> None:
    """The solver, params and average of the epoch ``entry`` logs (see folder.restore_solver)."""
    folder.restore_solver(solver, model_dir, entry)
    try:
        with average.applied():
            tagger.train_model.copy_from(folder.inside(model_dir, entry["average"]))
            average.values = [p.blob.data.copy() for p in average.params]
    except (NetError, FileFormatError) as e:  # weights that do not fit the config
        raise folder.resume_error(model_dir, str(e)) from None
    average.updates = solver.iter


def _stopped_early(model_dir: Path, log: list, epoch: int, epochs: int) -> dict:
    """The last epoch's record, marked as stopped by the time limit (in log.json too)."""
    stopped = f"stopped by --max-minutes after {epoch} of {epochs} epochs"
    if not log:  # no epoch ended, so there is no record to mark
        return {"stopped": stopped}
    log[-1]["stopped"] = stopped
    folder.write_json(model_dir / folder.LOG, log)
    return log[-1]


def bad_batch(epoch: int, k: int, step) -> str:
    """Where a non-finite step (a :class:`~unroll.train.solver.SkippedStep`) was: for messages."""
    return (f"epoch {epoch + 1}, batch {k + 1} (iteration {step.iter}): loss {step.loss:g}, "
            f"gradient norm {step.gradient_norm:g}")


def checked_step(model, solver, inputs: dict) -> float:
    """One training step of ``model`` on ``inputs``: forward, backward and the ``solver``'s
    update; returns the loss. A solver with ``nonfinite="stop"`` raises
    :class:`~unroll.train.solver.NonFiniteError` before updating on a non-finite step."""
    model.clear_param_diffs()
    model.forward(**inputs)
    model.backward()
    solver.update()
    return model.loss


def diverged(where: str, model_dir: Path, log: list, lr: float, resumable: bool = True,
             skip_option: str | None = None) -> TrainingDiverged:
    """The one-line error of a training stopped at a non-finite ``where``, saying what the
    folder keeps and how to go on; shared by the example trainers."""
    kept = (f"{model_dir} keeps epoch {log[-1]['epoch']}" if log
            else f"no epoch had ended, so {model_dir} holds no weights")
    again = "--resume" if log and resumable else "--overwrite"
    skip = f", or allow a few bad batches with {skip_option} N" if skip_option else ""
    return TrainingDiverged(f"training diverged at {where}. Nothing of it was saved; {kept}. "
                            f"Lower --lr (now {lr:g}) and run again with {again}{skip}")
