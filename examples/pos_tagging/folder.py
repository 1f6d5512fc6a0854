"""The model folder: what `train` writes, in which order, and who may write it.

Files, each written atomically (a temp file renamed into place)::

    features.json, config.json         first, once: vocabularies and sizes
    <cell>.prototxt.j2                 a step template given as a path (copied in)
    snapshot_iter_N.caffemodel         per epoch: raw params,
    snapshot_iter_N.solverstate          solver state,
    snapshot_iter_N.average.caffemodel   averaged params (to resume exactly)
    last.caffemodel                    per epoch: the averaged params
    best.caffemodel                    the averaged params of the best dev epoch
    log.json                           per epoch, after all of the above
    curve.png                          the loss and accuracy plot
    train.lock                         locked while a trainer runs

``log.json`` is the commit point: it is written after every file of its
epoch, and the previous epoch's snapshot is deleted only after it. So a kill
at any instant leaves the files ``log.json`` names in place, ``--resume``
continues from its last epoch, and files of an epoch it does not name (a
killed one's) are removed on the next run, with stale temp files.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from unroll.atomic import remove_stale_temps, write_atomic
from unroll.errors import FileFormatError

LOG = "log.json"
CONFIG = "config.json"
FEATURES = "features.json"
LOCK = "train.lock"
SNAPSHOT_PREFIX = "snapshot"
#: the weights `tag` and `evaluate` can load, by --checkpoint name
CHECKPOINTS = ("best", "last")
#: the keys every log.json entry has
LOG_KEYS = ("epoch", "iter", "train_loss", "dev_accuracy", "seconds", "snapshot", "average")


class ModelFolderError(ValueError):
    """A model folder that cannot be used as asked: names the folder and what to do."""


def read_json(path: Path, kind: type):
    """The JSON value in ``path``, which must be a ``kind`` (dict or list).

    Anything else (not UTF-8, not JSON, another type) is a FileFormatError
    naming the file.
    """
    try:
        value = json.loads(Path(path).read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise FileFormatError(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise FileFormatError(path, f"not valid JSON (line {e.lineno} column {e.colno}: "
                                    f"{e.msg})") from None
    if not isinstance(value, kind):
        expected = {dict: "an object {...}", list: "a list [...]"}[kind]
        raise FileFormatError(path, f"expected {expected}, found {type(value).__name__}")
    return value


def write_json(path: Path, value) -> None:
    write_atomic(path, json.dumps(value, indent=2, ensure_ascii=False).encode("utf-8"))


def read_log(model_dir: Path) -> list[dict]:
    """The epochs logged in ``model_dir`` ([] before the first one ends)."""
    path = model_dir / LOG
    if not path.is_file():
        return []
    log = read_json(path, list)
    for k, entry in enumerate(log):
        if not isinstance(entry, dict) or any(key not in entry for key in LOG_KEYS):
            raise FileFormatError(path, f"entry {k} is not an epoch record with keys "
                                        f"{', '.join(LOG_KEYS)}")
    return log


def snapshot_files(entry: dict) -> set[str]:
    """The names of the snapshot files of one log entry."""
    state = entry["snapshot"]
    return {state, str(Path(state).with_suffix(".caffemodel")), entry["average"]}


def model_files(model_dir: Path) -> list[Path]:
    """The files of a trained (or training) model in ``model_dir``."""
    names = {LOG, CONFIG, FEATURES, "curve.png"}
    return sorted(p for p in model_dir.iterdir() if p.is_file() and (
        p.name in names or p.suffix in (".caffemodel", ".solverstate")))


@contextlib.contextmanager
def claimed(model_dir: Path, resume: bool = False, overwrite: bool = False):
    """Hold ``model_dir`` for one trainer: create it, lock it, tidy it, check it may be used.

    Refuses a folder that already holds a model unless ``resume`` (continue it)
    or ``overwrite`` (delete its model files first), and a folder another
    trainer holds. Removes temp files and snapshots that a killed run left.
    """
    model_dir = Path(model_dir)
    if model_dir.exists() and not model_dir.is_dir():
        raise ModelFolderError(f"--model-dir {model_dir} is a file; expected a folder")
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ModelFolderError(f"--model-dir {model_dir}: a part of this path is a file, "
                               f"not a folder") from None
    with _locked(model_dir):
        remove_stale_temps(model_dir)
        held = model_files(model_dir)
        if held and not resume:
            if not overwrite:
                raise ModelFolderError(
                    f"{model_dir} already holds a model ({', '.join(p.name for p in held[:3])}"
                    f"{', ...' if len(held) > 3 else ''}); pass --resume to continue it or "
                    f"--overwrite to replace it, or choose another --model-dir"
                )
            for path in held:
                path.unlink()
        log = read_log(model_dir)
        kept = snapshot_files(log[-1]) if log else set()
        for path in model_dir.glob(f"{SNAPSHOT_PREFIX}_iter_*"):
            if path.name not in kept:
                path.unlink()
        yield model_dir


@contextlib.contextmanager
def _locked(model_dir: Path):
    """An exclusive lock on ``model_dir/train.lock``; the OS drops it when the process dies."""
    import fcntl

    fd = os.open(model_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ModelFolderError(
                f"{model_dir} is in use by another training (it holds {model_dir / LOCK}); "
                f"wait for it to end or use another --model-dir"
            ) from None
        # writing now, not after an epoch of training, finds a read-only or full disk
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        yield
    finally:
        os.close(fd)
