"""Train the tagger: bucketed batches, Adam, dev accuracy per epoch, best checkpoint.

Everything lands in the model folder: ``best.caffemodel`` (the averaged
params of the best dev epoch), ``average.caffemodel`` (the last epoch's
average), ``snapshot_iter_N.caffemodel`` + ``.solverstate`` (the raw params
and solver state of the last epoch, to resume), ``features.json`` and
``config.json``, ``log.json`` and ``curve.png``.

Under ``mpirun -n N`` it trains data-parallel (:mod:`unroll.distributed`):
each rank takes its share of every epoch's batches and rank 0 prints,
evaluates and writes the model folder.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from examples.pos_tagging.conll import read_conllu
from examples.pos_tagging.evaluate import score
from examples.pos_tagging.features import Featurizer
from examples.pos_tagging.packing import batch_inputs
from examples.pos_tagging.tagger import Tagger, TaggerConfig, tag_ids
from unroll import distributed
from unroll.atomic import write_atomic
from unroll.bucketing import BucketSampler
from unroll.solver import Solver

TRAIN_FILE = "en_ewt-ud-train.conllu"
DEV_FILE = "en_ewt-ud-dev.conllu"


@dataclass
class TrainOptions:
    data: Path
    model_dir: Path
    epochs: int = 12
    max_minutes: float = 19.0
    lr: float = 2e-3
    lr_gamma: float = 0.85
    clip: float = 5.0
    seed: int = 0
    limit: int = 0
    resume: bool = False
    device: str = "cpu"
    quiet: bool = False
    pack: bool = False  # --pack: rows of whole sentences back to back (packing.py)
    config: TaggerConfig = field(default_factory=TaggerConfig)


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


def read_split(data: Path, name: str, limit: int = 0):
    path = data / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found. Download UD English EWT (train and dev .conllu) from "
            f"https://github.com/UniversalDependencies/UD_English-EWT and pass --data DIR"
        )
    sentences = list(read_conllu(path))
    return sentences[:limit] if limit else sentences


def evaluate(tagger: Tagger, sentences) -> dict:
    predicted = tagger.predict([forms for forms, _ in sentences])
    return score(tag_ids([tags for _, tags in sentences]), predicted)


def plot(log: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [e["epoch"] for e in log]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(epochs, [e["train_loss"] for e in log], "o-", color="tab:blue")
    ax.set_xlabel("epoch")
    ax.set_ylabel("train loss", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(epochs, [100 * e["dev_accuracy"] for e in log], "s-", color="tab:red")
    ax2.set_ylabel("dev UPOS accuracy (%)", color="tab:red")
    ax.set_title("unroll BiLSTM tagger, UD English EWT")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def train(opts: TrainOptions) -> dict:
    """Train (or resume) and return the log of the last epoch."""
    started = time.perf_counter()
    comm = distributed.init(opts.device)
    lead = comm.rank == 0  # the rank that prints, evaluates and writes
    train_sents = read_split(opts.data, TRAIN_FILE, opts.limit)
    dev_sents = read_split(opts.data, DEV_FILE, opts.limit)
    model_dir = opts.model_dir
    model_dir.mkdir(parents=True, exist_ok=True)
    log_path = model_dir / "log.json"
    resuming = opts.resume and log_path.is_file()
    if resuming:
        featurizer = Featurizer.load(model_dir / "features.json")
        config = TaggerConfig.load(model_dir / "config.json")
        log = json.loads(log_path.read_text())
    else:
        featurizer = Featurizer.build([forms for forms, _ in train_sents])
        config = opts.config
        log = []
    # each rank its own dropout masks; the solver broadcasts rank 0's params
    tagger = Tagger(featurizer, config, device=opts.device, seed=opts.seed + comm.rank)
    encoded = tagger.encode([forms for forms, _ in train_sents])
    gold = tag_ids([tags for _, tags in train_sents])
    lengths = [len(forms) for forms, _ in train_sents]
    sampler = BucketSampler(lengths, batch_size=config.batch, seed=opts.seed,
                            rank=comm.rank, size=comm.size, pack=opts.pack)
    solver = Solver(
        tagger.train_model, type="Adam", base_lr=opts.lr, momentum=0.9, momentum2=0.999,
        delta=1e-8, lr_policy="step", gamma=opts.lr_gamma, stepsize=len(sampler),
        clip_gradients=opts.clip, comm=comm,
    )
    average = ParamAverage(tagger.train_model.learnable_params)
    if resuming:
        solver.restore(model_dir / log[-1]["snapshot"])
        with average.applied():
            tagger.train_model.copy_from(model_dir / "average.caffemodel")
            average.values = [p.blob.data.copy() for p in average.params]
        average.updates = solver.iter
    best = max((e["dev_accuracy"] for e in log), default=0.0)
    earlier = sum(e["seconds"] for e in log)  # training time before a resume
    result = log[-1] if log else {}
    for epoch in range(len(log), opts.epochs):
        elapsed = time.perf_counter() - started + earlier
        if comm.sum(elapsed > opts.max_minutes * 60):  # all ranks stop together
            break
        epoch_start = time.perf_counter()
        tokens, losses, compute = 0, [], 0.0
        bar = tqdm(sampler.epoch_batches(epoch), desc=f"epoch {epoch + 1}/{opts.epochs}",
                   unit="batch", disable=opts.quiet or not lead, dynamic_ncols=True,
                   mininterval=1.0)
        for batch in bar:
            # --pack: the call site of packing.py (packed rows or padded sentences)
            inputs, batch_tokens = batch_inputs(tagger, encoded, gold, batch, sampler)
            t0 = time.perf_counter()
            losses.append(solver.step(1, feed=lambda _, inputs=inputs: inputs))
            average.update()
            compute += time.perf_counter() - t0
            tokens += batch_tokens
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}", tok_s=f"{tokens / compute:.0f}")
        tokens = comm.sum(tokens)  # of all ranks
        if not lead:  # rank 0 evaluates and writes; the others join in the snapshot
            solver.snapshot(model_dir / "snapshot")
            continue
        with average.applied():
            dev = evaluate(tagger, dev_sents)
            tagger.save(model_dir, "average")
            if dev["accuracy"] > best:
                best = dev["accuracy"]
                tagger.save(model_dir, "best")
        result = {
            "epoch": epoch + 1, "iter": solver.iter, "train_loss": float(np.mean(losses)),
            "dev_accuracy": dev["accuracy"], "tokens_per_s": tokens / compute,
            "seconds": time.perf_counter() - epoch_start,
            "padding_fraction": sampler.padding_fraction(epoch),
        }
        _, state = solver.snapshot(model_dir / "snapshot")
        result["snapshot"] = state.name
        previous = log[-1]["snapshot"] if log else None
        log.append(result)
        write_atomic(log_path, json.dumps(log, indent=2).encode())
        if previous and previous != state.name:
            for old in (model_dir / previous, (model_dir / previous).with_suffix(".caffemodel")):
                old.unlink(missing_ok=True)
        plot(log, model_dir / "curve.png")
        tqdm.write(f"epoch {epoch + 1}: loss {result['train_loss']:.4f}  dev UPOS "
                   f"{100 * dev['accuracy']:.2f}%  (best {100 * best:.2f}%)  "
                   f"{result['tokens_per_s']:.0f} tokens/s  {result['seconds']:.0f} s")
    return result
