"""Token features for the tagger: vocabularies and a handful of integer id features per word.

Each token gets one id per feature, each feature with its own :class:`Vocab`
built from training counts (values for "McDonald's"):

- ``word``: lower-cased, digits -> 0 ("mcdonald's"; "1,200" -> "0,000")
- ``prefix1``, ``prefix2``: the first 1 and 2 characters of ``word``
- ``suffix1``, ``suffix2``, ``suffix3``: its last 1, 2 and 3 characters ("'s")
- ``shape``: character classes with runs collapsed ("XxXx'x"; "1,200" -> "d,d")
- ``caps``: lower / title / upper / mixed / none ("mixed")

Words keep every training value (``min_count=1``) and are trained for unknowns
by :func:`word_dropout`; the other features keep values seen at least twice, so
their ``<unk>`` is trained on the rare ones. :meth:`Featurizer.char_ids` maps a
word's characters (case kept) for an optional character model.

>>> f = Featurizer.build([["The", "cat", "sat", "."], ["The", "dog", "sat", "."]])
>>> ids = f.encode(["The", "cow", "sat"])
>>> sorted(ids) == sorted(FEATURES), ids["word"].tolist()
(True, [4, 1, 3])
>>> f.vocabs["word"].decode(ids["word"])
['the', '<unk>', 'sat']
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from unroll.core import json_files
from unroll.core.atomic import write_atomic
from unroll.core.errors import FileFormatError
from unroll.tools.conllu import UPOS_TAGS

__all__ = [
    "FEATURES",
    "PAD",
    "PAD_ID",
    "TAG_IDS",
    "UNK",
    "UNK_ID",
    "Featurizer",
    "Vocab",
    "caps_class",
    "decode_tags",
    "encode_tags",
    "normalize",
    "token_features",
    "word_dropout",
    "word_shape",
]

PAD, UNK = "<pad>", "<unk>"
PAD_ID, UNK_ID = 0, 1

FEATURES = ("word", "prefix1", "prefix2", "suffix1", "suffix2", "suffix3", "shape", "caps")
DEFAULT_MIN_COUNT = {name: 2 for name in FEATURES} | {"word": 1}

#: UPOS tag -> label id (0..16, the order of :data:`conll.UPOS_TAGS`)
TAG_IDS = {tag: i for i, tag in enumerate(UPOS_TAGS)}


class Vocab:
    """A string <-> id mapping with ``<pad>`` = 0 and ``<unk>`` = 1, and training counts.

    Unknown strings look up as ``<unk>``. ``counts[i]`` is the training count of
    id ``i`` (0 for the two specials).

    >>> v = Vocab.build(["a", "b", "a", "c"], min_count=2)
    >>> len(v), v["a"], v["zzz"], v.encode(["a", "c"]).tolist()
    (3, 2, 1, [2, 1])
    >>> Vocab.from_json(v.to_json()) == v
    True
    """

    def __init__(self, tokens: Iterable[str] = (), counts: Iterable[int] | None = None):
        tokens = list(tokens)
        self.itos = [PAD, UNK, *tokens]
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            dup = next(t for t, n in Counter(self.itos).items() if n > 1)
            raise ValueError(f"vocabulary lists {dup!r} twice (or a reserved {PAD}/{UNK})")
        counts = [0] * len(tokens) if counts is None else [int(c) for c in counts]
        if len(counts) != len(tokens):
            raise ValueError(f"{len(tokens)} tokens but {len(counts)} counts")
        self.counts = np.array([0, 0, *counts], dtype=np.int64)

    @classmethod
    def build(cls, items: Iterable[str], min_count: int = 1, max_size: int | None = None):
        """Vocabulary of the items seen at least ``min_count`` times, most frequent first.

        ``items`` is an iterable of strings, or a mapping string -> count (a Counter).

        Ties are broken alphabetically, so the ids do not depend on input order.
        ``max_size`` caps the number of entries besides ``<pad>`` and ``<unk>``.
        """
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        counter = Counter(items)
        for special in (PAD, UNK):
            counter.pop(special, None)
        kept = [t for t, c in counter.items() if c >= min_count]
        kept.sort(key=lambda t: (-counter[t], t))
        if max_size is not None:
            kept = kept[:max_size]
        return cls(kept, [counter[t] for t in kept])

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def __getitem__(self, token: str) -> int:
        return self.stoi.get(token, UNK_ID)

    lookup = __getitem__

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, Vocab)
            and self.itos == other.itos
            and np.array_equal(self.counts, other.counts)
        )

    def __repr__(self) -> str:
        return f"Vocab({len(self)} entries: {self.itos[2:7]}...)"

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        """Ids of ``tokens`` (int64); unknown ones are ``UNK_ID``."""
        get = self.stoi.get
        return np.array([get(t, UNK_ID) for t in tokens], dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Strings of ``ids``; an id outside the vocabulary raises ``IndexError``."""
        return [self.itos[int(i)] for i in ids]

    def to_dict(self) -> dict:
        return {"tokens": self.itos[2:], "counts": self.counts[2:].tolist()}

    @classmethod
    def from_dict(cls, data: Mapping) -> Vocab:
        if not isinstance(data, Mapping) or "tokens" not in data:
            raise ValueError(
                f"not a vocabulary: expected an object with 'tokens', got {data!r:.80}"
            )
        tokens = data["tokens"]
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ValueError("not a vocabulary: 'tokens' must be a list of strings")
        return cls(tokens, data.get("counts"))

    def to_json(self) -> str:
        """JSON text: ``{"tokens": [...], "counts": [...]}`` (specials implied)."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Vocab:
        return cls.from_dict(json.loads(text))


def normalize(word: str) -> str:
    """The ``word`` feature: lower-cased, every digit replaced by ``0``.

    >>> normalize("Route66")
    'route00'
    """
    return "".join("0" if c.isdigit() else c for c in word.lower())


def word_shape(word: str) -> str:
    """Character classes with runs collapsed: X upper, x lower, d digit, a other letters;
    any other character stands for itself.

    >>> [word_shape(w) for w in ["Hello", "USA", "3.14", "e-mail", "iPhone", ":-)"]]
    ['Xx', 'X', 'd.d', 'x-x', 'xXx', ':-)']
    """
    out: list[str] = []
    for c in word:
        k = "X" if c.isupper() else "x" if c.islower() else "d" if c.isdigit() else (
            "a" if c.isalpha() else c
        )  # fmt: skip
        if not out or out[-1] != k or k not in "Xxda":
            out.append(k)
    return "".join(out)


def caps_class(word: str) -> str:
    """``lower``, ``title`` (first cased letter upper, others lower), ``upper`` (two or more
    cased letters, all upper), ``mixed``, or ``none`` (no cased letters).

    >>> [caps_class(w) for w in ["cat", "Cat", "I", "NASA", "iPod", "42"]]
    ['lower', 'title', 'title', 'upper', 'mixed', 'none']
    """
    cased = [c for c in word if c.isupper() or c.islower()]
    if not cased:
        return "none"
    if all(c.islower() for c in cased):
        return "lower"
    if cased[0].isupper() and all(c.islower() for c in cased[1:]):
        return "title"
    if all(c.isupper() for c in cased):
        return "upper"
    return "mixed"


def token_features(word: str) -> dict[str, str]:
    """The string value of every feature in :data:`FEATURES` for one word.

    >>> token_features("Dogs")["suffix2"], token_features("Dogs")["shape"]
    ('gs', 'Xx')
    """
    return dict(zip(FEATURES, _feature_values(word)))


@functools.lru_cache(maxsize=1 << 17)
def _feature_values(word: str) -> tuple[str, ...]:
    """Feature values in :data:`FEATURES` order (cached: words repeat a lot)."""
    w = normalize(word)
    return (w, w[:1], w[:2], w[-1:], w[-2:], w[-3:], word_shape(word), caps_class(word))


class Featurizer:
    """One :class:`Vocab` per feature plus a character vocabulary; sentence -> id arrays.

    ``encode(forms)`` returns ``{name: int64 array (len(forms),)}`` for every
    name in :data:`FEATURES`; ``sizes`` gives each vocabulary's size (the
    embedding input dimension). Save with ``to_json``/``save``.

    >>> f = Featurizer.build([["Hi", "there", "!"]], min_count=1, char_min_count=1)
    >>> f.vocabs["caps"].decode(f.encode(["Hi", "!"])["caps"])
    ['title', 'none']
    >>> f.chars.decode(f.char_ids("the?"))
    ['t', 'h', 'e', '<unk>']
    >>> Featurizer.from_json(f.to_json()).sizes == f.sizes
    True
    """

    def __init__(self, vocabs: Mapping[str, Vocab], chars: Vocab):
        missing = [n for n in FEATURES if n not in vocabs]
        extra = [n for n in vocabs if n not in FEATURES]
        if missing or extra:
            raise ValueError(f"feature vocabularies: missing {missing}, unexpected {extra}")
        self.vocabs = {n: vocabs[n] for n in FEATURES}
        self.chars = chars

    @classmethod
    def build(
        cls,
        sentences: Iterable[Sequence[str]],
        min_count: int | Mapping[str, int] | None = None,
        char_min_count: int = 2,
    ) -> Featurizer:
        """Vocabularies from training sentences (lists of word forms).

        ``min_count``: one int for all features, or a dict overriding
        :data:`DEFAULT_MIN_COUNT` (word 1, others 2) per feature.
        """
        mins = dict(DEFAULT_MIN_COUNT)
        if isinstance(min_count, Mapping):
            unknown = [n for n in min_count if n not in FEATURES]
            if unknown:
                raise ValueError(f"min_count names unknown features {unknown}; known: {FEATURES}")
            mins.update(min_count)
        elif min_count is not None:
            mins = dict.fromkeys(FEATURES, min_count)
        counters = {n: Counter() for n in FEATURES}
        chars: Counter = Counter()
        words: Counter = Counter()
        for forms in sentences:
            words.update(forms)
        for form, count in words.items():
            for name, value in zip(FEATURES, _feature_values(form)):
                counters[name][value] += count
            for c in form:
                chars[c] += count
        vocabs = {n: Vocab.build(c, mins[n]) for n, c in counters.items()}
        return cls(vocabs, Vocab.build(chars, char_min_count))

    @property
    def sizes(self) -> dict[str, int]:
        """Vocabulary size per feature, plus ``"chars"``."""
        return {n: len(v) for n, v in self.vocabs.items()} | {"chars": len(self.chars)}

    def encode(self, forms: Sequence[str]) -> dict[str, np.ndarray]:
        """``{feature: int64 array of len(forms)}`` for one sentence."""
        columns = zip(*map(_feature_values, forms)) if len(forms) else [()] * len(FEATURES)
        return {n: v.encode(col) for (n, v), col in zip(self.vocabs.items(), columns)}

    def char_ids(self, word: str) -> list[int]:
        """Ids of the word's characters (case kept); unknown characters are ``UNK_ID``."""
        get = self.chars.stoi.get
        return [get(c, UNK_ID) for c in word]

    def to_json(self) -> str:
        data = {
            "features": {n: v.to_dict() for n, v in self.vocabs.items()},
            "chars": self.chars.to_dict(),
        }
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Featurizer:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data) -> Featurizer:
        if not isinstance(data, dict) or not isinstance(data.get("features"), dict) or (
            "chars" not in data
        ):
            raise ValueError("not a Featurizer: expected an object with 'features' (an object) "
                             "and 'chars'")
        vocabs = {n: Vocab.from_dict(d) for n, d in data["features"].items()}
        return cls(vocabs, Vocab.from_dict(data["chars"]))

    def save(self, path: str | os.PathLike) -> None:
        """Write ``to_json()`` to ``path`` atomically (a crash leaves the old file or the new)."""
        write_atomic(path, self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Featurizer:
        """A Featurizer saved by :meth:`save`; a bad file is a FileFormatError naming it."""
        from examples.pos_tagging.schemas import (
            FEATURES_SCHEMA,  # it names FEATURES: here, not above
        )

        try:
            value = json_files.read_checked(path, FEATURES_SCHEMA)
        except FileFormatError as e:
            raise FileFormatError(path, f"not a features file: {e.problem}") from None
        return cls.from_checked(value, path)

    @classmethod
    def from_checked(cls, value: dict, path: str | os.PathLike) -> Featurizer:
        """The Featurizer of ``value``, a schema-checked features.json read from ``path``."""
        try:
            return cls.from_dict(value)
        except ValueError as e:  # duplicate tokens, or as many counts as tokens
            raise FileFormatError(path, f"not a features file: {e}") from None


def word_dropout(
    ids: np.ndarray, vocab: Vocab, rng: np.random.Generator, p: float = 0.25, max_count: int = 1
) -> np.ndarray:
    """A copy of ``ids`` where each rare word becomes ``<unk>`` with probability ``p``.

    Rare: training count between 1 and ``max_count`` (``<pad>`` and ``<unk>``
    are never touched). Apply to the ``word`` ids of training batches only, so
    that the ``<unk>`` embedding is trained for the unknown words of test time.

    >>> v = Vocab.build(["a", "a", "b"])
    >>> word_dropout(np.array([2, 3, 0]), v, np.random.default_rng(0), p=1.0).tolist()
    [2, 1, 0]
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    ids = np.asarray(ids)
    counts = vocab.counts[ids]
    drop = (counts >= 1) & (counts <= max_count) & (rng.random(ids.shape) < p)
    return np.where(drop, UNK_ID, ids).astype(ids.dtype, copy=False)


def encode_tags(upos: Sequence[str]) -> np.ndarray:
    """Label ids (int64) of UPOS tags; an unknown tag raises ``ValueError``.

    >>> encode_tags(["NOUN", "PUNCT"]).tolist()
    [7, 12]
    """
    try:
        return np.array([TAG_IDS[t] for t in upos], dtype=np.int64)
    except KeyError as e:
        raise ValueError(f"unknown UPOS tag {e.args[0]!r}; known: {UPOS_TAGS}") from None


def decode_tags(ids: Iterable[int]) -> list[str]:
    """UPOS tags of label ids."""
    return [UPOS_TAGS[int(i)] for i in ids]
