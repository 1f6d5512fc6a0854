"""EWT's raw text as one stream of symbols, cut into N rows and windows of T steps.

The text of a CoNLL-U file is its ``# text = ...`` comment lines, in file order;
the stream is a boundary symbol, then each sentence followed by one. A model
predicts each symbol from those before it, so the inputs are the stream but its
last symbol and the targets the stream but its first (``docs/design.md``,
"Unrolling": truncated BPTT). Row k of N holds the k-th N-th of the stream; the
last row is padded with targets the loss ignores.

>>> symbols = Symbols.build(["ab", "ba"])
>>> symbols.itos, symbols.encode("abc").tolist()
(['<unk>', '\\n', 'a', 'b'], [2, 3, 0])
>>> [(x.T.tolist(), y.T.tolist()) for x, y in windows(symbols.stream(["ab", "b"]), 2, 2)]
[([[1, 2], [1, 3]], [[2, 3], [3, 1]]), ([[3], [1]], [[1], [-1]])]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from unroll.core.errors import FileFormatError
from unroll.tools.conllu import read_lines

__all__ = ["BOUNDARY", "IGNORE", "UNK", "Symbols", "read_texts", "windows"]

UNK, BOUNDARY = "<unk>", "\n"
IGNORE = -1
_TEXT = b"# text = "


def read_texts(path) -> list[str]:
    """The ``# text =`` lines of a CoNLL-U file (CR, LF, CRLF; a BOM is skipped)."""
    lines, name = read_lines(path)
    texts = []
    for lineno, raw in enumerate(lines, start=1):
        body = raw.rstrip(b"\r\n").removeprefix(b"\xef\xbb\xbf" if lineno == 1 else b"")
        if body.startswith(_TEXT):
            try:
                texts.append(body[len(_TEXT):].decode("utf-8"))
            except UnicodeDecodeError as e:
                raise FileFormatError(Path(name), f"line {lineno}: not UTF-8 ({e.reason})"
                                      ) from None
    if not texts:
        raise FileFormatError(Path(name), "holds no '# text = ...' line")
    return texts


class Symbols:
    """The symbol table: <unk>, the boundary, then the training text's characters."""

    def __init__(self, itos):
        self.itos = list(itos)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        if self.itos[:2] != [UNK, BOUNDARY] or len(self.stoi) != len(self.itos):
            raise ValueError(f"symbols: expected [{UNK!r}, {BOUNDARY!r}, distinct characters"
                             f"...], found {self.itos[:4]!r}...")

    @classmethod
    def build(cls, texts) -> Symbols:
        return cls([UNK, BOUNDARY, *sorted(set().union(*map(set, texts)) - {BOUNDARY})])

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.stoi.get(c, 0) for c in text], np.int64)

    def stream(self, texts) -> np.ndarray:
        """The boundary, then each text followed by the boundary."""
        return self.encode(BOUNDARY + "".join(t + BOUNDARY for t in texts))


def windows(stream: np.ndarray, rows: int, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(inputs, targets) of every window, each (T, N) time-major; the last may be shorter."""
    length = -(-(len(stream) - 1) // rows)
    x = np.full(rows * length, stream[-1])
    y = np.full(rows * length, IGNORE)
    x[:len(stream) - 1], y[:len(stream) - 1] = stream[:-1], stream[1:]
    x, y = x.reshape(rows, length).T, y.reshape(rows, length).T
    return [(x[t:t + steps], y[t:t + steps]) for t in range(0, length, steps)]
