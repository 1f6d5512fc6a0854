"""EWT's text as one stream of symbols, cut into N rows and windows of T steps.

The text of a CoNLL-U file is its ``# text = ...`` lines; the stream is a boundary,
then each sentence followed by one. The inputs are the stream but its last symbol,
the targets (what each step predicts) the stream but its first; row k of N holds the
k-th N-th of them, the last padded with targets the loss ignores.

>>> stream = Symbols.build(["ab", "b"]).stream(["ab", "b"])   # <unk> 0, boundary 1, a 2, b 3
>>> [(x.T.tolist(), y.T.tolist()) for x, y in windows(stream, rows=2, steps=2)]
[([[1, 2], [1, 3]], [[2, 3], [3, 1]]), ([[3], [1]], [[1], [-1]])]
"""

from __future__ import annotations

import numpy as np

from unroll.core.errors import FileFormatError
from unroll.tools.conllu import read_lines

UNK, BOUNDARY, IGNORE = "<unk>", "\n", -1


def read_texts(path) -> list[str]:
    """The ``# text =`` lines of a CoNLL-U file (CR, LF or CRLF; a BOM is skipped)."""
    lines, name = read_lines(path)
    lines[:1] = [line.removeprefix(b"\xef\xbb\xbf") for line in lines[:1]]
    texts = []
    for k, line in enumerate(lines, 1):
        if line.startswith(b"# text = "):
            try:
                texts.append(line.rstrip(b"\r\n")[9:].decode("utf-8"))
            except UnicodeDecodeError:
                raise FileFormatError(name, f"line {k}: not UTF-8") from None
    if not texts:
        raise FileFormatError(name, "holds no '# text = ...' line")
    return texts


class Symbols:
    """The symbol table: <unk>, the boundary, then the training text's characters."""

    def __init__(self, itos):
        self.itos, self.stoi = list(itos), {s: i for i, s in enumerate(itos)}

    @classmethod
    def build(cls, texts) -> Symbols:
        return cls([UNK, BOUNDARY, *sorted(set().union(*map(set, texts)) - {BOUNDARY})])

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.stoi.get(c, 0) for c in text], np.int64)

    def stream(self, texts) -> np.ndarray:
        return self.encode(BOUNDARY + "".join(t + BOUNDARY for t in texts))


def windows(stream: np.ndarray, rows: int, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(inputs, targets) of every window, each (T, N) time-major; the last may be shorter."""
    length, n = -(-(len(stream) - 1) // rows), len(stream) - 1
    x, y = np.full(rows * length, stream[-1]), np.full(rows * length, IGNORE)
    x[:n], y[:n] = stream[:-1], stream[1:]
    x, y = x.reshape(rows, length).T, y.reshape(rows, length).T
    return [(x[t:t + steps], y[t:t + steps]) for t in range(0, length, steps)]
