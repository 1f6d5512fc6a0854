"""Where the UD English EWT files are, and reading one split of them.

The folder is, first found: ``--data DIR``, then ``$UNROLL_EWT_DATA``, then
``shared/data/ud_english_ewt`` beside the checkout (``../shared/data/...``
seen from the repository root) when it exists, else the cache
``$UNROLL_DATA_HOME/ud_english_ewt/r2.16`` (default ``~/.cache/unroll``),
into which :func:`fetched_data_dir` downloads the pinned release
(:mod:`unroll.tools.fetch`). Only the cache is ever fetched into, so
a machine with ``../shared/data`` (CI) never downloads.
"""

from __future__ import annotations

import os
from pathlib import Path

from unroll.core.errors import FileFormatError
from unroll.tools.conllu import read_conllu

__all__ = ["DATA_ENV", "DEFAULT_DATA", "DEV_FILE", "HOME_ENV", "RELEASE", "SPLIT_FILES",
           "TEST_FILE", "TRAIN_FILE", "cache_dir", "data_dir", "fetched_data_dir", "read_split",
           "split_file"]

DATA_ENV = "UNROLL_EWT_DATA"
HOME_ENV = "UNROLL_DATA_HOME"
#: the UD English EWT release that is fetched (a tag of UniversalDependencies/UD_English-EWT)
RELEASE = "r2.16"
TRAIN_FILE = "en_ewt-ud-train.conllu"
DEV_FILE = "en_ewt-ud-dev.conllu"
TEST_FILE = "en_ewt-ud-test.conllu"
SPLIT_FILES = {"train": TRAIN_FILE, "dev": DEV_FILE, "test": TEST_FILE}
DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "ud_english_ewt"


def cache_dir() -> Path:
    """The folder the release is fetched into: ``$UNROLL_DATA_HOME`` (default
    ``~/.cache/unroll``), then ``ud_english_ewt/<release>``.

    >>> cache_dir().parts[-2:]
    ('ud_english_ewt', 'r2.16')
    """
    home = os.environ.get(HOME_ENV) or Path("~/.cache/unroll")
    return Path(home).expanduser() / "ud_english_ewt" / RELEASE


def _located(given) -> tuple[Path, bool]:
    """The EWT folder and whether it is the cache (the only folder that is fetched into)."""
    if given:
        return Path(given), False
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV]), False
    if DEFAULT_DATA.is_dir():
        return DEFAULT_DATA, False
    return cache_dir(), True


def data_dir(given: Path | str | None = None) -> Path:
    """The EWT folder: ``given`` (``--data``), else ``$UNROLL_EWT_DATA``, else
    ``../shared/data/ud_english_ewt`` if it exists, else :func:`cache_dir`. Fetches nothing.

    >>> data_dir("my/ewt")
    PosixPath('my/ewt')
    """
    return _located(given)[0]


def fetched_data_dir(given: Path | str | None = None, quiet: bool = False) -> Path:
    """:func:`data_dir`, with the release's files fetched and verified when it is the cache.

    Raises :class:`unroll.tools.fetch.FetchError` when they cannot be had.
    """
    folder, cached = _located(given)
    if cached:
        from unroll.tools.fetch import fetch_ewt  # fetch.py imports this module

        fetch_ewt(folder, quiet=quiet)
    return folder


def split_file(data: Path, split: str) -> Path:
    """The CoNLL-U file of ``split`` (train, dev or test) in ``data``, which must hold it.

    >>> split_file(Path("/nowhere"), "test")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileNotFoundError: /nowhere/en_ewt-ud-test.conllu not found: ...
    """
    path = Path(data) / SPLIT_FILES[split]
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: the data folder {data} has no {split} split. Pass --data DIR, "
            f"a folder holding {path.name}, or fetch release {RELEASE} (train, dev and test) "
            f"with `python -m examples.pos_tagging fetch` and pass the folder it prints"
        )
    return path


def read_split(data: Path, name: str, limit: int = 0):
    """The (forms, upos) sentences of ``data/name``, the first ``limit`` if given."""
    path = Path(data) / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found. Pass --data DIR, a folder with UD English EWT's train and dev "
            f".conllu (https://github.com/UniversalDependencies/UD_English-EWT), or set "
            f"{DATA_ENV}; with neither, release {RELEASE} is fetched into {cache_dir()}"
        )
    sentences = list(read_conllu(path))
    if not sentences:
        raise FileFormatError(path, "holds no sentences")
    return sentences[:limit] if limit else sentences
