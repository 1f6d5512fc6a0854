"""Read and write CoNLL-U: word forms and UPOS tags, and any column filled in place.

>>> import io
>>> rows = [["1", "I", "PRON"], ["2", "am", "AUX"], ["3", ".", "PUNCT"]]
>>> text = "".join(f"{i}\\t{w}\\t_\\t{t}" + "\\t_" * 6 + "\\n" for i, w, t in rows) + "\\n"
>>> list(read_conllu(io.StringIO(text)))
[(['I', 'am', '.'], ['PRON', 'AUX', 'PUNCT'])]

The reader makes one pass over the lines and checks every line it uses, so that
a corrupt file stops with a :class:`CoNLLUError` naming the file, the 1-based
line number and the line itself. ID syntax is parsed by the ``conllu`` library
(``conllu.parser.parse_id_value``); columns are split on tabs only (``conllu``'s
own line parser also splits on runs of two spaces, which would cut a FORM that
contains them, and its exceptions carry no line numbers).
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from conllu.parser import ParseException, parse_id_value

from unroll.core.errors import FileFormatError
from unroll.tools.output import write_output

__all__ = ["UPOS_TAGS", "CoNLLUError", "fill_column", "fill_upos", "parse_head", "read_conllu",
           "read_lines", "read_texts", "write_conllu"]

#: The 17 universal POS tags, in the order of the UD guidelines; a tag's index
#: here is its label id.
UPOS_TAGS = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM",
    "PART", "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X",
)  # fmt: skip
_UPOS = frozenset(UPOS_TAGS)
_NCOLS = 10
#: a HEAD as UD's validator takes it: 0, or a word number in plain ASCII digits
_HEAD = re.compile(r"0|[1-9][0-9]*")
#: the most a CoNLL-U file given by path may hold (EWT's train split is 14 MB)
_MAX_INPUT_BYTES = 1 << 30


class CoNLLUError(ValueError):
    """A CoNLL-U file that cannot be read: names the file, 1-based line number and line.

    ``filename``, ``lineno`` and ``line`` are kept as attributes.
    """

    def __init__(self, filename: str, lineno: int, line: str, problem: str):
        self.filename, self.lineno, self.line, self.problem = filename, lineno, line, problem
        shown = _shown(line, 200)
        super().__init__(f"{filename}:{lineno}: {problem}\n    line {lineno}: {shown}")


def _shown(text: str, limit: int = 40) -> str:
    """``repr(text)``, cut at ``limit`` characters: an error names a value, not a whole file."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"




def read_conllu(source, upos: bool = True) -> Iterator[tuple[list[str], list[str]]]:
    """Yield each sentence of a CoNLL-U file as ``(forms, upos)``, two lists of strings.

    ``source`` is a path or an open file (text, or binary holding UTF-8).
    Comment lines, multiword-token ranges (ID ``3-4``) and empty nodes (ID
    ``5.1``) are skipped: the sentence is its syntactic words. Raises
    :class:`CoNLLUError` for a line that is not valid for tagging: not 10
    tab-separated columns, a bad or out-of-order ID,
    an empty FORM, a missing UPOS (``_``) or one outside the 17 UD tags, a
    comment inside a sentence, a range reaching past the sentence, a sentence
    with no words, or text that is not UTF-8. With ``upos=False`` column 4 is
    not checked (input to tag: ``_`` or any tag, returned as found). Lines may
    end in LF, CRLF or CR.

    >>> sents = read_conllu("en_ewt-ud-dev.conllu")  # doctest: +SKIP
    """
    if isinstance(source, io.TextIOBase):  # decoded as it is read: an error names its line
        yield from _read(source, str(getattr(source, "name", "<stream>")), upos)
    else:
        yield from _read(*read_lines(source), upos)


