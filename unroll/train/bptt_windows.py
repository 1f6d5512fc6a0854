"""Truncated BPTT over one long stream: N rows, each carried on window after window.

A stream of symbols (a text) is cut into N rows, row k holding the k-th N-th
of it, and the rows into windows of T steps, each (T, N) time-major: row k
of a window carries on from row k of the one before, so that the state the
training net ends a window with (:func:`unroll.train.carry.carry_hidden`) is
the state the next window starts from (docs/design.md, 10. Training). The
inputs are the stream but its last symbol, the targets (what each step
predicts) the stream but its first; the last row is padded with targets the
loss ignores (``ignore``, Caffe's ``ignore_label``), the last window may be
shorter.

>>> [(x.T.tolist(), y.T.tolist()) for x, y in bptt_windows([1, 2, 3, 1], rows=2, steps=2)]
[([[1, 2], [3, 1]], [[2, 3], [1, -1]])]
>>> [x.shape for x, y in bptt_windows(range(8), rows=2, steps=3)]
[(3, 2), (1, 2)]
"""

from __future__ import annotations

import numpy as np

__all__ = ["bptt_windows"]


def bptt_windows(stream, rows: int, steps: int,
                 ignore: int = -1) -> list[tuple[np.ndarray, np.ndarray]]:
    """(inputs, targets) of every window of ``stream`` (a sequence of symbol ids) in
    ``rows`` rows of ``steps`` steps (see the module); the inputs padded with the stream's
    last symbol, the targets with ``ignore``."""
    stream = np.asarray(stream, np.int64)
    if rows < 1 or steps < 1:
        raise ValueError(f"bptt_windows: rows and steps must be >= 1, found {rows} and {steps}")
    if len(stream) < 2:
        raise ValueError(f"bptt_windows: a stream of {len(stream)} symbols has nothing to "
                         f"predict; at least 2 are needed")
    n = len(stream) - 1
    length = -(-n // rows)
    x, y = np.full(rows * length, stream[-1]), np.full(rows * length, ignore)
    x[:n], y[:n] = stream[:-1], stream[1:]
    x, y = x.reshape(rows, length).T, y.reshape(rows, length).T
    return [(x[t:t + steps], y[t:t + steps]) for t in range(0, length, steps)]
