"""The lemmatizer: a character encoder-decoder over one parameter store, and its dictionary.

The net is ``lemmatizer.prototxt.j2`` beside this file (read it for the
equations). The source of a word is its UPOS, as one symbol, then its
characters; the target is its lemma's characters then EOS. Three kinds of net
share the params: the training nets (encoder and decoder, teacher forcing), one
per (source length, target length) bucket
(:class:`~unroll.train.tree_model.TreeModel`, a model keyed by the bucket); the
test-phase encoder, one per source length; and the one-step decoder, run by an
:class:`unroll.Stepper` for greedy decoding and beam search
(:mod:`unroll.train.decoding`, the attention memory its static input). The
decoder attends over the encoder's outputs (Luong attention, as Stanza's
lemmatizer) unless the config's ``attention`` is "none". Batches hold words of
one source length (no source padding) with targets of similar lengths (padded
with the loss's ignore label).

A word longer than ``max_chars`` (URLs, e-mail addresses) is its own lemma.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from examples.pos_tagging.features import UNK_ID, Vocab
from examples.pos_tagging.schemas import MAX_VOCAB, MAX_WIDTH, VOCAB_SCHEMA
from unroll import Stepper, expand
from unroll.core import json_files
from unroll.core.atomic import write_atomic
from unroll.core.json_files import count, finite, ratio
from unroll.tools.conllu import UPOS_TAGS
from unroll.train import model_folder as folder
from unroll.train.decoding import StepperDecoder, beam_search, greedy
from unroll.train.trainer import log_schema
from unroll.train.tree_model import TreeModel

__all__ = ["ATTENTION", "EDITS", "LEMMATIZER_FILES", "Description", "Dictionary", "Lemmatizer",
           "LemmatizerConfig", "edit_of", "upos_symbol"]

TEMPLATE = Path(__file__).with_name("lemmatizer.prototxt.j2")
BOS, EOS = "<s>", "</s>"
IGNORE = -1
#: what the edit classifier may say of a lemma: the decoder's, the form, the form lower-cased
EDITS = ("decode", "identity", "lower")
#: the decoder's attention over the encoder's outputs: none, or Luong's dot or general score
ATTENTION = ("none", "dot", "general")


def edit_of(form: str, lemma: str) -> int:
    """The edit class of a (form, lemma) pair (see :data:`EDITS`).

    >>> [edit_of(f, lemma) for f, lemma in [("dogs", "dog"), ("Paris", "Paris"), ("The", "the")]]
    [0, 1, 2]
    """
    return 1 if lemma == form else 2 if lemma == form.lower() else 0


def upos_symbol(upos: str) -> str:
    """The source symbol of a UPOS tag, read before the word's characters."""
    return f"<{upos}>"


@dataclass
class LemmatizerConfig:
    """Sizes of a lemmatizer; saved as config.json in the model folder."""

    embed: int = 64
    hidden: int = 128
    dropout: float = 0.2
    batch: int = 48
    max_chars: int = 40
    attention: str = "dot"

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self), indent=1).encode())

    @classmethod
    def load(cls, path: Path) -> LemmatizerConfig:
        return cls(**json_files.read_checked(path, CONFIG_SCHEMA))


CONFIG_SCHEMA = {
    "type": "object", "description": "an object {...}", "additionalProperties": False,
    "required": ["embed", "hidden", "dropout", "batch", "max_chars", "attention"],
    "properties": {
        "embed": count(MAX_WIDTH), "hidden": count(MAX_WIDTH), "batch": count(MAX_WIDTH),
        "max_chars": count(256), "dropout": ratio(),
        "attention": {"enum": list(ATTENTION), "description": f"one of {list(ATTENTION)}"},
    },
}

_STRING = {"type": "string", "maxLength": 4096, "description": "a string"}

#: features.json: the character vocabulary and the training dictionary
FEATURES_SCHEMA = {
    "type": "object", "description": "an object {chars, dictionary}",
    "required": ["chars", "dictionary"], "additionalProperties": False,
    "properties": {
        "chars": VOCAB_SCHEMA,
        "dictionary": {"type": "array", "maxItems": MAX_VOCAB,
                       "description": "a list of [form, UPOS, lemma]",
                       "items": {"type": "array", "minItems": 3, "maxItems": 3,
                                 "description": "a [form, UPOS, lemma] triple",
                                 "items": _STRING}},
    },
}