def _read(f, name: str, check_upos: bool) -> Iterator[tuple[list[str], list[str]]]:
    forms: list[str] = []
    upos: list[str] = []
    started = False  # a token line (word, range or empty node) has been seen in this block
    block_start = 0  # line number of the block's first line
    range_end = (0, 0, "")  # (largest range end, its line number, its line)
    lineno = 0
    lines = iter(f)
    while True:
        try:
            raw = next(lines)
        except StopIteration:
            break
        except UnicodeDecodeError as e:  # from a text stream the caller opened: near here
            problem = f"not valid UTF-8 (here or soon after): {e}"
            raise CoNLLUError(name, lineno + 1, "?", problem) from None
        lineno += 1
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                shown = raw.decode("utf-8", "backslashreplace").rstrip("\r\n")
                raise CoNLLUError(
                    name, lineno, shown, f"not valid UTF-8 ({e.reason} at byte {e.start})"
                ) from None
            if lineno == 1:
                raw = raw.removeprefix("\ufeff")  # a byte-order mark
        line = raw.rstrip("\r\n")

        if not line.strip():  # a blank line ends the sentence
            if block_start:
                yield _finish(name, forms, upos, started, range_end, block_start, lineno, line)
            forms, upos, started, block_start, range_end = [], [], False, 0, (0, 0, "")
            continue
        if not block_start:
            block_start = lineno
        if line.startswith("#"):
            if started:
                raise CoNLLUError(name, lineno, line, "comment line inside a sentence")
            continue

        started = True
        cols = line.split("\t")
        if len(cols) != _NCOLS:
            raise CoNLLUError(
                name, lineno, line, f"expected {_NCOLS} tab-separated columns, found {len(cols)}"
            )
        try:
            tid = parse_id_value(cols[0])
        except ParseException:
            tid = None
        if tid is None:
            raise CoNLLUError(name, lineno, line, f"invalid ID {_shown(cols[0])}")
        expected = len(forms) + 1
        if isinstance(tid, tuple):
            if tid[1] == "-":  # multiword token: its words follow on their own lines
                if tid[0] != expected:
                    raise CoNLLUError(
                        name, lineno, line,
                        f"multiword range {cols[0]} out of order: expected a start at {expected}",
                    )  # fmt: skip
                if tid[2] > range_end[0]:
                    range_end = (tid[2], lineno, line)
            continue  # an empty node ("5.1") is not a word
        if tid != expected:
            problem = f"word ID {tid} out of order: expected {expected}"
            raise CoNLLUError(name, lineno, line, problem)
        if cols[1] == "":
            raise CoNLLUError(name, lineno, line, "empty FORM")
        tag = cols[3]
        if check_upos and tag not in _UPOS:
            problem = (
                "missing UPOS (column 4 is '_')"
                if tag in ("_", "")
                else f"unknown UPOS tag {_shown(tag)} (not one of the 17 UD tags)"
            )
            raise CoNLLUError(name, lineno, line, problem)
        forms.append(cols[1])
        upos.append(tag)

    if block_start:  # last sentence without a closing blank line
        yield _finish(name, forms, upos, started, range_end, block_start, lineno, line)


def _finish(name, forms, upos, started, range_end, block_start, lineno, line):
    if not started:
        raise CoNLLUError(name, block_start, line, "comment lines with no sentence after them")
    if not forms:
        problem = f"sentence starting at line {block_start} has no words"
        raise CoNLLUError(name, lineno, line, problem)
    if range_end[0] > len(forms):
        raise CoNLLUError(
            name, range_end[1], range_end[2],
            f"multiword range ends at word {range_end[0]} but the sentence has {len(forms)} words",
        )  # fmt: skip
    return forms, upos


def parse_head(text: str) -> int:
    """The HEAD of a word (column 7): its head's word number, 0 for the root.

    Only plain ASCII digits are a HEAD, as only they are an ID: Python's ``int``
    would also take ``"0_1"``, a fullwidth digit or one padded with spaces, which
    no CoNLL-U tool writes. Anything else is a ValueError saying what was found.

    >>> parse_head("12"), parse_head("0")
    (12, 0)
    >>> parse_head(" 1")
    Traceback (most recent call last):
    ValueError: HEAD (column 7) must be a word number or 0, found ' 1'
    """
    if not _HEAD.fullmatch(text):
        raise ValueError(f"HEAD (column 7) must be a word number or 0, found {_shown(text)}")
    return int(text)


