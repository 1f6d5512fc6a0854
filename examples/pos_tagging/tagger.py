"""The tagger: the `tagger` net template over bucketed unrolled nets, and batching.

One :class:`unroll.train.bucketed_model.BucketedModel` trains (dropout, loss), a second one
with phase "test" shares its parameter store and predicts from its ``scores``
output, so evaluation always sees the current weights without a copy. Both
build their nets from the same NetParameter per T.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

import unroll
from examples.pos_tagging.features import Featurizer, encode_tags, word_dropout
from examples.pos_tagging.schemas import CONFIG_SCHEMA, TAGGER_FILES
from unroll.core import json_files
from unroll.core.atomic import write_atomic
from unroll.core.errors import FileFormatError
from unroll.frontend.unroller import builtin_template_dir
from unroll.tools.conllu import UPOS_TAGS
from unroll.train import model_folder
from unroll.train.bucketed_model import BucketedModel
from unroll.train.bucketing import time_major
from unroll.train.model_folder import CONFIG, FEATURES

IGNORE = -1
TAGGER_TEMPLATE = builtin_template_dir() / "tagger.prototxt.j2"
WORD_INPUT = "words"  # the tagger template's name for the word-id input

#: extra token features and their embedding sizes (the word embedding is ``embed``)
DEFAULT_FEATURE_DIMS = {
    "prefix1": 8, "prefix2": 16, "suffix1": 8, "suffix2": 16, "suffix3": 32, "shape": 16,
    "caps": 4,
}
DEFAULT_CHARS = {"embed": 32, "hidden": 64, "length": 16}


@dataclass
class TaggerConfig:
    """Sizes of the tagger; saved beside its weights as config.json.

    ``cell`` is a built-in step template (lstm, gru, rnn, lstm_primitive) or,
    in a model folder, the name of a template file inside that folder.

    >>> TaggerConfig(hidden=0)
    Traceback (most recent call last):
    ValueError: tagger config: hidden must be an integer >= 1, found 0
    """

    embed: int = 100
    hidden: int = 256
    layers: int = 2
    cell: str = "lstm"
    dropout: float = 0.5
    word_dropout: float = 0.25
    batch: int = 32
    feature_dims: dict = field(default_factory=lambda: dict(DEFAULT_FEATURE_DIMS))
    #: the character model: embedding and LSTM sizes, characters read per word ({}: none)
    chars: dict = field(default_factory=lambda: dict(DEFAULT_CHARS))

    def __post_init__(self):
        wrong = json_files.problem(asdict(self), CONFIG_SCHEMA)
        if wrong is not None:
            raise ValueError(f"tagger config: {wrong}")

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self), indent=2).encode("utf-8"))

    @classmethod
    def load(cls, path: Path) -> TaggerConfig:
        """The config in ``path``; a bad file is a FileFormatError naming it."""
        return cls.from_checked(json_files.read_checked(path, CONFIG_SCHEMA), path)

    @classmethod
    def from_checked(cls, data: dict, path: Path) -> TaggerConfig:
        """The config of ``data``, a schema-checked config.json read from ``path``."""
        try:
            return cls(**data)
        except ValueError as e:
            raise FileFormatError(path, str(e).removeprefix("tagger config: ")) from None


def builtin_cells() -> list[str]:
    """The names of the built-in step templates (lstm, gru, ...)."""
    suffix = ".prototxt.j2"
    return sorted(p.name[: -len(suffix)] for p in builtin_template_dir().glob(f"*{suffix}")
                  if p.name != TAGGER_TEMPLATE.name)


def cell_template(cell: str, folder: Path | None) -> Path:
    """The template file of ``cell``: a built-in, or (with ``folder``) a file inside it.

    Without ``folder`` (a fresh training run) ``cell`` may also be any path.
    A model folder names only built-ins or its own files, so that loading a
    model never reads a template from elsewhere.
    """
    if cell in builtin_cells():
        return builtin_template_dir() / f"{cell}.prototxt.j2"
    if folder is None:
        path = Path(cell)
        if not path.is_file():
            raise ValueError(f"cell {cell!r} is neither a built-in step template "
                             f"({', '.join(builtin_cells())}) nor a template file")
        return path
    path = (folder / cell).resolve()
    if not (Path(cell).name == cell and path.parent == folder.resolve() and path.is_file()):
        raise FileFormatError(
            folder / "config.json",
            f"cell {cell!r} is neither a built-in step template ({', '.join(builtin_cells())}) "
            f"nor a template file in the model folder",
        )
    return path


def pack_columns(lengths: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Items of ``lengths`` (each 1 .. ``size``) packed into columns of ``size``; best fit.

    Longest first, each item goes to the fullest column it fits (a new one if
    none), which on word lengths leaves next to no room unused. Returns each
    item's column and its first slot there.

    >>> pack_columns(np.array([3, 1, 2, 2]), 4)
    (array([0, 0, 1, 1]), array([0, 3, 0, 2]))
    """
    columns: list[int] = []  # slots used, per column
    free: list[list[int]] = [[] for _ in range(size + 1)]  # free[r]: the columns with r left
    rooms = 0  # bit r set: free[r] is not empty (the least room that fits is one bit scan)
    order = np.argsort(-lengths, kind="stable").tolist()
    column, start = [0] * len(order), [0] * len(order)
    for k, length in zip(order, lengths[order].tolist()):
        fits = rooms >> length
        if fits:
            room = length + (fits & -fits).bit_length() - 1
            c = free[room].pop()
            if not free[room]:
                rooms &= ~(1 << room)
        else:
            c = len(columns)
            columns.append(0)
        column[k], start[k] = c, columns[c]
        columns[c] += length
        room = size - columns[c]
        free[room].append(c)
        rooms |= 1 << room
    return np.array(column, np.int64), np.array(start, np.int64)


