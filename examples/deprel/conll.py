"""CoNLL-U for dependency relation labelling: words, UPOS, gold heads and DEPRELs, as trees.

The tagger's reader (:func:`unroll.tools.conllu.read_conllu`) checks
every line (columns, IDs, FORM, UPOS; multiword-token ranges and empty nodes
are not words); a second pass here reads columns 7 and 8 of each word line
and makes each sentence a :class:`~unroll.frontend.tree.Tree`. A head that is not a
word of its sentence, several roots or none, or a cycle is a
:class:`~unroll.tools.conllu.CoNLLUError` naming the file and line.

>>> import io
>>> rows = [("1-2", "Don't", "_", "_", "_"), ("1", "Do", "AUX", "3", "aux"),
...         ("2", "n't", "PART", "3", "advmod"), ("3", "go", "VERB", "0", "root"),
...         ("3.1", "x", "_", "_", "_")]
>>> text = "".join(f"{i}\\t{w}\\t_\\t{u}\\t_\\t_\\t{h}\\t{d}\\t_\\t_\\n" for i, w, u, h, d in rows)
>>> [(s.forms, s.heads, s.deprels) for s in read_deprel(io.BytesIO(text.encode()))]
[(['Do', "n't", 'go'], [3, 3, 0], ['aux', 'advmod', 'root'])]
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from unroll.core.errors import TreeError
from unroll.frontend.tree import Tree
from unroll.tools.conllu import CoNLLUError, fill_column, parse_head, read_conllu, read_lines

__all__ = ["Sentence", "fill_deprel", "read_deprel"]


@dataclass
class Sentence:
    """One sentence: its words, UPOS, heads (1-based, 0 = root), DEPRELs and tree."""

    forms: list
    upos: list
    heads: list
    deprels: list
    tree: Tree = field(repr=False)


def _word_lines(lines: list[bytes]):
    """(line number, columns) of every word line (an integer ID), and None at each sentence
    end; the tagger's reader has checked the layout."""
    for lineno, raw in enumerate(lines, start=1):
        line = raw.decode("utf-8").rstrip("\r\n")
        if lineno == 1:
            line = line.removeprefix("\ufeff")
        if not line.strip():
            yield lineno, None
            continue
        cols = line.split("\t")
        if not line.startswith("#") and cols[0].isdigit():
            yield lineno, cols
    yield len(lines) + 1, None


def read_deprel(source, labelled: bool = True) -> list[Sentence]:
    """The sentences of a CoNLL-U file (a path or a binary file) with their gold trees.

    ``labelled=False`` reads files to label: column 8 may hold anything.
    """
    lines, name = read_lines(source)
    checked = io.BytesIO(b"".join(lines))
    checked.name = name  # the tagger's reader names the file in its errors
    sentences = list(read_conllu(checked, upos=True))
    out, words, k = [], [], 0
    for lineno, cols in _word_lines(lines):
        if cols is not None:
            words.append((lineno, cols))
            continue
        if not words:
            continue
        forms, upos = sentences[k]
        heads, deprels = [], []
        for wl, c in words:
            line = "\t".join(c)
            try:
                head = parse_head(c[6])
            except ValueError as e:
                raise CoNLLUError(name, wl, line, str(e)) from None
            if not 0 <= head <= len(words):
                raise CoNLLUError(name, wl, line, f"HEAD {head} is not a word of the sentence "
                                                  f"(words 1..{len(words)}, 0 for the root)")
            if labelled and c[7] in ("", "_"):
                raise CoNLLUError(name, wl, line, "missing DEPREL (column 8 is '_')")
            heads.append(head)
            deprels.append(c[7])
        first, line0 = words[0][0], "\t".join(words[0][1])
        try:
            tree = Tree.from_heads(heads, where=f"sentence at line {first}")
        except TreeError as e:
            raise CoNLLUError(name, first, line0, f"not a tree: {e}") from None
        out.append(Sentence(forms, upos, heads, deprels, tree))
        words, k = [], k + 1
    return out


def fill_deprel(source, labels, file) -> None:
    """Write ``source`` (a path or binary file) to ``file`` (a path or binary file), column 8
    of every word line set from ``labels`` (one list per sentence); every other byte kept.

    >>> import io
    >>> text = b"# c\\r\\n1\\tHi\\t_\\tINTJ\\t_\\t_\\t0\\t_\\t_\\tx\\r\\n\\r\\n"
    >>> out = io.BytesIO()
    >>> fill_deprel(io.BytesIO(text), [["root"]], out)
    >>> out.getvalue()
    b'# c\\r\\n1\\tHi\\t_\\tINTJ\\t_\\t_\\t0\\troot\\t_\\tx\\r\\n\\r\\n'
    """
    fill_column(source, labels, 7, file)
