"""Standard output that is complete or an error: what `tag` and `evaluate` print through.

>>> with standard_output() as out:
...     print("NOUN", file=out)
NOUN
"""

from __future__ import annotations

import contextlib
import io
import os
import sys

__all__ = ["OutputClosed", "standard_output"]


class OutputClosed(Exception):
    """The reader of standard output went away (``| head``): stop quietly, as Unix tools do."""


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
        done = 0
        while done < len(view):
            done += os.write(self._fd, view[done:])
        return done


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
        with contextlib.suppress(AttributeError, OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise OutputClosed from None
    except OSError as e:
        if e.errno is None or e.filename is not None:  # not a write to stdout
            raise
        raise type(e)(e.errno, e.strerror, "standard output") from None
