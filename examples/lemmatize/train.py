"""Train a lemmatizer: the distinct (form, UPOS, lemma) triples of train, Adam, dev lemma
accuracies per epoch; and score one on a split.

The epoch loop, the model folder, seeding, the time limit, the non-finite
policy and MPI ranks are the library's (:class:`unroll.train.trainer.Trainer`,
docs/design.md, 10. Training); this module is the lemmatizer's part of it
(:class:`LemmatizerTraining`): its data, its description (``features.json``:
the character vocabulary and the training dictionary; ``config.json``: the
sizes), its nets and batches, its Adam with teacher forcing, and its dev
scores. The params themselves are evaluated and saved (no average), and
``best.caffemodel`` is the epoch of the best combined dev accuracy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from examples.lemmatize.conll import read_lemmas
from examples.lemmatize.model import (
    CONFIG_SCHEMA,
    LEMMATIZER_FILES,
    Description,
    Lemmatizer,
    LemmatizerConfig,
)
from unroll.core import json_files
from unroll.core.errors import FileFormatError
from unroll.tools.ewt import DEV_FILE, TRAIN_FILE
from unroll.train import model_folder as folder
from unroll.train.run_options import RunOptions
from unroll.train.trainer import Metric

__all__ = ["LemmatizerTraining", "TrainOptions", "WordBatches", "dictionary_baseline",
           "read_words", "scores", "train", "words_of"]


#: the Adam learning rate where --lr is not given
LR = 3e-3


@dataclass
class TrainOptions(RunOptions):
    """What to train on, where, and how (:class:`~unroll.train.run_options.RunOptions`;
    ``lr`` None: :data:`LR`; the lemmatizer runs on the CPU only).

    ``sizes`` are :class:`LemmatizerConfig` fields to set: a fresh run's config is
    ``LemmatizerConfig(**sizes)``.
    """

    epochs: int = 40


def words_of(sentences) -> list[tuple[str, str, str]]:
    """The (form, UPOS, lemma) of every word of ``sentences`` (from :func:`read_lemmas`)."""
    return [t for forms, upos, lemmas in sentences for t in zip(forms, upos, lemmas)]


def read_words(path: Path, limit: int | None = None) -> list[tuple[str, str, str]]:
    """The (form, UPOS, lemma) words of the first ``limit`` sentences (None: all) of the
    CoNLL-U file ``path``, which must hold one."""
    if not Path(path).exists():
        raise FileNotFoundError(f"{path} not found: expected a CoNLL-U file with lemmas "
                                f"(--data DIR: a folder with {TRAIN_FILE} and {DEV_FILE})")
    sentences = read_lemmas(path)
    if not sentences:
        raise FileFormatError(path, "holds no sentences")
    return words_of(sentences[:limit])


def _accuracy(gold, predicted) -> float:
    return sum(g == p for g, p in zip(gold, predicted)) / max(len(gold), 1)


def dictionary_baseline(lemmatizer: Lemmatizer, words) -> float:
    """The dictionary's accuracy, each word it lacks taken as its own lemma."""
    return _accuracy([lemma for _, _, lemma in words],
                     [lemmatizer.dictionary.get(f, u) or f for f, u, _ in words])


def scores(lemmatizer: Lemmatizer, words, beam: int = 1) -> dict:
    """Accuracies over ``words`` ((form, UPOS, lemma) tokens): the seq2seq alone (its
    edit classifier and decoder), the dictionary for the pairs it has and the seq2seq for
    the rest, the same with the lower-cased dictionary too, and the dictionary alone; and
    how many distinct (form, UPOS) pairs were decoded."""
    pairs = sorted({(f, u) for f, u, _ in words})
    decoded = dict(zip(pairs, lemmatizer.predict(pairs, beam=beam)))
    gold = [lemma for _, _, lemma in words]
    seq2seq = [decoded[(f, u)] for f, u, _ in words]

    def combined(lower):
        return [lemmatizer.dictionary.get(f, u, lower) or s for (f, u, _), s in zip(words, seq2seq)]

    return {"seq2seq": _accuracy(gold, seq2seq), "combined": _accuracy(gold, combined(False)),
            "combined_lower": _accuracy(gold, combined(True)),
            "dictionary": dictionary_baseline(lemmatizer, words), "pairs": len(pairs)}


