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
from unroll.core import json_files
from unroll.core.atomic import write_atomic
from unroll.core.errors import FileFormatError
from unroll.core.json_files import count, finite, ratio
from unroll.core.proto import LayerParameter
from unroll.frontend.tree_unroller import tree_block, tree_inputs
from unroll.frontend.unroller import NetBuilder, load_template
from unroll.tools.conllu import UPOS_TAGS
from unroll.train import model_folder as folder
from unroll.train.bucketing import BucketSampler, cont_from_lengths, time_major
from unroll.train.tree_model import TreeModel
from unroll.train.tree_sampler import TreeBucketSampler

__all__ = ["CONFIG_SCHEMA", "DEPREL_FILES", "LOG_SCHEMA", "MODELS", "DeprelConfig", "Labeller",
           "distance_id"]

MODELS = ("tree", "baseline")
TREE_TEMPLATE = "child_sum_tree_lstm"
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
    def load(cls, path: Path) -> DeprelConfig:
        """The config in ``path``, bounded and schema-checked; a FileFormatError naming it."""
        return cls(**json_files.read_checked(path, CONFIG_SCHEMA))


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

#: log.json: the labeller's epochs (the names and checksums are the folder's to check)
LOG_SCHEMA = folder.epoch_log_schema(
    {"train_loss": finite(), "dev_accuracy": finite(1), "seconds": finite(),
     "words_per_s": finite(), "nets_built": {"type": "integer", "minimum": 0,
                                             "maximum": 1 << 40, "description": "a count"},
     "padding_fraction": finite(1)},
    required=["train_loss", "dev_accuracy", "seconds"],
)

#: the labeller's model folder: its log and its two JSON files, which log.json checksums
DEPREL_FILES = folder.ModelFiles(LOG_SCHEMA, {folder.CONFIG: CONFIG_SCHEMA,
                                              folder.FEATURES: FEATURES_SCHEMA})


