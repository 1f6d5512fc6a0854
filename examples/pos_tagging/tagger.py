"""The tagger: the `tagger` net template over bucketed unrolled nets, and batching.

One :class:`unroll.bucketed_model.BucketedModel` trains (dropout on), a second one
with phase "test" shares its parameter store and predicts, so evaluation
always sees the current weights without a copy.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

import unroll
from examples.pos_tagging.conll import UPOS_TAGS
from examples.pos_tagging.features import Featurizer, encode_tags, word_dropout
from unroll.bucketed_model import BucketedModel
from unroll.bucketing import time_major

IGNORE = -1
WORD_INPUT = "words"  # the tagger template's name for the word-id input

#: extra token features and their embedding sizes (the word embedding is ``embed``)
DEFAULT_FEATURE_DIMS = {
    "prefix1": 8, "prefix2": 16, "suffix1": 8, "suffix2": 16, "suffix3": 32, "shape": 16,
    "caps": 4,
}
DEFAULT_CHARS = {"embed": 24, "hidden": 32, "length": 12}


@dataclass
class TaggerConfig:
    """Sizes of the tagger; saved beside its weights as config.json."""

    embed: int = 100
    hidden: int = 128
    layers: int = 2
    cell: str = "lstm"
    dropout: float = 0.25
    word_dropout: float = 0.25
    batch: int = 32
    feature_dims: dict = field(default_factory=lambda: dict(DEFAULT_FEATURE_DIMS))
    #: the character model: embedding and LSTM sizes, characters read per word ({}: none)
    chars: dict = field(default_factory=lambda: dict(DEFAULT_CHARS))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> TaggerConfig:
        return cls(**json.loads(path.read_text()))


class Tagger:
    """A BiLSTM (or any step template) UPOS tagger built from the `tagger` template.

    >>> f = Featurizer.build([["The", "cat", "sat", "."]])
    >>> tagger = Tagger(f, TaggerConfig(embed=8, hidden=8, batch=2))
    >>> tagger.predict([["The", "dog", "."]])[0].shape
    (3,)
    """

    def __init__(self, featurizer: Featurizer, config: TaggerConfig, device: str = "cpu",
                 seed: int = 0):
        self.featurizer = featurizer
        self.config = config
        unknown = [n for n in config.feature_dims if n not in featurizer.vocabs or n == "word"]
        if unknown:
            raise ValueError(f"feature_dims names unknown features {unknown}")
        sizes = featurizer.sizes
        features = {name: [sizes[name], dim] for name, dim in config.feature_dims.items()}
        chars = dict(config.chars, vocab=sizes["chars"]) if config.chars else {}

        def make(phase_dropout):
            def net_param(steps):
                return unroll.expand(
                    "tagger", steps=steps, batch=config.batch, vocab=sizes["word"],
                    tags=len(UPOS_TAGS), embed=config.embed, hidden=config.hidden,
                    layers=config.layers, cell=config.cell, dropout=phase_dropout,
                    features=features, chars=chars, ignore_label=IGNORE,
                )
            return net_param

        self.train_model = BucketedModel(make(config.dropout), phase="train", device=device,
                                         seed=seed, steps_from=WORD_INPUT)
        self.test_model = BucketedModel(make(config.dropout), phase="test", device=device,
                                        seed=seed, store=self.train_model.store,
                                        steps_from=WORD_INPUT)
        self.rng = np.random.default_rng(seed)

    def encode(self, sentences) -> list[dict]:
        """Feature ids per sentence (lists of forms -> dicts of id arrays)."""
        encoded = [self.featurizer.encode(forms) for forms in sentences]
        if self.config.chars:
            for forms, e in zip(sentences, encoded):
                e["chars"] = self._spell(forms)
        return encoded

    def _spell(self, forms) -> tuple:
        """(ids, reversed ids, cont), each (len(forms), C): characters right-aligned in C."""
        C = self.config.chars["length"]
        head = C // 3
        fw = np.zeros((len(forms), C), np.int64)
        bw = np.zeros((len(forms), C), np.int64)
        cont = np.zeros((len(forms), C), np.float32)
        for i, word in enumerate(forms):
            ids = self.featurizer.char_ids(word)
            if len(ids) > C:  # keep the start and the (more telling) end of long words
                ids = ids[:head] + ids[len(ids) - (C - head):]
            n = len(ids)
            fw[i, C - n:] = ids
            bw[i, C - n:] = ids[::-1]
            cont[i, C - n + 1:] = 1
        return fw, bw, cont

    def inputs(self, encoded: list[dict], length: int, tags=None, train: bool = False) -> dict:
        """Time-major (T, N) input arrays for one batch, padded to ``length``."""
        out = {}
        for name in ("word", *self.config.feature_dims):
            ids = [e[name] for e in encoded]
            if train and name == "word" and self.config.word_dropout > 0:
                vocab = self.featurizer.vocabs["word"]
                ids = [word_dropout(i, vocab, self.rng, self.config.word_dropout) for i in ids]
            values, cont = time_major(ids, length)
            out[WORD_INPUT if name == "word" else name] = values
        out["cont"] = cont
        if self.config.chars:
            out.update(self._char_inputs([e["chars"] for e in encoded], length))
        if tags is not None:
            out["labels"], _ = time_major(tags, length, pad_value=IGNORE)
        else:
            out["labels"] = np.full(out["cont"].shape, IGNORE)
        return out

    def _char_inputs(self, spelled, length: int) -> dict:
        """(C, T * N) character inputs, position t * N + n for word t of sentence n."""
        C, N = self.config.chars["length"], len(spelled)
        grids = [np.zeros((length, N, C), dtype) for dtype in (np.int64, np.int64, np.float32)]
        for n, parts in enumerate(spelled):
            for grid, part in zip(grids, parts):
                grid[: len(part), n] = part
        fw, bw, cont = (g.reshape(length * N, C).T for g in grids)
        return {"chars_fw": fw, "chars_fw_cont": cont, "chars_bw": bw, "chars_bw_cont": cont}

    def predict_encoded(self, encoded: list[dict], batch_size: int | None = None) -> list:
        """Tag ids per sentence, run in length-sorted batches through the test-phase nets."""
        batch_size = batch_size or self.config.batch
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]["word"]))
        result = [None] * len(encoded)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            length = self._padded_length(max(1, max(len(encoded[i]["word"]) for i in idx)))
            outputs = self.test_model.forward(**self.inputs([encoded[i] for i in idx], length))
            del outputs
            scores = unroll.backend.to_numpy(self.test_model.active.blobs["scores"].data)
            best = scores.argmax(axis=2)
            for column, i in enumerate(idx):
                result[i] = best[: len(encoded[i]["word"]), column]
        return result

    def _padded_length(self, length: int) -> int:
        """``length``, or a slightly longer one that already has a net (fewer nets to build)."""
        built = [T for T in self.test_model.nets if length <= T <= 1.25 * length + 2]
        return min(built, default=length)

    def predict(self, sentences, batch_size: int | None = None) -> list:
        """Tag ids for sentences given as lists of word forms."""
        return self.predict_encoded(self.encode(sentences), batch_size)

    # -- files ------------------------------------------------------------------
    def save(self, model_dir: Path, name: str = "model") -> Path:
        """Weights (``<name>.caffemodel``), features.json and config.json in ``model_dir``."""
        model_dir.mkdir(parents=True, exist_ok=True)
        self.featurizer.save(model_dir / "features.json")
        self.config.save(model_dir / "config.json")
        path = model_dir / f"{name}.caffemodel"
        self.train_model.save(path)
        return path

    @classmethod
    def load(cls, model_dir: Path, name: str = "model", device: str = "cpu") -> Tagger:
        """A tagger saved by :meth:`save` (or a checkpoint of the training command)."""
        model_dir = Path(model_dir)
        for needed in ("features.json", "config.json", f"{name}.caffemodel"):
            if not (model_dir / needed).is_file():
                raise FileNotFoundError(f"{model_dir / needed} is missing: is {model_dir} a "
                                        f"model folder written by `train`?")
        tagger = cls(Featurizer.load(model_dir / "features.json"),
                     TaggerConfig.load(model_dir / "config.json"), device=device)
        tagger.train_model.copy_from(model_dir / f"{name}.caffemodel", strict=True)
        return tagger


def tag_ids(upos_lists) -> list[np.ndarray]:
    """Label ids of gold UPOS tag lists."""
    return [encode_tags(tags) for tags in upos_lists]
