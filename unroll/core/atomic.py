"""Atomic file writes: a crash never leaves a half-written weights or state file.

Each file is written to a temp file beside it (``.<name>.<random>.tmp``),
flushed to disk, then renamed over the destination. A process killed before
the rename leaves only that temp file, which :func:`remove_stale_temps`
deletes on the next run.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

__all__ = ["named_os_error", "remove_stale_temps", "write_atomic", "write_files_atomic"]

#: the names mkstemp gives our temp files: "." + destination name + "." + 8 random + ".tmp"
_TEMP_NAME = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_files_atomic(files: list[tuple[Path, bytes]]) -> None:
    """Write each ``(path, data)``: all to temp files first, then rename each into place.

    A failure while writing (disk full, a crash, an exception) leaves every
    destination as it was and no temp file behind; only the renames, which
    are atomic each, remain between the old files and the new ones. Files get
    the usual permissions (0666 less the umask), not the temp file's 0600.
    """
    temps: list[str] = []
    mode = 0o666 & ~_umask()
    path = None  # the destination being written, for the error
    try:
        for path, data in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            temps.append(tmp)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
        for (path, _), tmp in zip(files, temps):
            os.replace(tmp, path)
    except BaseException as e:
        for tmp in temps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if isinstance(e, OSError):
            # a failed write() names no file ("[Errno 28] No space left on device")
            raise named_os_error(e, path) from e
        raise
    for folder in {path.parent for path, _ in files}:  # make the renames durable (POSIX)
        with contextlib.suppress(OSError):
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


def named_os_error(error: OSError, where) -> OSError:
    """``error`` (of the same class and errno) with a message that starts with ``where``.

    >>> import errno
    >>> e = named_os_error(OSError(errno.ENOSPC, "No space left on device"), "m/best.caffemodel")
    >>> str(e), e.errno == errno.ENOSPC
    ('m/best.caffemodel: No space left on device', True)
    """
    named = type(error)(f"{where}: {error.strerror or error}")
    named.errno = error.errno  # not strerror nor filename: str() would show those instead
    return named


def write_atomic(path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash never leaves a half-written file."""
    write_files_atomic([(Path(path), data)])


def remove_stale_temps(folder) -> list[Path]:
    """Delete the temp files that killed atomic writes left in ``folder``; return them.

    Only call it while no other process writes into ``folder`` (hold its lock):
    a live writer's temp file looks the same as a dead one's.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / ".best.caffemodel.ab12_x9Z.tmp").write_bytes(b"half")
    >>> [p.name for p in remove_stale_temps(d)], list(d.iterdir())
    (['.best.caffemodel.ab12_x9Z.tmp'], [])
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = [p for p in folder.iterdir() if _TEMP_NAME.match(p.name) and p.is_file()]
    for path in stale:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return stale