def fill_upos(source, tags: Iterable[Sequence[str]], file) -> None:
    """Write every line of the CoNLL-U ``source`` to ``file``, column 4 of each word set.

    Comments, multiword-token lines, empty nodes, every other column, the line
    ends (LF, CRLF or CR) and a byte-order mark are written back as they are;
    ``tags`` gives one UPOS per word of each sentence, in the order
    :func:`read_conllu` yields them. ``source`` must have been read by
    :func:`read_conllu` first (this pass trusts its layout); ``file`` is as
    :func:`fill_column` takes it.

    >>> import io
    >>> words = [f"{i}\\t{w}\\t{w.lower()}\\t_\\t_\\t_\\t0\\troot\\t_\\t_\\n"
    ...          for i, w in [(1, "Hi"), (2, "!")]]
    >>> text = "# text = Hi !\\n1-2\\tHi!" + "\\t_" * 8 + "\\n" + "".join(words)
    >>> out = io.StringIO()
    >>> fill_upos(io.StringIO(text + "\\n"), [["INTJ", "PUNCT"]], out)
    >>> print(out.getvalue().replace("\\t", " "), end="")
    # text = Hi !
    1-2 Hi! _ _ _ _ _ _ _ _
    1 Hi hi INTJ _ _ 0 root _ _
    2 ! ! PUNCT _ _ 0 root _ _
    <BLANKLINE>
    """
    fill_column(source, tags, 3, file)


def write_conllu(
    sentences_tokens: Iterable[Sequence[str]], tags: Iterable[Sequence[str]], file
) -> int:
    """Write sentences with their UPOS tags as CoNLL-U; return the number of sentences.

    ``file`` is a path or an open text file. Each sentence gets ``# sent_id``
    and ``# text`` comments (text = forms joined by spaces, consistent with an
    empty MISC column), then one 10-column line per word: ID, FORM, UPOS; every
    other column ``_``. Everything is checked before anything is written, so a
    bad tag or form raises ``ValueError`` and leaves no half-written file.

    >>> import io
    >>> out = io.StringIO()
    >>> write_conllu([["Hi", "!"]], [["INTJ", "PUNCT"]], out)
    1
    >>> print(out.getvalue().replace("\\t", " "), end="")
    # sent_id = 1
    # text = Hi !
    1 Hi _ INTJ _ _ _ _ _ _
    2 ! _ PUNCT _ _ _ _ _ _
    <BLANKLINE>
    """
    buf = io.StringIO()
    sents, tagss = list(sentences_tokens), list(tags)
    if len(sents) != len(tagss):
        raise ValueError(f"{len(sents)} sentences but {len(tagss)} tag sequences")
    for k, (forms, upos) in enumerate(zip(sents, tagss)):
        if len(forms) != len(upos):
            raise ValueError(f"sentence {k}: {len(forms)} tokens but {len(upos)} tags")
        if not forms:
            raise ValueError(f"sentence {k} is empty")
        buf.write(f"# sent_id = {k + 1}\n# text = {' '.join(forms)}\n")
        for i, (form, tag) in enumerate(zip(forms, upos), start=1):
            if not form or any(c in form for c in "\t\n\r"):
                raise ValueError(f"sentence {k}, token {i}: invalid FORM {form!r}")
            if tag not in _UPOS:
                raise ValueError(f"sentence {k}, token {i}: unknown UPOS tag {tag!r}")
            buf.write(f"{i}\t{form}\t_\t{tag}\t_\t_\t_\t_\t_\t_\n")
        buf.write("\n")
    _write(file, buf.getvalue().encode("utf-8"))
    return len(sents)


def _write(file, data: bytes) -> None:
    """Write ``data`` (all at once: checked before) to a path (``-o``: see
    :func:`unroll.tools.output.write_output`; "-" is standard output) or an open file,
    binary or text."""
    if isinstance(file, (str, os.PathLike)):
        write_output(data, file)
    elif isinstance(file, io.TextIOBase) and hasattr(file, "buffer"):
        file.flush()  # the bytes as they are: no newline translation
        file.buffer.write(data)
    elif isinstance(file, io.TextIOBase):
        file.write(data.decode("utf-8"))
    else:
        file.write(data)


