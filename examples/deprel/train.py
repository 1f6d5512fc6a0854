"""Train a DEPREL labeller into a model folder; evaluate one; label a CoNLL-U file.

The model folder is the library's (:mod:`unroll.train.model_folder`, declared
by :data:`~examples.deprel.labeller.DEPREL_FILES`): ``features.json`` and
``config.json`` first, then per epoch a snapshot, ``log.json`` (one entry per
epoch, the commit point, with the SHA-256 of every file), ``last.caffemodel``
and ``best.caffemodel`` (the best dev epoch), under its ``train.lock``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from examples.deprel.conll import read_deprel
from examples.deprel.labeller import DEPREL_FILES, DeprelConfig, Labeller
from examples.pos_tagging.features import Featurizer, word_dropout
from unroll.tools.ewt import DEV_FILE, TRAIN_FILE
from unroll.train import model_folder as folder
from unroll.train.solver import NonFiniteError, Solver
from unroll.train.trainer import bad_batch, diverged

__all__ = ["TrainOptions", "accuracy", "train"]



@dataclass
class TrainOptions:
    model_dir: Path
    data: Path
    model: str = "tree"
    epochs: int = 20
    lr: float = 2e-3
    hidden: int = 100
    limit: int = 0
    max_minutes: float | None = None
    seed: int = 0
    quiet: bool = False
    overwrite: bool = False


def accuracy(gold, predicted) -> float:
    """Share of words whose predicted DEPREL is the gold one."""
    pairs = [(g, p) for gs, ps in zip(gold, predicted) for g, p in zip(gs, ps)]
    return sum(g == p for g, p in pairs) / max(len(pairs), 1)


def majority_accuracy(train_sents, dev_sents) -> float:
    """Dev accuracy of labelling every word with the most frequent training DEPREL."""
    counts: dict = {}
    for s in train_sents:
        for d in s.deprels:
            counts[d] = counts.get(d, 0) + 1
    top = max(counts, key=counts.get)
    return accuracy([s.deprels for s in dev_sents], [[top] * len(s.deprels) for s in dev_sents])


def _read(path: Path, limit: int):
    sents = read_deprel(path)
    return sents[:limit] if limit else sents


def train(opts: TrainOptions) -> list[dict]:
    """Train, writing the model folder; returns log.json's entries."""
    started = time.perf_counter()
    train_sents = _read(Path(opts.data) / TRAIN_FILE, opts.limit)
    dev_sents = _read(Path(opts.data) / DEV_FILE, opts.limit)
    with folder.claimed(Path(opts.model_dir), False, opts.overwrite, DEPREL_FILES) as model_dir:
        labels = sorted({d for s in train_sents for d in s.deprels})
        config = DeprelConfig(model=opts.model, labels=labels, hidden=opts.hidden)
        featurizer = Featurizer.build([s.forms for s in train_sents])
        featurizer.save(model_dir / folder.FEATURES)
        config.save(model_dir / folder.CONFIG)
        labeller = Labeller(featurizer, config, seed=opts.seed)
        encoded = labeller.encode(train_sents)
        dev = labeller.encode(dev_sents)
        sampler = labeller.sampler(encoded, seed=opts.seed)
        solver = Solver(labeller.train_model, type="Adam", base_lr=opts.lr, momentum=0.9,
                        momentum2=0.999, delta=1e-8, lr_policy="step", gamma=0.9,
                        stepsize=len(sampler), clip_gradients=5.0, nonfinite="stop")
        rng = np.random.default_rng(opts.seed)
        log, best = [], -1.0
        for epoch in range(opts.epochs):
            if opts.max_minutes and time.perf_counter() - started > 60 * opts.max_minutes:
                break
            t0, losses, words, compute = time.perf_counter(), [], 0, 0.0
            nets_before = len(labeller.train_model.nets)
            bar = tqdm(list(labeller.batches(encoded, sampler, epoch)),
                       desc=f"epoch {epoch + 1}/{opts.epochs}", unit="batch",
                       disable=opts.quiet, mininterval=1.0, dynamic_ncols=True)
            for k, (key, inputs, where) in enumerate(bar):
                # unknown words are learned from rare ones, as the tagger does
                inputs["word"] = word_dropout(inputs["word"].astype(np.int64),
                                              featurizer.vocabs["word"], rng).astype(float)
                c0 = time.perf_counter()
                try:
                    losses.append(checked_step(labeller.train_model, solver,
                                               dict(widths=key, **inputs)))
                except NonFiniteError as e:
                    raise diverged(bad_batch(epoch, k, e.step), model_dir, log, opts.lr,
                                   resumable=False) from None
                compute += time.perf_counter() - c0
                words += sum(len(w) for w in where)
                bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}",
                                words_s=f"{words / compute:.0f}")
            dev_acc = accuracy([s.deprels for s in dev_sents], labeller.predict(dev))
            entry = {"epoch": epoch + 1, "iter": solver.iter, "train_loss": float(np.mean(losses)),
                     "dev_accuracy": dev_acc, "seconds": time.perf_counter() - t0,
                     "words_per_s": words / max(compute, 1e-9),
                     "nets_built": len(labeller.train_model.nets) - nets_before,
                     "padding_fraction": sampler.padding_fraction(epoch)}
            folder.commit_epoch(model_dir, solver, log, entry, dev_acc > best,
                                files=DEPREL_FILES)
            best = max(best, dev_acc)
            if not opts.quiet:
                tqdm.write(f"epoch {epoch + 1}: loss {entry['train_loss']:.4f}  dev LA "
                           f"{100 * dev_acc:.2f}% (best {100 * best:.2f}%)  "
                           f"{entry['words_per_s']:.0f} words/s  {entry['nets_built']} nets "
                           f"built  padding {100 * entry['padding_fraction']:.1f}%")
        return log


def checked_step(model, solver, inputs: dict) -> float:
    """One training step of ``model`` on ``inputs``: forward, backward and the ``solver``'s
    update; returns the loss. A solver with ``nonfinite="stop"`` raises
    :class:`~unroll.train.solver.NonFiniteError` before updating on a non-finite step."""
    model.clear_param_diffs()
    model.forward(**inputs)
    model.backward()
    solver.update()
    return model.loss
