"""Train a lemmatizer into a model folder, and score one on a split.

The model folder is the tagger's (:mod:`examples.pos_tagging.folder`), under its
``train.lock``, every file written atomically: ``features.json`` (the character
vocabulary and the training dictionary) and ``config.json`` first, then per
epoch ``last.caffemodel``, ``best.caffemodel`` (the epoch of the best combined
dev accuracy) and ``log.json`` (one entry per epoch, the commit point, with
the SHA-256 of both weight files, which loading checks). The JSON files are
read back schema-checked (:mod:`examples.pos_tagging.schema`).

The seq2seq trains on the distinct (form, UPOS, lemma) triples of the training
split (the dictionary answers for the frequent words; the seq2seq is for the
rest), with Adam and teacher forcing.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from examples.lemmatize.conll import read_lemmas
from examples.lemmatize.model import Lemmatizer, LemmatizerConfig
from examples.pos_tagging import folder
from unroll import Solver

__all__ = ["TrainOptions", "dictionary_baseline", "scores", "train", "words_of"]

TRAIN_FILE, DEV_FILE = "en_ewt-ud-train.conllu", "en_ewt-ud-dev.conllu"


@dataclass
class TrainOptions:
    model_dir: Path
    data: Path
    epochs: int = 40
    lr: float = 3e-3
    hidden: int = 128
    embed: int = 64
    dropout: float = 0.2
    batch: int = 48
    limit: int = 0
    max_minutes: float | None = 20.0
    seed: int = 0
    quiet: bool = False
    overwrite: bool = False


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
    """Train, writing the model folder; returns log.json's entries."""
    started = time.perf_counter()
    train_words = words_of(_read(Path(opts.data) / TRAIN_FILE, opts.limit))
    dev_words = words_of(_read(Path(opts.data) / DEV_FILE, opts.limit))
    with folder.claimed(Path(opts.model_dir), False, opts.overwrite) as model_dir:
        config = LemmatizerConfig(embed=opts.embed, hidden=opts.hidden, dropout=opts.dropout,
                                  batch=opts.batch)
        lemmatizer = Lemmatizer.build(train_words, config, seed=opts.seed)
        lemmatizer.save_description(model_dir)
        examples = sorted(set(train_words))
        rng = np.random.default_rng(opts.seed)
        steps_per_epoch = len(lemmatizer.batches(examples))
        solver = Solver(lemmatizer.train_model, type="Adam", base_lr=opts.lr, momentum=0.9,
                        momentum2=0.999, delta=1e-8, lr_policy="step", gamma=0.95,
                        stepsize=steps_per_epoch, clip_gradients=5.0)
        model = lemmatizer.train_model
        log, best, best_data, last_seconds = [], -1.0, b"", 0.0
        for epoch in range(opts.epochs):
            elapsed = time.perf_counter() - started
            if opts.max_minutes and log and elapsed + last_seconds > 60 * opts.max_minutes:
                log[-1]["stopped"] = (f"stopped by --max-minutes after {len(log)} of "
                                      f"{opts.epochs} epochs")
                folder.write_json(model_dir / folder.LOG, log)
                break
            t0, losses, words, compute = time.perf_counter(), [], 0, 0.0
            bar = tqdm(lemmatizer.batches(examples, rng), desc=f"epoch {epoch + 1}/{opts.epochs}",
                       unit="batch", disable=opts.quiet, mininterval=1.0, dynamic_ncols=True)
            for key, inputs in bar:
                c0 = time.perf_counter()
                model.clear_param_diffs()
                model.forward(widths=key, **inputs)
                model.backward()
                solver.update()
                compute += time.perf_counter() - c0
                loss = model.loss
                if not math.isfinite(loss):
                    raise RuntimeError(f"epoch {epoch + 1}: the loss is {loss}; lower --lr")
                losses.append(loss)
                words += inputs["src"].shape[1]
                bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}",
                                words_s=f"{words / compute:.0f}")
            dev = scores(lemmatizer, dev_words)
            last = lemmatizer.save(model_dir / "last.caffemodel")
            if dev["combined"] > best:
                best, best_data = dev["combined"], last
                lemmatizer.save(model_dir / "best.caffemodel")
            last_seconds = time.perf_counter() - t0
            entry = {"epoch": epoch + 1, "iter": solver.iter,
                     "train_loss": float(np.mean(losses)), "dev_accuracy": dev["seq2seq"],
                     "dev_combined": dev["combined"], "dev_combined_lower": dev["combined_lower"],
                     "seconds": last_seconds, "words_per_s": words / max(compute, 1e-9),
                     "sha256": {"last.caffemodel": folder.sha256(last),
                                "best.caffemodel": folder.sha256(best_data)}}
            log.append(entry)
            folder.write_json(model_dir / folder.LOG, log)
            if not opts.quiet:
                tqdm.write(f"epoch {epoch + 1}: loss {entry['train_loss']:.4f}  dev seq2seq "
                           f"{100 * dev['seq2seq']:.2f}%  combined {100 * dev['combined']:.2f}% "
                           f"(best {100 * best:.2f}%)  with lower-casing "
                           f"{100 * dev['combined_lower']:.2f}%  {entry['words_per_s']:.0f} "
                           f"words/s  {last_seconds:.0f} s")
        return log