class WordBatches:
    """The sampler of the training triples ``examples``: the lemmatizer's batches (one
    source length each, :meth:`Lemmatizer.batches`), shuffled from ``(seed, epoch)``
    alone, the same on every rank, each of ``size`` ranks taking every size-th batch
    (the last few dropped, so every rank takes as many steps).

    >>> words = [("dogs", "NOUN", "dog"), ("cats", "NOUN", "cat"), ("ran", "VERB", "run")]
    >>> lemmatizer = Lemmatizer.build(words, LemmatizerConfig(embed=4, hidden=4, batch=2))
    >>> batches = WordBatches(lemmatizer, words, seed=0)
    >>> len(batches), [key for key, _ in batches.epoch_batches(0)]  # (source, target) steps
    (2, [(4, 4), (5, 4)])
    >>> [key for key, _ in WordBatches(lemmatizer, words, 0, rank=1, size=2).epoch_batches(0)]
    [(5, 4)]
    """

    def __init__(self, lemmatizer: Lemmatizer, examples, seed: int, rank: int = 0,
                 size: int = 1):
        self.lemmatizer, self.examples = lemmatizer, examples
        self.seed, self.rank, self.size = seed, rank, size
        self.steps = len(lemmatizer.batches(examples)) // size

    def __len__(self) -> int:
        return self.steps

    def epoch_batches(self, epoch: int) -> list:
        shuffle = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]).spawn(1)[0])
        batches = self.lemmatizer.batches(self.examples, shuffle)
        return batches[self.rank::self.size][:self.steps]


class LemmatizerTraining:
    """The lemmatizer as a :class:`~unroll.train.trainer.Application`: EWT's train and dev
    words, the description in the folder, the lemmatizer's nets and batches, and its dev
    accuracies (seq2seq alone, combined with the dictionary, and with the lower-cased
    dictionary too) in every epoch's record."""

    files = LEMMATIZER_FILES
    metric = Metric("dev_combined", "dev combined", percent=True)
    curve_title = "unroll lemmatizer, UD English EWT"

    def __init__(self, opts: TrainOptions):
        # before the folder is claimed: a size the folder's config.json could not hold
        wrong = json_files.problem(asdict(LemmatizerConfig(**opts.sizes)), CONFIG_SCHEMA)
        if wrong is not None:
            raise ValueError(f"--{wrong}")
        self.opts = opts

    def read_data(self) -> None:
        self.train_words = read_words(Path(self.opts.data) / TRAIN_FILE, self.opts.limit)
        self.dev_words = read_words(Path(self.opts.data) / DEV_FILE, self.opts.limit)

    def create(self, model_dir: Path) -> None:
        self.description = Description.build(self.train_words,
                                             LemmatizerConfig(**self.opts.sizes))
        self.description.save(model_dir)

    def load(self, model_dir: Path, log: list[dict]) -> None:
        try:
            self.description = Description.read(model_dir, log)
        except FileFormatError as e:
            raise folder.resume_error(model_dir, str(e)) from None
        folder.settings_differ(model_dir, self.opts.sizes, asdict(self.description.config))

    def model(self, model_dir: Path, seed: int):
        self.lemmatizer = Lemmatizer(self.description, seed)
        return self.lemmatizer.train_model

    def sampler(self, seed: int, rank: int, size: int) -> WordBatches:
        return WordBatches(self.lemmatizer, sorted(set(self.train_words)), seed, rank, size)

    def solver_fields(self, steps_per_epoch: int) -> dict:
        """Adam at ``lr``, decayed by 0.95 every epoch (Caffe's lr_policy "step"), gradients
        clipped at norm 5."""
        return dict(type="Adam", base_lr=self.opts.lr or LR, momentum=0.9, momentum2=0.999,
                    delta=1e-8, lr_policy="step", gamma=0.95, stepsize=steps_per_epoch,
                    clip_gradients=5.0)

    def seed_epoch(self, rng) -> None:
        """Nothing: the lemmatizer's only draws are its shuffle and its dropout."""

    def batch(self, batch) -> tuple[dict, int]:
        key, inputs = batch
        return dict(widths=key, **inputs), inputs["src"].shape[1]

    def evaluate(self, epoch: int) -> dict:
        dev = scores(self.lemmatizer, self.dev_words)
        return {"dev_accuracy": dev["seq2seq"], "dev_combined": dev["combined"],
                "dev_combined_lower": dev["combined_lower"]}


def train(opts: TrainOptions) -> dict:
    """Train (or resume) and return the log of the last epoch (see
    :meth:`unroll.train.trainer.Trainer.fit`)."""
    return opts.trainer(LemmatizerTraining(opts), average=None).fit()