def read_lines(source) -> tuple[list[bytes], str]:
    """The lines of a CoNLL-U file (a path or a file, binary or text), ends kept, and its
    name for errors. A line ends at LF, CRLF or CR alike (``bytes.splitlines``; iterating
    a binary file would not split CR-only text at all).

    >>> read_lines(io.BytesIO(b"\\xef\\xbb\\xbf# a\\r1\\r\\n\\n"))[0]
    [b'\\xef\\xbb\\xbf# a\\r', b'1\\r\\n', b'\\n']
    """
    if isinstance(source, (str, os.PathLike)):
        return _read_input(Path(source)).splitlines(keepends=True), os.fspath(source)
    data = source.read()
    data = data.encode("utf-8") if isinstance(data, str) else data
    return data.splitlines(keepends=True), str(getattr(source, "name", "<stream>"))


def read_texts(source) -> list[str]:
    """The sentences' text of a CoNLL-U file (a path or a file): its ``# text = ...``
    comments, in order, as :func:`read_lines` reads lines (LF, CRLF or CR; a BOM skipped).
    A file without one, or text that is not UTF-8, is a FileFormatError naming the line.

    >>> read_texts(io.BytesIO(b"\\xef\\xbb\\xbf# text = Hi\\r\\n# sent_id = 1\\r\\n# text = Yo\\r"))
    ['Hi', 'Yo']
    """
    lines, name = read_lines(source)
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


def _read_input(path: Path) -> bytes:
    """The bytes of the input file ``path``: a regular file, or a FIFO read as the shell's
    ``<`` would; a device (/dev/zero would never end) is refused at once, and so is more
    than 1 GiB.

    >>> _read_input(Path("/dev/zero"))
    Traceback (most recent call last):
    unroll.core.errors.FileFormatError: /dev/zero: is a device; expected a CoNLL-U file
    """
    if path.is_char_device() or path.is_block_device():
        raise FileFormatError(path, "is a device; expected a CoNLL-U file")
    with path.open("rb") as f:
        data = f.read(_MAX_INPUT_BYTES + 1)
    if len(data) > _MAX_INPUT_BYTES:
        raise FileFormatError(path, f"holds more than {_MAX_INPUT_BYTES} bytes")
    return data


def fill_column(source, values, column: int, file) -> None:
    """Write ``source`` to ``file`` (each a path or a binary file) with column ``column``
    (0-based) of every word line (10 columns, an integer ID) set from ``values``, one list
    per sentence; every other byte (a BOM, comments, multiword and empty-node lines, line
    ends) kept. ``file`` may also be an open text file; a path is written as
    :func:`unroll.tools.output.write_output` writes ``-o`` ("-": standard output).

    >>> import io
    >>> out = io.BytesIO()
    >>> line = b"1\\tHi\\t_\\tINTJ\\t_\\t_\\t0\\t_\\t_\\tx\\r\\n"
    >>> fill_column(io.BytesIO(b"# c\\r\\n" + line), [["hi"]], 2, out)
    >>> out.getvalue()
    b'# c\\r\\n1\\tHi\\thi\\tINTJ\\t_\\t_\\t0\\t_\\t_\\tx\\r\\n'
    """
    lines, _ = read_lines(source)
    sentences, current, out = iter(values), iter(()), []
    for k, raw in enumerate(lines):
        body = raw.rstrip(b"\r\n")
        bom = b"\xef\xbb\xbf" if k == 0 and body.startswith(b"\xef\xbb\xbf") else b""
        cols = body[len(bom):].split(b"\t")
        if len(cols) == 10 and cols[0].isdigit():
            if cols[0] == b"1":
                current = iter(next(sentences))
            cols[column] = next(current).encode("utf-8")
            raw = bom + b"\t".join(cols) + raw[len(body):]
        out.append(raw)
    _write(file, b"".join(out))
