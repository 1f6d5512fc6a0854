"""CoNLL-U for lemmatization: each word's form, UPOS and LEMMA (column 3).

The tagger's reader (:func:`unroll.tools.conllu.read_conllu`) checks every
line (columns, IDs, FORM, UPOS; multiword-token ranges and empty nodes are not
words); a second pass here reads column 3 of each word line. :func:`fill_lemmas`
writes a file back with column 3 set, every other byte as it was.

>>> import io
>>> rows = [("1-2", "Don't", "_", "_"), ("1", "Do", "do", "AUX"), ("2", "n't", "not", "PART"),
...         ("3", "go", "go", "VERB"), ("3.1", "x", "_", "_")]
>>> text = "".join(f"{i}\\t{w}\\t{lem}\\t{u}\\t_\\t_\\t_\\t_\\t_\\t_\\n" for i, w, lem, u in rows)
>>> read_lemmas(io.BytesIO(text.encode()))
[(['Do', "n't", 'go'], ['AUX', 'PART', 'VERB'], ['do', 'not', 'go'])]
"""

from __future__ import annotations

import io

from unroll.tools.conllu import CoNLLUError, fill_column, read_conllu, read_lines

__all__ = ["fill_lemmas", "read_lemmas"]

_LEMMA = 2  # column 3


def _word(body: bytes, first: bool) -> tuple[bytes, list[bytes]] | None:
    """(BOM, columns) of a word line (10 columns, an integer ID), else None."""
    bom = b"\xef\xbb\xbf" if first and body.startswith(b"\xef\xbb\xbf") else b""
    cols = body[len(bom):].split(b"\t")
    return (bom, cols) if len(cols) == 10 and cols[0].isdigit() else None


def read_lemmas(source, labelled: bool = True) -> list[tuple[list, list, list]]:
    """The sentences of a CoNLL-U file (a path or a binary file) as (forms, upos, lemmas).

    ``labelled=False`` reads a file to lemmatize: column 3 may hold anything (its
    values are returned as found).
    """
    lines, name = read_lines(source)
    checked = io.BytesIO(b"".join(lines))
    checked.name = name  # the tagger's reader names the file in its errors
    sentences = list(read_conllu(checked, upos=True))
    lemmas, current = [], []
    for lineno, raw in enumerate(lines, start=1):
        body = raw.rstrip(b"\r\n")
        word = _word(body, lineno == 1)
        if word is None:
            if not body.strip() and current:
                lemmas.append(current)
                current = []
            continue
        lemma = word[1][_LEMMA].decode("utf-8")
        if labelled and not lemma:
            raise CoNLLUError(name, lineno, body.decode("utf-8"), "empty LEMMA (column 3)")
        current.append(lemma)
    if current:
        lemmas.append(current)
    return [(forms, upos, lem) for (forms, upos), lem in zip(sentences, lemmas)]


def fill_lemmas(source, lemmas, file) -> None:
    """Write ``source`` (a path or binary file) to ``file`` (a path or binary file), column 3
    of every word line set from ``lemmas`` (one list per sentence); every other byte kept.

    >>> text = b"\\xef\\xbb\\xbf# c\\r\\n1\\tHi\\t_\\tINTJ\\t_\\t_\\t0\\t_\\t_\\tx\\r\\n\\r\\n"
    >>> out = io.BytesIO()
    >>> fill_lemmas(io.BytesIO(text), [["hi"]], out)
    >>> out.getvalue()
    b'\\xef\\xbb\\xbf# c\\r\\n1\\tHi\\thi\\tINTJ\\t_\\t_\\t0\\t_\\t_\\tx\\r\\n\\r\\n'
    """
    fill_column(source, lemmas, _LEMMA, file)