class Dictionary:
    """The most frequent training lemma of each (form, UPOS), and of each (lower-cased form,
    UPOS).

    >>> d = Dictionary.build([("Dogs", "NOUN", "dog"), ("dogs", "NOUN", "dog"),
    ...                       ("saw", "VERB", "see"), ("saw", "VERB", "see"),
    ...                       ("saw", "VERB", "saw")])
    >>> d.get("saw", "VERB"), d.get("DOGS", "NOUN"), d.get("DOGS", "NOUN", lower=True)
    ('see', None, 'dog')
    """

    def __init__(self, entries):
        self.entries = {(f, u): lemma for f, u, lemma in entries}
        counts: dict = {}
        for (form, upos), lemma in self.entries.items():
            key = (form.lower(), upos)
            counts.setdefault(key, {}).setdefault(lemma, 0)
            counts[key][lemma] += 1
        self.lowered = {key: max(sorted(c), key=c.get) for key, c in counts.items()}

    @classmethod
    def build(cls, triples) -> Dictionary:
        counts: dict = {}
        for form, upos, lemma in triples:
            c = counts.setdefault((form, upos), {})
            c[lemma] = c.get(lemma, 0) + 1
        return cls((f, u, max(sorted(c), key=c.get)) for (f, u), c in counts.items())

    def get(self, form: str, upos: str, lower: bool = False) -> str | None:
        found = self.entries.get((form, upos))
        if found is None and lower:
            found = self.lowered.get((form.lower(), upos))
        return found

    def to_list(self) -> list:
        return [[f, u, lemma] for (f, u), lemma in sorted(self.entries.items())]


@dataclass(frozen=True)
class Description:
    """What a model folder says of a lemmatizer beside its weights: the character
    vocabulary and the dictionary (features.json), the sizes (config.json).

    >>> d = Description.build([("dogs", "NOUN", "dog")], LemmatizerConfig())
    >>> d.dictionary.get("dogs", "NOUN"), d.chars.itos[2:4], len(d.chars)
    ('dog', ['<s>', '</s>'], 25)
    """

    chars: Vocab
    dictionary: Dictionary
    config: LemmatizerConfig

    @classmethod
    def build(cls, triples, config: LemmatizerConfig) -> Description:
        """The description of a new lemmatizer for the training (form, UPOS, lemma) triples."""
        symbols = [BOS, EOS, *map(upos_symbol, UPOS_TAGS)]
        chars = Vocab.build([c for f, _, lemma in triples for c in f + lemma])
        chars = Vocab([*symbols, *chars.itos[2:]], [0] * len(symbols) + chars.counts[2:].tolist())
        return cls(chars, Dictionary.build(triples), config)

    def save(self, model_dir: Path) -> None:
        folder.write_json(Path(model_dir) / folder.FEATURES,
                          {"chars": self.chars.to_dict(),
                           "dictionary": self.dictionary.to_list()})
        self.config.save(Path(model_dir) / folder.CONFIG)

    @classmethod
    def read(cls, model_dir: Path, log: list[dict]) -> Description:
        """The description in a model folder, its JSON schema-checked and checked against
        the checksums of ``log`` (its log.json)."""
        return cls.described(folder.read_declared(Path(model_dir), LEMMATIZER_FILES, log))

    @classmethod
    def described(cls, files: dict) -> Description:
        """The description from the values of a model folder's JSON files ({name: value})."""
        features = files[folder.FEATURES]
        return cls(Vocab.from_dict(features["chars"]),
                   Dictionary(map(tuple, features["dictionary"])),
                   LemmatizerConfig(**files[folder.CONFIG]))