class Tagger:
    """A BiLSTM (or any step template) UPOS tagger built from the `tagger` template.

    >>> f = Featurizer.build([["The", "cat", "sat", "."]])
    >>> tagger = Tagger(f, TaggerConfig(embed=8, hidden=8, batch=2))
    >>> tagger.predict([["The", "dog", "."]])[0].shape
    (3,)
    """

    def __init__(self, featurizer: Featurizer, config: TaggerConfig, device: str = "cpu",
                 seed: int = 0, folder: Path | None = None, memory_budget: int | None = None):
        self.featurizer = featurizer
        self.config = config
        unknown = [n for n in config.feature_dims if n not in featurizer.vocabs or n == "word"]
        if unknown:
            raise ValueError(f"feature_dims names unknown features {unknown}")
        sizes = featurizer.sizes
        self._variables = dict(
            batch=config.batch, vocab=sizes["word"], tags=len(UPOS_TAGS), embed=config.embed,
            hidden=config.hidden, layers=config.layers,
            cell=str(cell_template(config.cell, folder)), dropout=config.dropout,
            features={name: [sizes[name], dim] for name, dim in config.feature_dims.items()},
            chars=dict(config.chars, vocab=sizes["chars"]) if config.chars else {},
            ignore_label=IGNORE,
        )
        # one NetParameter per T serves both phases: Net filters the TRAIN-only layers
        self.train_model = BucketedModel(self.net_param, phase="train", device=device,
                                         seed=seed, memory_budget=memory_budget)
        self.test_model = BucketedModel(self.net_param, phase="test", device=device,
                                        seed=seed, store=self.train_model.store,
                                        net_params=self.train_model.net_params)
        self.rng = np.random.default_rng(seed)
        # (T, N) -> character columns its batches are padded to: it only grows, so each
        # net reshapes a few times, not at every batch (a reshape costs more than it saves)
        self._char_columns: dict[tuple, int] = {}

    def net_param(self, steps: int):
        """The tagger net unrolled to ``steps`` words (the two models share what they
        expand: each T is expanded once)."""
        # the packed character columns vary per batch: the net reshapes, and the character
        # LSTM's states follow chars_cont (BucketedModel ties each state to its cont)
        return unroll.expand(TAGGER_TEMPLATE, steps=steps, char_columns=self.config.batch,
                             **self._variables)

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
        """Time-major (T, N) inputs of one batch, padded to ``length``, on the nets' device.

        Every input (word, feature and character ids, conts, labels) is packed
        into ONE host buffer of the nets' dtype (ids and labels are whole numbers,
        exact in it), checked there by the layers that read it (Embed ids, labels:
        the training nets with ``tags``, else the test nets) and sent to the device
        in ONE transfer; the nets take views of it without a copy.
        """
        return self.send(self.host_inputs(encoded, length, tags, train), length,
                         labelled=tags is not None)

    def send(self, host: dict, length: int, labelled: bool) -> dict:
        """:meth:`host_inputs` (changed or not: packed rows have their own ``cont``) packed
        into one buffer, checked on the host by the nets of T = ``length`` (training's if
        ``labelled``, else testing's), and sent to their device in one transfer."""
        model = self.train_model if labelled else self.test_model
        return model.net(length).device_inputs(**host)

    def host_inputs(self, encoded: list[dict], length: int, tags=None,
                    train: bool = False) -> dict:
        """Time-major (T, N) input arrays for one batch, padded to ``length``, on the host."""
        words = [e["word"] for e in encoded]
        if train and self.config.word_dropout > 0:
            vocab = self.featurizer.vocabs["word"]
            words = [word_dropout(i, vocab, self.rng, self.config.word_dropout) for i in words]
        out = dict(zip((WORD_INPUT, "cont"), time_major(words, length)))
        for name in self.config.feature_dims:
            out[name], _ = time_major([e[name] for e in encoded], length)
        if self.config.chars:
            out.update(self._char_inputs([e["chars"] for e in encoded], length))
        if tags is not None:
            out["labels"], _ = time_major(tags, length, pad_value=IGNORE)
        else:
            out["labels"] = np.full(out["cont"].shape, IGNORE)
        return out

    def _char_inputs(self, spelled, length: int) -> dict:
        """The real words' characters packed into (C, columns) arrays (see the template).

        ``chars_at`` is the grid cell t * N + n (word t of sentence n) at each
        word's last character, -1 at every other slot: padding cells get no
        characters, and no column is longer than C, so the character nets run
        about sum(word lengths) / C columns instead of T * N. Trailing columns
        are empty up to the most this (T, N) needed before, rounded up to 16.
        """
        C, N = self.config.chars["length"], len(spelled)
        fw, bw, cont = (np.concatenate([parts[k] for parts in spelled]) for k in range(3))
        cells = np.concatenate([np.arange(len(parts[0])) * N + n
                                for n, parts in enumerate(spelled)])
        # right-aligned words start at cont 0; an empty word reads one character 0 from zeros
        lengths = cont.sum(axis=1).astype(np.int64) + 1
        column, start = pack_columns(lengths, C)
        used = int(column.max()) + 1 if len(column) else 0
        width = self._char_columns.get((length, N), 0)
        if used > width:
            width = self._char_columns[length, N] = -(-used // 16) * 16
        word = np.repeat(np.arange(len(lengths)), lengths)
        j = np.arange(len(word)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        slot = (start[word] + j, column[word])
        source = (word, C - lengths[word] + j)
        out = {}
        for name, chars in (("chars_fw", fw), ("chars_bw", bw), ("chars_cont", cont)):
            out[name] = np.zeros((C, width), chars.dtype)
            out[name][slot] = chars[source]
        out["chars_at"] = np.full((C, width), -1, np.int64)
        out["chars_at"][start + lengths - 1, column] = cells
        return out

    def predict_encoded(self, encoded: list[dict], batch_size: int | None = None) -> list:
        """Tag ids per sentence, run in length-sorted batches through the test-phase nets."""
        batch_size = batch_size or self.config.batch
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]["word"]))
        result = [None] * len(encoded)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            length = self._padded_length(max(1, max(len(encoded[i]["word"]) for i in idx)))
            outputs = self.test_model.forward(**self.inputs([encoded[i] for i in idx], length))
            scores = unroll.engine.backend.to_numpy(outputs["scores"])
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
        """Weights (``<name>.caffemodel``), features.json and config.json in ``model_dir``.

        Each file is written atomically; training writes the two JSON files once
        and then only weights (see :mod:`unroll.train.model_folder`).
        """
        model_dir.mkdir(parents=True, exist_ok=True)
        self.save_description(model_dir)
        path = model_dir / f"{name}.caffemodel"
        self.train_model.save(path)
        return path

    def save_description(self, model_dir: Path) -> None:
        """features.json and config.json: what a folder needs besides weights to load."""
        self.featurizer.save(model_dir / FEATURES)
        self.config.save(model_dir / CONFIG)

    @classmethod
    def load(cls, model_dir: Path, name: str = "model", device: str = "cpu") -> Tagger:
        """A tagger saved by :meth:`save` (or a checkpoint of the training command).

        Loading reads JSON and weights only: the step template must be a
        built-in or a file inside ``model_dir``, and no Python layer is allowed.
        """
        model_dir = Path(model_dir)

        def build(files):
            return cls(*described(model_dir, files), device=device, folder=model_dir)

        if os.path.lexists(model_folder.inside(model_dir, model_folder.LOG)):
            # a trainer's folder vouches for its files and its checkpoints in log.json
            if name not in model_folder.CHECKPOINTS:
                raise FileFormatError(model_dir / model_folder.LOG,
                                      f"records no checksum for {name}.caffemodel")
            return model_folder.load_trained(model_dir, TAGGER_FILES, build, what="tagger",
                                             module="examples.pos_tagging", checkpoint=name)
        if not model_dir.is_dir():
            raise FileNotFoundError(f"--model-dir {model_dir}: no such folder")
        for needed in (FEATURES, CONFIG):
            if not os.path.lexists(model_dir / needed):
                raise FileNotFoundError(f"{model_dir / needed} is missing: is {model_dir} a "
                                        f"model folder written by `train`?")
        weights = model_folder.inside(model_dir, f"{name}.caffemodel")
        if not os.path.lexists(weights):
            raise FileNotFoundError(f"{weights} is missing: {model_dir} holds no trained "
                                    f"'{name}' weights (did training end its first epoch?)")
        tagger = build(model_folder.read_declared(model_dir, TAGGER_FILES, []))
        tagger.train_model.copy_from(weights, strict=True)
        return tagger


def described(model_dir: Path, files: dict) -> tuple[Featurizer, TaggerConfig]:
    """(featurizer, config) from the values of a model folder's JSON files ({name: value})."""
    return (Featurizer.from_checked(files[FEATURES], model_dir / FEATURES),
            TaggerConfig.from_checked(files[CONFIG], model_dir / CONFIG))


def tag_ids(upos_lists) -> list[np.ndarray]:
    """Label ids of gold UPOS tag lists."""
    return [encode_tags(tags) for tags in upos_lists]
