"""Train a lemmatizer into a model folder, and score one on a split.

The model folder is the tagger's (:mod:`unroll.train.model_folder`, which
says the files, their order and the lock), every file written atomically:
``features.json`` (the character vocabulary and the training dictionary) and
``config.json`` first, then per epoch the solver's snapshot, ``log.json`` (the
commit point, with the SHA-256 of every weight file, which loading and
``--resume`` check), ``last.caffemodel`` and ``best.caffemodel`` (the epoch of
the best combined dev accuracy). The JSON files are read back schema-checked
(:mod:`unroll.core.json_files`). ``resume`` continues the last logged
epoch with the folder's sizes and seed; since each epoch's shuffle and dropout
masks are drawn from (seed, epoch) alone, it trains the model an uninterrupted
run would have, bit for bit.

The seq2seq trains on the distinct (form, UPOS, lemma) triples of the training
split (the dictionary answers for the frequent words; the seq2seq is for the
rest), with Adam and teacher forcing.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from examples.lemmatize.conll import read_lemmas
from examples.lemmatize.model import LEMMATIZER_FILES, Lemmatizer, LemmatizerConfig
from unroll import Solver
from unroll.core.errors import FileFormatError
from unroll.tools.ewt import DEV_FILE, TRAIN_FILE
from unroll.train import model_folder as folder
from unroll.train.solver import NonFiniteError
from unroll.train.trainer import bad_batch, diverged

__all__ = ["TrainOptions", "dictionary_baseline", "scores", "train", "words_of"]



#: the TrainOptions fields that are LemmatizerConfig sizes
SIZES = ("embed", "hidden", "dropout", "batch")


@dataclass
class TrainOptions:
    """What to train on, where, and how. A size or ``seed`` left at None is the default
    (:class:`LemmatizerConfig`'s; seed 0) in a new folder and the folder's own with
    ``resume``, where one given that differs from the folder's is an error naming both."""

    model_dir: Path
    data: Path
    epochs: int = 40
    lr: float = 3e-3
    hidden: int | None = None
    embed: int | None = None
    dropout: float | None = None
    batch: int | None = None
    limit: int = 0
    max_minutes: float | None = 20.0
    seed: int | None = None
    quiet: bool = False
    resume: bool = False
    overwrite: bool = False

    def sizes(self) -> dict:
        """The sizes given (not None)."""
        return {k: getattr(self, k) for k in SIZES if getattr(self, k) is not None}


def words_of(sentences) -> list[tuple[str, str, str]]:
    """The (form, UPOS, lemma) of every word of ``sentences`` (from :func:`read_lemmas`)."""
    return [t for forms, upos, lemmas in sentences for t in zip(forms, upos, lemmas)]


def _accuracy(gold, predicted) -> float:
    return sum(g == p for g, p in zip(gold, predicted)) / max(len(gold), 1)


def dictionary_baseline(lemmatizer: Lemmatizer, words) -> float:
    """The dictionary's accuracy, each word it lacks taken as its own lemma."""
    return _accuracy([lemma for _, _, lemma in words],
                     [lemmatizer.dictionary.get(f, u) or f for f, u, _ in words])


def scores(lemmatizer: Lemmatizer, words, beam: int = 1) -> dict:
    """Accuracies over ``words`` ((form, UPOS, lemma) tokens): the seq2seq alone (its
    edit classifier and decoder; ``decoder``: the decoder alone), the dictionary for the
    pairs it has and the seq2seq for the rest, the same with the lower-cased dictionary too;
    and the decoding speed (distinct pairs decoded per second)."""
    pairs = sorted({(f, u) for f, u, _ in words})
    start = time.perf_counter()
    decoded = dict(zip(pairs, lemmatizer.predict(pairs, beam=beam)))
    seconds = time.perf_counter() - start
    raw = dict(zip(pairs, lemmatizer.predict(pairs, beam=beam, edits=False)))
    gold = [lemma for _, _, lemma in words]
    seq2seq = [decoded[(f, u)] for f, u, _ in words]

    def combined(lower):
        return [lemmatizer.dictionary.get(f, u, lower) or s for (f, u, _), s in zip(words, seq2seq)]

    return {"seq2seq": _accuracy(gold, seq2seq),
            "decoder": _accuracy(gold, [raw[(f, u)] for f, u, _ in words]),
            "combined": _accuracy(gold, combined(False)),
            "combined_lower": _accuracy(gold, combined(True)),
            "dictionary": dictionary_baseline(lemmatizer, words),
            "words_per_s": len(pairs) / max(seconds, 1e-9), "pairs": len(pairs)}


def _read(path: Path, limit: int):
    sents = read_lemmas(path)
    return sents[:limit] if limit else sents


def train(opts: TrainOptions) -> list[dict]:
    """Train (or, with ``resume``, continue) into the model folder; returns log.json's
    entries."""
    started = time.perf_counter()
    train_words = words_of(_read(Path(opts.data) / TRAIN_FILE, opts.limit))
    dev_words = words_of(_read(Path(opts.data) / DEV_FILE, opts.limit))
    with folder.claimed(Path(opts.model_dir), opts.resume, opts.overwrite,
                        LEMMATIZER_FILES) as model_dir:
        lemmatizer, log = _described(opts, model_dir, train_words)
        return _train(opts, model_dir, lemmatizer, log, train_words, dev_words, started)


def _described(opts: TrainOptions, model_dir: Path, train_words):
    """(lemmatizer, log): the folder's own when resuming, else a new one, its description
    saved."""
    log = folder.read_log(model_dir, LEMMATIZER_FILES) if opts.resume else []
    if log:  # folder.claimed let only a complete, consistent folder through
        try:
            lemmatizer = Lemmatizer.described(model_dir, log, seed=log[-1]["seed"])
        except FileFormatError as e:
            raise folder.resume_error(model_dir, str(e)) from None
        asked = dict(opts.sizes(), **({} if opts.seed is None else {"seed": opts.seed}))
        folder.settings_differ(model_dir, asked,
                               dict(asdict(lemmatizer.config), seed=log[-1]["seed"]))
        return lemmatizer, log
    lemmatizer = Lemmatizer.build(train_words, LemmatizerConfig(**opts.sizes()),
                                  seed=opts.seed or 0)
    lemmatizer.save_description(model_dir)
    return lemmatizer, []


def _seed_epoch(lemmatizer: Lemmatizer, seed: int, epoch: int) -> np.random.Generator:
    """The epoch's shuffle, and its dropout masks, from streams of (seed, epoch) alone, so
    that a resumed epoch draws what the uninterrupted one did."""
    shuffle, dropout = np.random.SeedSequence([seed, epoch]).spawn(2)
    lemmatizer.train_model.seed(int(dropout.generate_state(1)[0]))
    return np.random.default_rng(shuffle)


def _train(opts: TrainOptions, model_dir: Path, lemmatizer: Lemmatizer, log: list,
           train_words, dev_words, started: float) -> list[dict]:
    seed = log[-1]["seed"] if log else opts.seed or 0
    examples = sorted(set(train_words))
    steps_per_epoch = len(lemmatizer.batches(examples))
    solver = Solver(lemmatizer.train_model, type="Adam", base_lr=opts.lr, momentum=0.9,
                    momentum2=0.999, delta=1e-8, lr_policy="step", gamma=0.95,
                    stepsize=steps_per_epoch, clip_gradients=5.0, nonfinite="stop")
    if log:
        folder.restore_solver(solver, model_dir, log[-1])
    model = lemmatizer.train_model
    best = max((e["dev_combined"] for e in log), default=-1.0)
    earlier = sum(e["seconds"] for e in log)  # training time before a resume
    last_seconds = log[-1]["seconds"] if log else 0.0
    for epoch in range(len(log), opts.epochs):
        elapsed = time.perf_counter() - started + earlier
        if opts.max_minutes and log and elapsed + last_seconds > 60 * opts.max_minutes:
            log[-1]["stopped"] = (f"stopped by --max-minutes after {len(log)} of "
                                  f"{opts.epochs} epochs")
            folder.write_json(model_dir / folder.LOG, log)
            break
        t0, losses, words, compute = time.perf_counter(), [], 0, 0.0
        rng = _seed_epoch(lemmatizer, seed, epoch)
        bar = tqdm(lemmatizer.batches(examples, rng), desc=f"epoch {epoch + 1}/{opts.epochs}",
                   unit="batch", disable=opts.quiet, mininterval=1.0, dynamic_ncols=True)
        for k, (key, inputs) in enumerate(bar):
            c0 = time.perf_counter()
            try:
                losses.append(checked_step(model, solver, dict(widths=key, **inputs)))
            except NonFiniteError as e:
                raise diverged(bad_batch(epoch, k, e.step), model_dir, log, opts.lr) from None
            compute += time.perf_counter() - c0
            words += inputs["src"].shape[1]
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}",
                            words_s=f"{words / compute:.0f}")
        dev = scores(lemmatizer, dev_words)
        last_seconds = time.perf_counter() - t0
        entry = {"epoch": epoch + 1, "iter": solver.iter,
                 "train_loss": float(np.mean(losses)), "dev_accuracy": dev["seq2seq"],
                 "dev_combined": dev["combined"], "dev_combined_lower": dev["combined_lower"],
                 "seconds": last_seconds, "words_per_s": words / max(compute, 1e-9),
                 "seed": seed}
        folder.commit_epoch(model_dir, solver, log, entry, dev["combined"] > best,
                            files=LEMMATIZER_FILES)
        best = max(best, dev["combined"])
        if not opts.quiet:
            tqdm.write(f"epoch {epoch + 1}: loss {entry['train_loss']:.4f}  dev seq2seq "
                       f"{100 * dev['seq2seq']:.2f}%  combined {100 * dev['combined']:.2f}% "
                       f"(best {100 * best:.2f}%)  with lower-casing "
                       f"{100 * dev['combined_lower']:.2f}%  {entry['words_per_s']:.0f} "
                       f"words/s  {last_seconds:.0f} s")
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
