"""Every application of examples/, described once, so that a test "for every application"
is written once and parametrized over :data:`APPS` (tests/examples/test_apps.py).

An application's row says how its commands are called on a tiny corpus: the
module it runs as, its ``train`` options for a model that trains in a second or
two, its prediction and evaluation commands, and the files of its own that its
model folder holds besides the Trainer's (docs/design.md, 10. Training).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.examples.conftest import TINY_ARGS, write_corpus
from tests.examples.test_lemmatize import write_lemma_corpus
from tests.examples.trees import write_trees


@dataclass(frozen=True)
class App:
    """One application's command line.

    ``corpus(folder)`` writes a tiny EWT-like train and dev split into ``folder``
    and returns it. ``train`` are the options of a tiny training run beside
    ``--data``, ``--model-dir``, ``--epochs`` and ``--quiet``, which every
    application shares. ``predict`` is the command that labels a CoNLL-U file
    (``{input}``: the corpus' dev split) and ``evaluate`` the one that scores the
    dev split; both take ``--model-dir``, ``--data`` where they read a split, and
    ``-o OUT``. ``files`` are the
    application's own files in the model folder. ``rates`` are its ``train`` options
    that take a number > 0 (learning rates) and ``ratios`` those that take a number in
    [0, 1) (dropout). ``recorded`` are the ``train`` options every epoch's record holds
    (the Trainer's ``--lr`` and the application's ``recorded_options``), each with two
    values it may take.
    """

    name: str
    module: str
    corpus: Callable[[Path], Path]
    train: tuple[str, ...]
    predict: tuple[str, ...]
    evaluate: tuple[str, ...]
    files: tuple[str, ...]
    rates: tuple[str, ...] = ("--lr",)
    ratios: tuple[str, ...] = ()
    recorded: tuple[tuple[str, str, str], ...] = (("--lr", "0.01", "0.02"),)

    def command(self, *args: str) -> list[str]:
        """``python -m <module> args...`` as an argv."""
        return ["-m", self.module, *args]


TAGGER = App(
    name="tagger", module="examples.pos_tagging", corpus=write_corpus,
    train=tuple(TINY_ARGS), predict=("tag", "--conllu", "{input}"),
    evaluate=("evaluate", "--split", "dev"), files=("config.json", "features.json"),
    rates=("--lr", "--lr-decay"), ratios=("--dropout", "--word-dropout"),
    recorded=(("--lr", "0.01", "0.02"), ("--lr-decay", "0.9", "0.8")),
)

DEPREL = App(
    name="deprel", module="examples.deprel", corpus=write_trees,
    train=("--hidden", "8", "--lr", "0.01"), predict=("label", "--conllu", "{input}"),
    evaluate=("evaluate", "--split", "dev"), files=("config.json", "features.json"),
)

LEMMATIZER = App(
    name="lemmatizer", module="examples.lemmatize",
    corpus=lambda folder: write_lemma_corpus(folder, n_train=30),
    train=("--hidden", "8", "--embed", "8", "--batch", "8", "--dropout", "0.2"),
    predict=("lemmatize", "--conllu", "{input}"), evaluate=("evaluate", "--split", "dev"),
    files=("config.json", "features.json"), ratios=("--dropout",),
)

CHARLM = App(
    name="charlm", module="examples.charlm", corpus=write_corpus,
    train=("--steps", "5", "--batch", "3", "--hidden", "6", "--embed", "4"),
    predict=("sample", "--prime", "the "), evaluate=("evaluate", "--split", "dev"),
    files=("config.json", "features.json"),
)

#: the applications, each a row: every test of test_apps.py runs over all of them
APPS = [TAGGER, DEPREL, LEMMATIZER, CHARLM]
