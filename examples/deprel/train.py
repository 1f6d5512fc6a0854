"""Train a DEPREL labeller: bucketed trees (or sentences), Adam, dev label accuracy per epoch.

The epoch loop, the model folder, seeding, the time limit, the non-finite
policy and MPI ranks are the library's (:class:`unroll.train.trainer.Trainer`);
this module is the labeller's part of it (:class:`DeprelTraining`): EWT's
trees, the featurizer and config (``features.json``, ``config.json``, which
``log.json`` checksums), the labeller's nets and batches, its Adam and its dev
score. The weights are the params themselves (no average), as they were
before the Trainer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from examples.deprel.conll import read_deprel
from examples.deprel.labeller import DEPREL_FILES, DeprelConfig, Labeller, described
from examples.pos_tagging.features import Featurizer, word_dropout
from unroll.core.errors import FileFormatError
from unroll.tools.ewt import DEV_FILE, TRAIN_FILE
from unroll.train import model_folder as folder
from unroll.train.run_options import RunOptions
from unroll.train.trainer import Metric

__all__ = ["DeprelTraining", "TrainOptions", "accuracy", "majority_accuracy", "read_trees",
           "train"]


#: the Adam learning rate where --lr is not given
LR = 2e-3


@dataclass
class TrainOptions(RunOptions):
    """What to train on, where, and how (:class:`~unroll.train.run_options.RunOptions`;
    ``lr`` None: :data:`LR`).

    ``sizes`` are :class:`~examples.deprel.labeller.DeprelConfig` fields to set (``model``,
    ``hidden``): a fresh run's config is ``DeprelConfig(**sizes)`` with the training
    data's labels.
    """


def accuracy(gold, predicted) -> float:
    """Share of words whose predicted DEPREL is the gold one.

    >>> accuracy([["det", "root"]], [["det", "obj"]])
    0.5
    """
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


def read_trees(path: Path, limit: int | None = None, labelled: bool = True):
    """The sentences of the CoNLL-U file ``path`` (the first ``limit`` if given), which must
    hold some; ``labelled=False``: column 8 may hold anything (a file to label)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; expected a CoNLL-U file")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    sentences = read_deprel(path, labelled=labelled)
    if not sentences:
        raise FileFormatError(path, "holds no sentences")
    return sentences[:limit] if limit else sentences


class DeprelTraining:
    """The labeller as a :class:`~unroll.train.trainer.Application`: EWT's train and dev
    trees, the featurizer and config in the folder, the labeller's bucketed nets, and dev
    label accuracy (with the nets built and the padding) in every epoch's record."""

    files = DEPREL_FILES
    metric = Metric("dev_accuracy", "dev label accuracy", percent=True)
    curve_title = "unroll DEPREL labeller, UD English EWT"

    def __init__(self, opts: TrainOptions):
        self.opts = opts

    def read_data(self) -> None:
        self.train_sents = read_trees(Path(self.opts.data) / TRAIN_FILE, self.opts.limit)
        self.dev_sents = read_trees(Path(self.opts.data) / DEV_FILE, self.opts.limit)

    def create(self, model_dir: Path) -> None:
        labels = sorted({d for s in self.train_sents for d in s.deprels})
        self.config = DeprelConfig(**self.opts.sizes, labels=labels)
        self.featurizer = Featurizer.build([s.forms for s in self.train_sents])
        self.featurizer.save(model_dir / folder.FEATURES)
        self.config.save(model_dir / folder.CONFIG)  # last: a folder with config.json has both

    def load(self, model_dir: Path, log: list[dict]) -> None:
        try:
            self.featurizer, self.config = described(
                model_dir, folder.read_declared(model_dir, DEPREL_FILES, log))
        except FileFormatError as e:
            raise folder.resume_error(model_dir, str(e)) from None
        folder.settings_differ(model_dir, self.opts.sizes, asdict(self.config))

    def model(self, model_dir: Path, seed: int):
        self.labeller = Labeller(self.featurizer, self.config, seed=seed,
                                 device=self.opts.device)
        self.encoded = self.labeller.encode(self.train_sents)
        self.dev = self.labeller.encode(self.dev_sents)
        return self.labeller.train_model

    def sampler(self, seed: int, rank: int, size: int):
        self.batches = self.labeller.sampler(self.encoded, seed=seed, rank=rank, size=size)
        self.seen: list[set] = []  # the keys of epochs 0, 1, ...
        return self.batches

    def solver_fields(self, steps_per_epoch: int) -> dict:
        """Adam, its rate decayed by 0.9 every epoch (Caffe's lr_policy "step"), gradients
        clipped at 5."""
        return dict(type="Adam", base_lr=self.opts.lr or LR, momentum=0.9, momentum2=0.999,
                    delta=1e-8, lr_policy="step", gamma=0.9, stepsize=steps_per_epoch,
                    clip_gradients=5.0)

    def seed_epoch(self, rng: np.random.Generator) -> None:
        self.rng = rng  # word dropout

    def batch(self, batch) -> tuple[dict, int]:
        key = self.labeller.key(self.batches, batch)
        inputs, where = self.labeller.inputs([self.encoded[i] for i in batch], key)
        # unknown words are learned from rare ones, as the tagger does
        inputs["word"] = word_dropout(inputs["word"].astype(np.int64),
                                      self.featurizer.vocabs["word"], self.rng).astype(float)
        return {"widths": key, **inputs}, sum(len(w) for w in where)

    def evaluate(self, epoch: int) -> dict:
        predicted = self.labeller.predict(self.dev)
        return {"dev_accuracy": accuracy([s.deprels for s in self.dev_sents], predicted),
                "nets_built": self.new_keys(epoch),
                "padding_fraction": self.batches.padding_fraction(epoch)}

    def new_keys(self, epoch: int) -> int:
        """How many nets epoch ``epoch`` adds to those of the epochs before it: a function of
        the sampler alone, so that a resumed run logs what the uninterrupted one did."""
        while len(self.seen) <= epoch:
            self.seen.append({k for _, k in self.labeller.epoch_plan(self.batches,
                                                                     len(self.seen))})
        return len(self.seen[epoch].difference(*self.seen[:epoch]))


def train(opts: TrainOptions) -> dict:
    """Train (or resume) and return the log of the last epoch (see
    :meth:`unroll.train.trainer.Trainer.fit`)."""
    return opts.trainer(DeprelTraining(opts), average=None).fit()
