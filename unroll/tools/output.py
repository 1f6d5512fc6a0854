"""Where a command's output goes: ``-o OUT`` or standard output, complete or an error.

:func:`write_output` is what every command writes its ``-o`` through: a
regular file (or a new one) is replaced atomically, so an interrupted command
leaves the old file or the new, never half of one; a symlink's file is the
one replaced, the link stays; a device (``/dev/null``, a terminal), a FIFO or
a socket is written through, as the shell's ``> OUT`` would, never replaced by
a file of its name. :func:`standard_output` is a text stream for output made
as it goes (``tag``). Both write every byte or raise an OSError naming the
file or "standard output".

>>> with standard_output() as out:
...     print("NOUN", file=out)
NOUN
>>> write_output("VERB\\n", "-")
VERB
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import sys
from pathlib import Path

from unroll.core.atomic import named_os_error, write_atomic

__all__ = ["OutputClosed", "standard_output", "write_output"]


class OutputClosed(Exception):
    """The reader of standard output went away (``| head``): stop quietly, as Unix tools do."""


def write_output(data: str | bytes, path=None) -> None:
    """Write ``data`` (text as UTF-8) to ``path``, or to standard output without a path or
    for "-": all of it, or an OSError that names the file or "standard output".

    A regular file, or a name that holds none, is replaced atomically (through a
    symlink: the file it leads to); anything else that is not a folder (a
    device, a FIFO, whose reader it waits for, a socket) is opened and written
    through. A reader that closed standard output early raises
    :class:`OutputClosed`.
    """
    data = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if path is None or os.fspath(path) == "-":
        _to_standard_output(data)
        return
    path = Path(path)
    try:
        mode = os.stat(path).st_mode  # what the name leads to, through its links
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise named_os_error(e, path) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder; expected a file to write", str(path))
    if mode is not None and not stat.S_ISREG(mode):
        _write_through(path, data)
        return
    target = Path(os.path.realpath(path))  # a symlink stays; its file is replaced
    if not target.parent.is_dir():  # a typo in the folder, not a folder to make
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
    write_atomic(target, data)


def _write_through(path: Path, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
    except OSError as e:
        raise named_os_error(e, path) from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _to_standard_output(data: bytes) -> None:
    try:
        sys.stdout.flush()
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # a stream without a descriptor
            buffer = getattr(sys.stdout, "buffer", None)
            if buffer is None:
                sys.stdout.write(data.decode("utf-8"))
            else:
                buffer.write(data)
                buffer.flush()
        else:
            _write_all(fd, data)
    except OSError as e:
        # what is still buffered would fail again, with a traceback, when Python exits
        _discard_standard_output()
        if isinstance(e, BrokenPipeError):
            raise OutputClosed from None
        raise named_os_error(e, "standard output") from None


def _discard_standard_output() -> None:
    with contextlib.suppress(AttributeError, OSError, ValueError):  # a test's capture
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


class _WholeWrites(io.RawIOBase):
    """A file descriptor whose every write goes out whole or raises.

    Python's own stdout takes a short write (what a nearly full disk gives) as
    the whole and drops the rest silently; here the rest is written again, and
    the disk's ENOSPC comes back as an error.
    """

    def __init__(self, fd: int):
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        _write_all(self._fd, view)
        return len(view)


@contextlib.contextmanager
def standard_output():
    """A text stream to standard output, flushed at the end, so that a write that fails (a
    full disk) is an OSError naming "standard output", never a silently short file."""
    try:
        sys.stdout.flush()
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # a stream without a descriptor
            yield sys.stdout
            sys.stdout.flush()
        else:
            out = io.TextIOWrapper(io.BufferedWriter(_WholeWrites(fd)), sys.stdout.encoding,
                                   sys.stdout.errors)
            yield out
            out.flush()
            out.detach()  # stdout stays open
    except BrokenPipeError:
        # the interpreter's own flush at exit would fail again and complain: point it at
        # nothing (where stdout is a real file descriptor)
        _discard_standard_output()
        raise OutputClosed from None
    except OSError as e:
        if e.errno is None or e.filename is not None:  # not a write to stdout
            raise
        raise type(e)(e.errno, e.strerror, "standard output") from None