class Lemmatizer:
    """Characters and UPOS in, the lemma's characters out; the dictionary beside it."""

    def __init__(self, description: Description, seed: int = 0):
        self.chars, self.dictionary, self.config = (description.chars, description.dictionary,
                                                    description.config)
        self.bos, self.eos = self.chars[BOS], self.chars[EOS]
        self.train_model = TreeModel(lambda key: self.net("train", *key), (1, 1), seed=seed)
        self.encoders = TreeModel(lambda s: self.net("encoder", s, 1), 1, phase="test",
                                  store=self.train_model.store)
        self.stepper = Stepper(self.net("decoder", 1, 1), store=self.train_model.store)

    @classmethod
    def build(cls, triples, config: LemmatizerConfig, seed: int = 0) -> Lemmatizer:
        """A new lemmatizer for the training (form, UPOS, lemma) triples."""
        return cls(Description.build(triples, config), seed)

    def net(self, part: str, src: int, tgt: int):
        """The lemmatizer's net ``part`` ("train", "encoder" or "decoder", see
        ``lemmatizer.prototxt.j2``) for sources of ``src`` steps and targets of ``tgt``.

        >>> lemmatizer = Lemmatizer.build([("dogs", "NOUN", "dog")], LemmatizerConfig(hidden=4))
        >>> [layer.name for layer in lemmatizer.net("decoder", 5, 1).layer][:2]
        ['input', 'tgt_embed']
        """
        return expand(TEMPLATE, steps=tgt, batch=self.config.batch, chars=len(self.chars),
                      edits=len(EDITS), embed=self.config.embed, hidden=self.config.hidden,
                      part=part, src_steps=src, dropout=self.config.dropout,
                      ignore_label=IGNORE, attention=self.config.attention)

    # -- data ---------------------------------------------------------------------------
    def source(self, form: str, upos: str) -> list[int]:
        return [self.chars[upos_symbol(upos)], *self.chars.encode(form).tolist()]

    def fits(self, form: str) -> bool:
        return len(form) <= self.config.max_chars

    def batches(self, examples, rng=None):
        """Training batches of (form, UPOS, lemma) examples: (key, inputs), each batch one
        source length, targets sorted by length within it; shuffled with ``rng``."""
        by_length: dict = {}
        for form, upos, lemma in examples:
            if self.fits(form) and len(lemma) <= self.config.max_chars:
                by_length.setdefault(len(form) + 1, []).append((form, upos, lemma))
        out = []
        for length, group in sorted(by_length.items()):
            if rng is not None:
                group = [group[i] for i in rng.permutation(len(group))]
            group.sort(key=lambda e: len(e[2]))  # stable: shuffled within a target length
            for k in range(0, len(group), self.config.batch):
                out.append(self._inputs(group[k:k + self.config.batch], length))
        if rng is not None:
            out = [out[i] for i in rng.permutation(len(out))]
        return out

    def _inputs(self, batch, length: int):
        n, steps = len(batch), max(len(lemma) for _, _, lemma in batch) + 1
        src = np.array([self.source(f, u) for f, u, _ in batch], float).T
        tgt_in = np.zeros((steps, n))
        tgt_out = np.full((steps, n), IGNORE, float)
        for j, (_, _, lemma) in enumerate(batch):
            ids = self.chars.encode(lemma).tolist()
            tgt_in[:len(ids) + 1, j] = [self.bos, *ids]
            tgt_out[:len(ids) + 1, j] = [*ids, self.eos]
        cont = np.ones((length, n))
        cont[0] = 0
        zeros = np.zeros((1, n, self.config.hidden))
        edit = np.array([[edit_of(f, lemma) for f, _, lemma in batch]], float)
        inputs = {"src": src, "src_cont": cont, "tgt_in": tgt_in, "tgt_cont": np.ones((steps, n)),
                  "tgt_out": tgt_out, "edit": edit, "enc_fw_h_0": zeros, "enc_fw_c_0": zeros,
                  "enc_bw_h_0": zeros, "enc_bw_c_0": zeros}
        return (length, steps), inputs

    # -- prediction ---------------------------------------------------------------------
    def predict(self, words, beam: int = 1, batch_size: int = 256, edits: bool = True
                ) -> list[str]:
        """The seq2seq's lemma of each (form, UPOS): greedy (``beam=1``) or beam search; with
        ``edits``, the form or the form lower-cased where the edit classifier says so."""
        out: list[str | None] = [None] * len(words)
        by_length: dict = {}
        for i, (form, _) in enumerate(words):
            if self.fits(form):
                by_length.setdefault(len(form) + 1, []).append(i)
            else:
                out[i] = form
        for _, index in sorted(by_length.items()):
            for k in range(0, len(index), batch_size):
                part = index[k:k + batch_size]
                lemmas = self._decode([words[i] for i in part], beam, edits)
                for i, lemma in zip(part, lemmas):
                    out[i] = lemma
        return out

    def encode(self, words) -> dict:
        """The encoder's outputs for (form, UPOS) ``words`` of one length: ``dec_h_init``,
        ``dec_c_init`` (1, N, 2 * hidden), ``edit_probs`` (1, N, edits), and with
        attention the ``memory`` (S, N, 2 * hidden) and its ``memory_mask``."""
        n, length = len(words), len(words[0][0]) + 1
        src = np.array([self.source(f, u) for f, u in words], float).T
        cont = np.ones((length, n))
        cont[0] = 0
        zeros = np.zeros((1, n, self.config.hidden))
        out = self.encoders.forward(widths=length, src=src, src_cont=cont, enc_fw_h_0=zeros,
                                    enc_fw_c_0=zeros, enc_bw_h_0=zeros, enc_bw_c_0=zeros,
                                    blobs=["dec_h_init"])
        return {name: np.asarray(value).copy() for name, value in out.items()}

    def decoder(self, encoded: dict) -> StepperDecoder:
        """The one-step decoder over :meth:`encode`'s outputs, started from its final
        states, as :mod:`unroll.train.decoding` drives it (the memory a static input)."""
        static = ({} if self.config.attention == "none" else
                  {"memory": encoded["memory"], "memory_mask": encoded["memory_mask"]})
        decoder = StepperDecoder(self.stepper, token="tgt_in", cont="tgt_cont",
                                 output="probs", static=static, batch_axes={"memory_mask": 1})
        decoder.start({"dec_h_0": encoded["dec_h_init"], "dec_c_0": encoded["dec_c_init"]})
        return decoder

    def _decode(self, words, beam: int, edits: bool) -> list[str]:
        encoded = self.encode(words)
        decoder = self.decoder(encoded)
        max_len = max(len(f) for f, _ in words) + 10
        if beam > 1:
            found = beam_search(decoder, len(words), self.bos, self.eos, max_len, beam)
        else:
            found = greedy(decoder, len(words), self.bos, self.eos, max_len)
        lemmas = ["".join(self.chars.itos[t] if t != UNK_ID else "?" for t in tokens)
                  for tokens, _ in found]
        if not edits:
            return lemmas
        said = encoded["edit_probs"].reshape(len(words), -1).argmax(axis=1)
        return [form if e == 1 else form.lower() if e == 2 else lemma
                for (form, _), e, lemma in zip(words, said, lemmas)]

    def lemmatize(self, words, beam: int = 1, lower: bool = False) -> list[str]:
        """The lemma of each (form, UPOS): the dictionary's where it has the pair (with
        ``lower``, also the lower-cased form), the seq2seq's for the rest."""
        known = [self.dictionary.get(f, u, lower) for f, u in words]
        rest = [i for i, lemma in enumerate(known) if lemma is None]
        for i, lemma in zip(rest, self.predict([words[i] for i in rest], beam)):
            known[i] = lemma
        return known

    # -- files --------------------------------------------------------------------------
    @classmethod
    def load(cls, model_dir: Path, checkpoint: str = "best") -> Lemmatizer:
        """The lemmatizer of a model folder: its JSON schema-checked, its weights checked
        against the SHA-256 that log.json records."""
        return folder.load_trained(model_dir, LEMMATIZER_FILES,
                                   lambda files: cls(Description.described(files)),
                                   what="lemmatizer", module="examples.lemmatize",
                                   checkpoint=checkpoint)


#: the lemmatizer's log.json: the Trainer's epoch records (no average: the params themselves
#: are evaluated and saved) with its three dev accuracies
LOG_SCHEMA = log_schema(
    {"dev_accuracy": finite(1), "dev_combined": finite(1), "dev_combined_lower": finite(1)},
    required=["dev_accuracy", "dev_combined", "dev_combined_lower"], averaged=False)

#: the lemmatizer's model folder: its log and its two JSON files, which log.json checksums
LEMMATIZER_FILES = folder.ModelFiles(LOG_SCHEMA, {folder.CONFIG: CONFIG_SCHEMA,
                                                  folder.FEATURES: FEATURES_SCHEMA})