class Labeller:
    """A DEPREL labeller: featurizer, config, and the train and test models over one store."""

    def __init__(self, featurizer: Featurizer, config: DeprelConfig, seed: int = 0):
        self.featurizer, self.config = featurizer, config
        self.label_ids = {label: i for i, label in enumerate(config.labels)}
        self.template = load_template(TREE_TEMPLATE)
        canonical = ((1,), (1,)) if config.model == "tree" else (1, 1)
        self.train_model = TreeModel(self.net_param, canonical, seed=seed)
        self.test_model = TreeModel(lambda key: self.net_param(key, "test"), canonical,
                                    phase="test", store=self.train_model.store)

    # -- the nets -----------------------------------------------------------------------
    def net_param(self, key, phase: str = "train"):
        c = self.config
        if c.model == "tree":
            rows = max(sum(w) for w in key)
            b = NetBuilder(1, rows)
            shape, axis = (rows,), 1
        else:
            steps, n = key
            b = NetBuilder(steps, n)
            shape, axis = (steps, n), 2
            rows = steps * n
        ids = [*FEATURES, "upos", "distance"]
        b.input("data", {**{name: shape for name in ids}, "head_row": (rows,),
                         "label": (rows,), **({} if c.model == "tree" else {"cont": shape})})
        sizes = self.featurizer.sizes | {"upos": len(UPOS_TAGS), "distance": DISTANCES}
        embedded = []
        for name in ids:
            lp = LayerParameter(name=f"emb_{name}", type="Embed", bottom=[name],
                                top=[f"emb_{name}"])
            lp.param.add(name=f"emb_{name}")
            lp.embed_param.num_output = c.word_embed if name == "word" else c.feature_embed
            lp.embed_param.input_dim = sizes[name]
            lp.embed_param.bias_term = False
            lp.embed_param.weight_filler.type = "uniform"
            lp.embed_param.weight_filler.min, lp.embed_param.weight_filler.max = -0.1, 0.1
            b.add_layer(lp, lp.name)
            embedded.append(lp.top[0])
        b.concat("features", embedded, "x_full", axis=axis)
        drop = LayerParameter(name="x_drop", type="Dropout", bottom=["x_full"], top=["x"])
        drop.dropout_param.dropout_ratio = c.dropout
        b.add_layer(drop, "x_drop")
        if c.model == "tree":
            tree_block(b, TREE_TEMPLATE, "x", "enc", key, rows, "bidirectional",
                       hidden=c.hidden)
            enc = "enc"
        else:
            b.recurrent("lstm", "x", "enc", "cont", direction="bidirectional", hidden=c.hidden)
            flat = LayerParameter(name="enc_rows", type="Reshape", bottom=["enc"],
                                  top=["enc_rows"])
            flat.reshape_param.shape.dim.extend([-1, 2 * c.hidden])
            b.add_layer(flat, "enc_rows")
            enc = "enc_rows"
        b.add_layer(LayerParameter(name="enc_head", type="BatchReindex", bottom=[enc, "head_row"],
                                   top=["enc_head"]), "enc_head")
        b.concat("pair", [enc, "enc_head"], "pair", axis=1)
        for name, bottom, size in (("mlp", "pair", c.mlp), ("scores", "mlp_act",
                                                             len(c.labels))):
            lp = LayerParameter(name=name, type="InnerProduct", bottom=[bottom], top=[name])
            lp.param.add(name=f"{name}_W")
            lp.param.add(name=f"{name}_b")
            lp.inner_product_param.num_output = size
            lp.inner_product_param.weight_filler.type = "xavier"
            b.add_layer(lp, name)
            if name == "mlp":
                b.add_layer(LayerParameter(name="mlp_act", type="TanH", bottom=["mlp"],
                                           top=["mlp_act"]), "mlp_act")
        loss = LayerParameter(name="loss", type="SoftmaxWithLoss", bottom=["scores", "label"],
                              top=["loss"])
        loss.loss_param.ignore_label = IGNORE
        b.add_layer(loss, "loss")
        return b.net_param(f"deprel_{c.model}")

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

    def sampler(self, encoded, shuffle: bool = True, seed: int = 0):
        c = self.config
        if c.model == "tree":
            return TreeBucketSampler([e["tree"] for e in encoded], c.batch, "bidirectional",
                                     seed=seed, shuffle=shuffle, group=c.group)
        return BucketSampler([e["n"] for e in encoded], c.batch, seed=seed, shuffle=shuffle)

    def batches(self, encoded, sampler, epoch: int = 0):
        """(key, inputs, rows of each sentence) of every batch of ``epoch``."""
        batches = sampler.epoch_batches(epoch)
        keys = (sampler.epoch_keys(epoch) if self.config.model == "tree" else
                [(sampler.bucket_length(b), len(b)) for b in batches])
        for batch, key in zip(batches, keys):
            yield (key, *self.inputs([encoded[i] for i in batch], key))

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
        order = sampler.epoch_batches(0)
        for (key, inputs, where), batch in zip(self.batches(encoded, sampler), order):
            scores = self.test_model.forward(widths=key, blobs=["scores"], **inputs)["scores"]
            best = np.asarray(scores).argmax(axis=1)
            for i, rows in zip(batch, where):
                found[i] = [self.config.labels[k] for k in best[rows]]
        return [found[i] for i in range(len(encoded))]

    @classmethod
    def load(cls, model_dir: Path, name: str = "best") -> Labeller:
        """The labeller of a model folder: its JSON bounded and schema-checked, it and the
        weights checked against the SHA-256 that log.json records."""
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise FileNotFoundError(f"--model-dir {model_dir}: no such folder")
        log = folder.read_log(model_dir, DEPREL_FILES)
        if not log:
            raise folder.ModelFolderError(
                f"{model_dir} holds no trained labeller ({folder.LOG} names no finished "
                f"epoch); train one with `python -m examples.deprel train --model-dir "
                f"{model_dir}`")
        features, config = (folder.read_json(model_dir, DEPREL_FILES, file, log)
                            for file in (folder.FEATURES, folder.CONFIG))
        try:
            config = DeprelConfig(**config)
        except ValueError as e:
            raise FileFormatError(model_dir / folder.CONFIG, str(e)) from None
        labeller = cls(Featurizer.from_checked(features, model_dir / folder.FEATURES), config)
        folder.load_checkpoint(labeller.train_model, model_dir, log, name)
        return labeller
