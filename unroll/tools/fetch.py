"""Fetching UD English EWT: the pinned release's files, each checked against its SHA-256.

:func:`fetch_ewt` downloads the train, dev and test CoNLL-U files of release
r2.16 (the raw files at that tag of UniversalDependencies/UD_English-EWT) into
the cache folder (:func:`unroll.tools.ewt.cache_dir`), with a progress
bar. ``$UNROLL_EWT_URL`` replaces the base URL (a mirror); the file names and
checksums stay the release's.

A file is streamed into a temp file beside its destination (the
``.<name>.<random>.tmp`` of :mod:`unroll.core.atomic`), hashed as it comes, and
renamed into place only once its length and SHA-256 are right, so an
interrupted or damaged download never leaves a file under the real name.
Files already in the cache are hashed before each use as well: one that does
not match is deleted, reported and fetched again. The licence and citation are
printed when the folder is first filled and written beside the files
(``LICENSE.txt``, ``README.txt``). A lock on the folder lets several processes
(the ranks of ``mpirun``) fetch at once: the first downloads, the others
find the files verified.

A download fails, keeping nothing, when a read waits :data:`TIMEOUT_S` for a
byte or when the whole file takes longer than its deadline
(:data:`DEADLINE_S`), so a mirror that trickles bytes cannot hold it for
days. A mirror's URL may carry credentials (``https://user:password@host/``):
they are sent as HTTP basic authentication and never shown; every message
names the URL with its password replaced by ``***``:

>>> redacted("https://ada:s3cret@mirror.example/ewt/")
'https://ada:***@mirror.example/ewt/'

The release's files hold every column (UPOS, lemmas, heads and relations),
so one fetch serves the tagger, the lemmatizer and the relation labeller.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import os
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from tqdm import tqdm

from unroll.core.atomic import remove_stale_temps, write_files_atomic
from unroll.tools.ewt import DATA_ENV, DEV_FILE, RELEASE, TEST_FILE, TRAIN_FILE, cache_dir

__all__ = ["BASE_URL", "DEADLINE_S", "SHA256", "TIMEOUT_S", "URL_ENV", "FetchError", "base_url",
           "fetch_ewt", "redacted", "sha256_of"]

URL_ENV = "UNROLL_EWT_URL"
BASE_URL = f"https://raw.githubusercontent.com/UniversalDependencies/UD_English-EWT/{RELEASE}/"
#: the release's files and their SHA-256. Tests serve their own files and pass those files'
#: checksums as ``fetch_ewt(checksums=...)`` (or patch this mapping), never through the
#: environment, so that no setting of a user's can weaken the check
SHA256 = {
    TRAIN_FILE: "3fb78e2b55482c8ee00caa653af436c88c9e5bc9a73ce26e4ae3ddc79d2b7e7b",
    DEV_FILE: "531a54ff90d6ab12201c5a50c3e78e6ddac4de69abc4bce5d275d3cd29efe2b6",
    TEST_FILE: "e266e515a0a7547657ed3d90d9ba46487d6bd251f27ad4269d4e8a427c8555cd",
}
LICENSE_FILE, README_FILE, LOCK_FILE = "LICENSE.txt", "README.txt", "fetch.lock"
#: seconds without a byte before a download counts as failed
TIMEOUT_S = 60
#: seconds one file's download may take in all (the train file, 13 MiB, at 15 KiB/s)
DEADLINE_S = 900

SOURCE = f"https://github.com/UniversalDependencies/UD_English-EWT/tree/{RELEASE}"
LICENSE_URL = "https://creativecommons.org/licenses/by-sa/4.0/"
CITATION = ("Natalia Silveira, Timothy Dozat, Marie-Catherine de Marneffe, Samuel Bowman, "
            "Miriam Connor, John Bauer and Christopher D. Manning (2014). A Gold Standard "
            "Dependency Corpus for English. In Proceedings of the Ninth International "
            "Conference on Language Resources and Evaluation (LREC 2014)")
NOTICE = (f"UD English EWT {RELEASE} ({SOURCE}) is licensed under CC BY-SA 4.0 "
          f"({LICENSE_URL}): credit it and share what you derive from it alike.\n"
          f"Cite: {CITATION}.")
BIBTEX = """@inproceedings{silveira14gold,
  year = {2014},
  author = {Natalia Silveira and Timothy Dozat and Marie-Catherine de Marneffe and Samuel
            Bowman and Miriam Connor and John Bauer and Christopher D. Manning},
  title = {A Gold Standard Dependency Corpus for {E}nglish},
  booktitle = {Proceedings of the Ninth International Conference on Language Resources
               and Evaluation (LREC-2014)}
}"""


class FetchError(Exception):
    """The release could not be fetched, or its bytes are not the release's: the message
    names the URL, the cache folder and the offline way (``--data DIR``)."""


def base_url() -> str:
    """``$UNROLL_EWT_URL`` (a mirror of the release's files), else the release's own:

    >>> BASE_URL
    'https://raw.githubusercontent.com/UniversalDependencies/UD_English-EWT/r2.16/'
    """
    url = os.environ.get(URL_ENV) or BASE_URL
    return url if url.endswith("/") else url + "/"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def redacted(url: str) -> str:
    """``url`` with the password of its credentials, if any, replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _request(url: str) -> urllib.request.Request:
    """A request for ``url`` without its credentials, which go as basic authentication."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return urllib.request.Request(url)
    bare = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    user = urllib.parse.unquote(parts.username or "")
    secret = base64.b64encode(f"{user}:{urllib.parse.unquote(parts.password or '')}".encode())
    return urllib.request.Request(bare, headers={"Authorization": f"Basic {secret.decode()}"})


def fetch_ewt(folder: Path | None = None, checksums: Mapping[str, str] | None = None,
              quiet: bool = False, deadline_s: float = DEADLINE_S) -> Path:
    """The folder holding the release's files (default :func:`cache_dir`), each verified;
    those missing or damaged are downloaded first. ``quiet``: no progress bar.

    ``checksums`` maps each file name to its SHA-256 (default :data:`SHA256`);
    ``deadline_s`` bounds each file's download. Raises :class:`FetchError` for
    a download that fails, is too slow or does not match.
    """
    folder = Path(folder) if folder is not None else cache_dir()
    checksums = SHA256 if checksums is None else checksums
    base = base_url()
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        remove_stale_temps(folder)  # of a download that was killed
        for name, expected in checksums.items():
            path = folder / name
            if path.is_file():
                if sha256_of(path) == expected:
                    continue
                path.unlink()
                print(f"{path}: its SHA-256 is not release {RELEASE}'s; deleted it, fetching "
                      f"it again", file=sys.stderr)
            _download(base + name, path, expected, quiet, deadline_s)
        if not (folder / LICENSE_FILE).is_file():
            _write_notice(folder, redacted(base), checksums)
            print(NOTICE, file=sys.stderr)
    return folder


def _offline(url: str, folder: Path, problem: str) -> str:
    password = urllib.parse.urlsplit(url).password
    if password:  # an error of the URL's own (a bad port) may quote it
        problem = problem.replace(password, "***")
    return (f"cannot fetch {redacted(url)} ({problem}) into {folder}. Offline, pass --data DIR, a "
            f"folder holding {TRAIN_FILE} and {DEV_FILE} (or set {DATA_ENV}); for a mirror "
            f"set {URL_ENV}")


def _download(url: str, path: Path, expected: str, quiet: bool, deadline_s: float) -> None:
    """``url`` into ``path`` through a temp file beside it, renamed only once verified,
    within ``deadline_s`` (overrun by at most one read's timeout, itself no longer)."""
    deadline = time.monotonic() + deadline_s
    try:
        response = urllib.request.urlopen(_request(url), timeout=min(TIMEOUT_S, deadline_s))
    except urllib.error.HTTPError as e:
        raise FetchError(_offline(url, path.parent, f"HTTP {e.code} {e.reason}")) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        raise FetchError(_offline(url, path.parent, str(reason) or type(reason).__name__)
                         ) from None
    length = response.headers.get("Content-Length")
    length = int(length) if length and length.isdigit() else None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        digest, size = hashlib.sha256(), 0
        with response, os.fdopen(fd, "wb") as out, tqdm(
                total=length, desc=path.name, unit="B", unit_scale=True, unit_divisor=1024,
                disable=quiet, file=sys.stderr, dynamic_ncols=True) as bar:
            while chunk := _read(response, url, path.parent, size):
                if time.monotonic() > deadline:
                    raise FetchError(_offline(
                        url, path.parent, f"{size} bytes came in {deadline_s:g} s, the most "
                                          f"one file may take; nothing was kept"))
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        if length is not None and size != length:
            raise FetchError(_offline(url, path.parent, f"the connection ended after {size} of "
                                                        f"{length} bytes; nothing was kept"))
        if digest.hexdigest() != expected:
            raise FetchError(
                f"{redacted(url)}: SHA-256 {digest.hexdigest()}, expected release {RELEASE}'s "
                f"{expected} (a changed mirror, or a damaged download); deleted it, nothing was "
                f"kept in "
                f"{path.parent}. Run again, check {URL_ENV}, or pass --data DIR"
            )
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _read(response, url: str, folder: Path, size: int) -> bytes:
    """The next chunk of ``response``, as soon as any bytes are there (a trickle must not
    hold one read for long); a connection lost midway is a FetchError."""
    try:
        return response.read1(1 << 16)
    except (OSError, http.client.HTTPException) as e:
        problem = f"the connection failed after {size} bytes: {e or type(e).__name__}"
        raise FetchError(_offline(url, folder, f"{problem}; nothing was kept")) from None


def _write_notice(folder: Path, base: str, checksums: Mapping[str, str]) -> None:
    files = "\n".join(f"  {name}  sha256 {sha}" for name, sha in checksums.items())
    readme = (f"UD English EWT {RELEASE}: Universal Dependencies English Web Treebank\n"
              f"Source: {SOURCE}\nFetched from: {base}\n\n{files}\n\n"
              f"Tune on dev; score the test split once, for the final number.\n\n"
              f"License: CC BY-SA 4.0 ({LICENSE_FILE}).\n\nCite:\n{CITATION}.\n\n{BIBTEX}\n")
    licence = (f"The UD English EWT files in this folder ({SOURCE}) are licensed under the\n"
               f"Creative Commons Attribution-ShareAlike 4.0 International License\n"
               f"(CC BY-SA 4.0): {LICENSE_URL}\n"
               f"Full text: {LICENSE_URL}legalcode\n")
    write_files_atomic([(folder / README_FILE, readme.encode()),
                        (folder / LICENSE_FILE, licence.encode())])


@contextlib.contextmanager
def _locked(folder: Path):
    """An exclusive lock on ``folder/fetch.lock``, waited for; the OS drops it at exit."""
    import fcntl

    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
