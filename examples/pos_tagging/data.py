"""Where the UD English EWT files are, and reading one split of them.

The folder is, first found: ``--data DIR``, then ``$UNROLL_EWT_DATA``, then
``shared/data/ud_english_ewt`` beside the checkout (``../shared/data/...``
seen from the repository root).
"""

from __future__ import annotations

import os
from pathlib import Path

from examples.pos_tagging.conll import read_conllu
from unroll.errors import FileFormatError

DATA_ENV = "UNROLL_EWT_DATA"
TRAIN_FILE = "en_ewt-ud-train.conllu"
DEV_FILE = "en_ewt-ud-dev.conllu"
DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "ud_english_ewt"


def data_dir(given: Path | str | None = None) -> Path:
    """The EWT folder: ``given`` (``--data``), else ``$UNROLL_EWT_DATA``, else the default.

    >>> data_dir("my/ewt")
    PosixPath('my/ewt')
    """
    if given:
        return Path(given)
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV])
    return DEFAULT_DATA


def read_split(data: Path, name: str, limit: int = 0):
    """The (forms, upos) sentences of ``data/name``, the first ``limit`` if given."""
    path = Path(data) / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found. Download UD English EWT (train and dev .conllu) from "
            f"https://github.com/UniversalDependencies/UD_English-EWT and pass --data DIR "
            f"(or set {DATA_ENV})"
        )
    sentences = list(read_conllu(path))
    if not sentences:
        raise FileFormatError(path, "holds no sentences")
    return sentences[:limit] if limit else sentences
