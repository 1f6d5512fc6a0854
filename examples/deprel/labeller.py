"""The DEPREL labeller: word features in, one relation per word out, given the gold tree.

Both models read the tagger's word features (:mod:`examples.pos_tagging.features`),
the word's UPOS and its head's direction and distance, encode every word, and
label it from its own encoding beside its head's (a gather by the gold head):

- ``baseline``: a sequence BiLSTM over the sentence (the ``lstm`` template, both
  directions), batches bucketed by length (:class:`~unroll.train.bucketing.BucketSampler`).
- ``tree``: a bidirectional child-sum Tree-LSTM over the gold tree
  (:mod:`unroll.frontend.tree_unroller`: leaves to root and root to leaves), batches
  bucketed by height and level widths (:class:`~unroll.train.tree_sampler.TreeBucketSampler`).

Each keeps one net per bucket over one parameter store
(:class:`~unroll.train.tree_model.TreeModel`, a model keyed by the bucket).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from examples.pos_tagging.features import FEATURES, Featurizer
from examples.pos_tagging.schemas import FEATURES_SCHEMA, MAX_VOCAB, MAX_WIDTH
from unroll.core.atomic import write_atomic
from unroll.core.errors import FileFormatError
from unroll.core.json_files import count, finite, ratio
from unroll.engine.backend import to_numpy
from unroll.frontend.template import load_template
from unroll.frontend.tree_unroller import tree_inputs
from unroll.frontend.unroller import expand
from unroll.tools.conllu import UPOS_TAGS
from unroll.train import model_folder as folder
from unroll.train.bucketing import BucketSampler, cont_from_lengths, time_major
from unroll.train.trainer import log_schema
from unroll.train.tree_model import TreeModel
from unroll.train.tree_sampler import TreeBucketSampler

__all__ = ["CONFIG_SCHEMA", "DEPREL_FILES", "LOG_SCHEMA", "MODELS", "DeprelConfig", "Labeller",
           "distance_id"]

MODELS = ("tree", "baseline")
TREE_TEMPLATE = "child_sum_tree_lstm"
#: the net of both models, a net template placing the tree layer or the BiLSTM
NET_TEMPLATE = str(Path(__file__).with_name("deprel.prototxt.j2"))
#: the head's side and distance, bucketed: root, then 1, 2, 3-4, 5-8, 9+ to the left and right
DISTANCES = 11
IGNORE = -1


def distance_id(word: int, head: int) -> int:
    """The bucket of the head's direction and distance (``word``, ``head`` 1-based, 0 root).

    >>> [distance_id(3, h) for h in (0, 2, 1, 4, 9)]
    [0, 1, 2, 6, 9]
    """
    if head == 0:
        return 0
    d = abs(head - word)
    bucket = 1 if d == 1 else 2 if d == 2 else 3 if d <= 4 else 4 if d <= 8 else 5
    return bucket if head < word else bucket + 5


@dataclass
class DeprelConfig:
    """Sizes and labels of a labeller; saved as config.json in the model folder."""

    model: str = "tree"
    labels: list = field(default_factory=list)
    word_embed: int = 64
    feature_embed: int = 8
    hidden: int = 100
    mlp: int = 100
    dropout: float = 0.25
    batch: int = 32
    group: int = 8

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, found {self.model!r}")

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self), indent=1).encode())

    @classmethod
    def from_checked(cls, data: dict, path: Path) -> DeprelConfig:
        """The config of ``data``, a schema-checked config.json read from ``path``."""
        try:
            return cls(**data)
        except ValueError as e:
            raise FileFormatError(path, str(e)) from None


#: a DeprelConfig (config.json): its labels are the output ids, in order
CONFIG_SCHEMA = {
    "type": "object", "description": "an object {...}", "additionalProperties": False,
    "required": ["model", "labels", "word_embed", "feature_embed", "hidden", "mlp", "dropout",
                 "batch", "group"],
    "properties": {
        "model": {"enum": list(MODELS), "description": f"one of {list(MODELS)}"},
        "labels": {"type": "array", "minItems": 1, "maxItems": MAX_VOCAB, "uniqueItems": True,
                   "description": "a list of distinct DEPREL strings",
                   "items": {"type": "string", "minLength": 1, "maxLength": 256,
                             "description": "a DEPREL"}},
        "word_embed": count(MAX_WIDTH), "feature_embed": count(MAX_WIDTH),
        "hidden": count(MAX_WIDTH), "mlp": count(MAX_WIDTH), "dropout": ratio(),
        "batch": count(MAX_WIDTH), "group": count(MAX_WIDTH),
    },
}

#: log.json: the labeller's epochs (the names and checksums are the folder's to check, the
#: loss and times the Trainer's)
LOG_SCHEMA = log_schema(
    {"dev_accuracy": finite(1), "nets_built": {"type": "integer", "minimum": 0,
                                               "maximum": 1 << 40, "description": "a count"},
     "padding_fraction": finite(1)},
    required=["dev_accuracy"], averaged=False,
)

#: the labeller's model folder: its log and its two JSON files, which log.json checksums
DEPREL_FILES = folder.ModelFiles(LOG_SCHEMA, {folder.CONFIG: CONFIG_SCHEMA,
                                              folder.FEATURES: FEATURES_SCHEMA})


class Labeller:
    """A DEPREL labeller: featurizer, config, and the train and test models over one store."""

    def __init__(self, featurizer: Featurizer, config: DeprelConfig, seed: int = 0,
                 device: str = "cpu"):
        self.featurizer, self.config = featurizer, config
        self.label_ids = {label: i for i, label in enumerate(config.labels)}
        self.template = load_template(TREE_TEMPLATE)
        canonical = ((1,), (1,)) if config.model == "tree" else (1, 1)
        self.train_model = TreeModel(self.net_param, canonical, seed=seed, device=device)
        self.test_model = TreeModel(lambda key: self.net_param(key, "test"), canonical,
                                    phase="test", device=device, store=self.train_model.store)

    # -- the nets -----------------------------------------------------------------------
    def net_param(self, key, phase: str = "train"):
        """The net of bucket ``key``: the tree model's (up widths, down widths), or the
        baseline's (T, N). One NetParameter serves both phases (Net filters by phase)."""
        c = self.config
        sizes = self.featurizer.sizes | {"upos": len(UPOS_TAGS), "distance": DISTANCES}
        features = [[name, sizes[name]] for name in (*FEATURES, "upos", "distance")]
        if c.model == "tree":
            size = dict(steps=1, batch=max(sum(w) for w in key),
                        widths=[list(w) for w in key])
        else:
            size = dict(steps=key[0], batch=key[1])
        return expand(NET_TEMPLATE, model=c.model, features=features,
                             labels=len(c.labels), word_embed=c.word_embed,
                             feature_embed=c.feature_embed, hidden=c.hidden, mlp=c.mlp,
                             dropout=c.dropout, ignore_label=IGNORE, **size)

    # -- data -------------------------------------------------------------------------------
    def encode(self, sentences) -> list[dict]:
        """Per sentence: the id arrays of its words, its heads and its label ids."""
        tags = {t: i for i, t in enumerate(UPOS_TAGS)}
        out = []
        for s in sentences:
            ids = self.featurizer.encode(s.forms)
            ids["upos"] = np.array([tags[u] for u in s.upos])
            ids["distance"] = np.array([distance_id(i, h) for i, h in enumerate(s.heads, 1)])
            ids["label"] = np.array([self.label_ids.get(d, IGNORE) for d in s.deprels])
            out.append({"ids": ids, "heads": np.asarray(s.heads), "tree": s.tree,
                        "n": len(s.forms)})
        return out

    def sampler(self, encoded, shuffle: bool = True, seed: int = 0, rank: int = 0,
                size: int = 1):
        """The batches of ``encoded``: this rank's share of each epoch (of ``size``)."""
        c = self.config
        if c.model == "tree":
            return TreeBucketSampler([e["tree"] for e in encoded], c.batch, "bidirectional",
                                     seed=seed, shuffle=shuffle, group=c.group, rank=rank,
                                     size=size)
        return BucketSampler([e["n"] for e in encoded], c.batch, seed=seed, shuffle=shuffle,
                             rank=rank, size=size)

    def key(self, sampler, batch) -> tuple:
        """The key of the net that runs ``batch`` of ``sampler``."""
        return batch.key if self.config.model == "tree" else (sampler.bucket_length(batch),
                                                              len(batch))

    def epoch_plan(self, sampler, epoch: int = 0) -> list[tuple[list, tuple]]:
        """(sentence indices, the key of its net) of every batch of ``epoch`` of ``sampler``."""
        return [(b, self.key(sampler, b)) for b in sampler.epoch_batches(epoch)]

    def inputs(self, group: list[dict], key) -> tuple[dict, list]:
        names = [*FEATURES, "upos", "distance"]
        if self.config.model == "tree":
            rows = max(sum(w) for w in key)
            out = {name: np.zeros(rows) for name in names}
            label, head_row = np.full(rows, IGNORE, float), np.arange(rows, dtype=float)
            where, start = [], 0
            for e in group:
                span = slice(start, start + e["n"])
                for name in names:
                    out[name][span] = e["ids"][name]
                label[span] = e["ids"]["label"]
                head_row[span] = np.where(e["heads"] > 0, e["heads"] - 1 + start,
                                          np.arange(start, start + e["n"]))
                where.append(np.arange(start, start + e["n"]))
                start += e["n"]
            out.update(tree_inputs([e["tree"] for e in group], self.template, key,
                                   "bidirectional", rows))
            return {**out, "label": label, "head_row": head_row}, where
        steps, n = key
        out = {name: time_major([e["ids"][name] for e in group], length=steps)[0].astype(float)
               for name in names}
        out["cont"] = cont_from_lengths([e["n"] for e in group], steps)
        label = np.full((steps, n), IGNORE, float)
        head_row = np.arange(steps * n, dtype=float).reshape(steps, n)
        where = []
        for col, e in enumerate(group):
            t = np.arange(e["n"])
            label[t, col] = e["ids"]["label"]
            head_row[t, col] = np.where(e["heads"] > 0, (e["heads"] - 1) * n + col, t * n + col)
            where.append(t * n + col)
        return {**out, "label": label.reshape(-1), "head_row": head_row.reshape(-1)}, where

    # -- prediction -------------------------------------------------------------------------
    def predict(self, encoded) -> list[list[str]]:
        """The DEPREL of every word of every encoded sentence."""
        sampler = self.sampler(encoded, shuffle=False)
        found: dict[int, list] = {}
        for batch, key in self.epoch_plan(sampler):
            inputs, where = self.inputs([encoded[i] for i in batch], key)
            # weights that grew huge (a diverging run's last epoch) overflow to inf: the
            # accuracy says so, where NumPy's warnings would break the one-line output
            with np.errstate(over="ignore", invalid="ignore"):
                scores = self.test_model.forward(widths=key, blobs=["scores"],
                                                 **inputs)["scores"]
            best = to_numpy(scores).argmax(axis=1)
            for i, rows in zip(batch, where):
                found[i] = [self.config.labels[k] for k in best[rows]]
        return [found[i] for i in range(len(encoded))]

    @classmethod
    def load(cls, model_dir: Path, name: str = "best", device: str = "cpu") -> Labeller:
        """The labeller of a model folder: its JSON bounded and schema-checked, it and the
        weights checked against the SHA-256 that log.json records."""
        model_dir = Path(model_dir)
        return folder.load_trained(model_dir, DEPREL_FILES,
                                   lambda files: cls(*described(model_dir, files), device=device),
                                   what="labeller", module="examples.deprel", checkpoint=name)


def described(model_dir: Path, files: dict) -> tuple[Featurizer, DeprelConfig]:
    """(featurizer, config) from the values of a model folder's JSON files ({name: value})."""
    return (Featurizer.from_checked(files[folder.FEATURES], model_dir / folder.FEATURES),
            DeprelConfig.from_checked(files[folder.CONFIG], model_dir / folder.CONFIG))
