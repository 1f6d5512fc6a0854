"""CoNLL-U reading and writing in one place (unroll.tools.conllu): every file's line ends
(LF, CRLF, CR) and byte-order mark read, and written back as they came."""

import io
import os
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.hang import at_once
from unroll.core.errors import FileFormatError
from unroll.tools.conllu import (
    UPOS_TAGS,
    CoNLLUError,
    fill_column,
    fill_upos,
    read_conllu,
    read_texts,
    write_conllu,
)


def row(id_, form, upos="_", misc="_"):
    return "\t".join([id_, form, "_", upos, "_", "_", "_", "_", "_", misc])


GOOD = [
    "# newdoc id = d1",  # 1
    "# sent_id = 1",  # 2
    "# text = I don't know.",  # 3
    row("1", "I", "PRON"),  # 4
    row("2-3", "don't"),  # 5
    row("2", "do", "AUX"),  # 6
    row("3", "n't", "PART"),  # 7
    row("4", "know", "VERB", "SpaceAfter=No"),  # 8
    row("4.1", "knew"),  # 9  (empty node: no UPOS needed)
    row("5", ".", "PUNCT"),  # 10
    "",  # 11
    "# sent_id = 2",  # 12
    row("1", "Hi", "INTJ"),  # 13
]
EXPECTED = [
    (["I", "do", "n't", "know", "."], ["PRON", "AUX", "PART", "VERB", "PUNCT"]),
    (["Hi"], ["INTJ"]),
]


def write(tmp_path, lines, name="x.conllu", end="\n"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + end, encoding="utf-8")
    return path


@pytest.mark.parametrize("end", ["\n", "\n\n", "", "\n\n\n"])
def test_reads_words_skipping_comments_ranges_and_empty_nodes(tmp_path, end):
    assert list(read_conllu(write(tmp_path, GOOD, end=end))) == EXPECTED


def test_reads_str_path_open_file_and_crlf(tmp_path):
    path = write(tmp_path, GOOD)
    assert list(read_conllu(str(path))) == EXPECTED
    with open(path, encoding="utf-8") as f:
        assert list(read_conllu(f)) == EXPECTED
    crlf = tmp_path / "crlf.conllu"
    crlf.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    assert list(read_conllu(crlf)) == EXPECTED
    assert list(read_conllu(io.StringIO(""))) == []


def test_extra_blank_lines_between_sentences_are_fine(tmp_path):
    lines = GOOD[:11] + ["", ""] + GOOD[11:]
    assert list(read_conllu(write(tmp_path, lines))) == EXPECTED


BAD = [
    # (line number in GOOD, replacement, fragment of the message)
    (6, "2\tdo\t_\tAUX\t_\t_\t_\t_\t_", "expected 10 tab-separated columns, found 9"),
    (6, "2 do _ AUX _ _ _ _ _ _", "found 1"),
    (6, row("2", "do", "_"), "missing UPOS"),
    (6, row("2", "do", ""), "missing UPOS"),
    (7, row("3", "n't", "NEG"), "unknown UPOS tag 'NEG'"),
    (7, row("3", "n't", "part"), "unknown UPOS tag 'part'"),
    (4, row("x", "I", "PRON"), "invalid ID 'x'"),
    (4, row("1.5.2", "I", "PRON"), "invalid ID"),
    (4, row("3-2", "I", "PRON"), "invalid ID '3-2'"),
    (4, row("2", "I", "PRON"), "word ID 2 out of order: expected 1"),
    (6, row("3", "do", "AUX"), "word ID 3 out of order: expected 2"),
    (5, row("3-4", "don't"), "multiword range 3-4 out of order"),
    (5, row("2-7", "don't"), "multiword range ends at word 7 but the sentence has 5 words"),
    (6, row("2", "", "AUX"), "empty FORM"),
    (8, "# a comment in the middle", "comment line inside a sentence"),
]


@pytest.mark.parametrize("lineno, line, problem", BAD)
def test_malformed_lines_name_file_line_number_and_line(tmp_path, lineno, line, problem):
    lines = list(GOOD)
    lines[lineno - 1] = line
    path = write(tmp_path, lines, name="bad_file.conllu")
    with pytest.raises(CoNLLUError) as info:
        list(read_conllu(path))
    err = info.value
    assert err.lineno == lineno and err.line == line and err.filename == str(path)
    msg = str(err)
    assert f"bad_file.conllu:{lineno}:" in msg and problem in msg and repr(line) in msg


def test_error_in_a_later_sentence_comes_after_the_good_ones(tmp_path):
    lines = list(GOOD)
    lines[12] = row("1", "Hi", "HELLO")
    sentences = read_conllu(write(tmp_path, lines))
    assert next(sentences) == EXPECTED[0]
    with pytest.raises(CoNLLUError, match=r"x\.conllu:13: unknown UPOS tag 'HELLO'"):
        next(sentences)


def test_sentences_without_words_are_errors(tmp_path):
    only_comments = GOOD + ["", "# sent_id = 3", "# text = nothing"]
    with pytest.raises(CoNLLUError, match=r":15: comment lines with no sentence"):
        list(read_conllu(write(tmp_path, only_comments)))
    only_range = GOOD + ["", row("1-2", "gonna")]
    with pytest.raises(CoNLLUError, match=r":15: sentence starting at line 15 has no words"):
        list(read_conllu(write(tmp_path, only_range)))


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.conllu"
    path.write_bytes(("\n".join(GOOD[:6]) + "\n").encode() + b"3\tn\xe9\t_\tPART" + b"\t_" * 6)
    with pytest.raises(CoNLLUError, match=r"latin1\.conllu:7: not valid UTF-8"):
        list(read_conllu(path))


def test_stream_name_in_errors():
    with pytest.raises(CoNLLUError, match=r"<stream>:1: invalid ID"):
        list(read_conllu(io.StringIO(row("one", "a", "X") + "\n")))


def test_write_then_read_round_trip(tmp_path):
    sents = [f for f, _ in EXPECTED] + [["a b", "_", "#hash", "ünïcödé"]]
    tags = [t for _, t in EXPECTED] + [["X", "SYM", "SYM", "NOUN"]]
    path = tmp_path / "out.conllu"
    assert write_conllu(sents, tags, path) == 3
    assert list(read_conllu(path)) == list(zip(sents, tags))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[:2] == ["# sent_id = 1", "# text = I do n't know ."]
    assert all(len(x.split("\t")) == 10 for x in lines if x and not x.startswith("#"))
    buf = io.StringIO()
    write_conllu(sents, tags, buf)
    assert buf.getvalue() == path.read_text(encoding="utf-8")


forms_st = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\t\n\r"), min_size=1
)


@given(
    st.lists(
        st.lists(st.tuples(forms_st, st.sampled_from(UPOS_TAGS)), min_size=1, max_size=6),
        max_size=4,
    )
)
def test_round_trip_property(sentences):
    sents = [[f for f, _ in s] for s in sentences]
    tags = [[t for _, t in s] for s in sentences]
    buf = io.StringIO()
    write_conllu(sents, tags, buf)
    assert list(read_conllu(io.StringIO(buf.getvalue()))) == list(zip(sents, tags))


@pytest.mark.parametrize(
    "sents, tags, match",
    [
        ([["a"]], [["NOUN"], ["X"]], "1 sentences but 2 tag sequences"),
        ([["a", "b"]], [["NOUN"]], "sentence 0: 2 tokens but 1 tags"),
        ([["a"]], [["NOUNZ"]], "unknown UPOS tag 'NOUNZ'"),
        ([["a\tb"]], [["NOUN"]], "invalid FORM"),
        ([[""]], [["NOUN"]], "invalid FORM"),
        ([[]], [[]], "sentence 0 is empty"),
    ],
)
def test_writer_rejects_bad_input_without_writing(tmp_path, sents, tags, match):
    path = tmp_path / "never.conllu"
    with pytest.raises(ValueError, match=match):
        write_conllu(sents, tags, path)
    assert not path.exists()


def test_cr_only_line_endings_read_and_errors_stay_short(tmp_path):
    words = "".join(f"{i}\tw{i}\t_\tNOUN\t_\t_\t_\t_\t_\t_\r" for i in range(1, 2000))
    path = tmp_path / "mac.conllu"
    path.write_bytes((words + "\r").encode())
    [(forms, tags)] = read_conllu(path)
    assert len(forms) == len(tags) == 1999
    path.write_bytes((words + "2000\tw\t_\tNOUN" + "x" * 5000 + "\t_" * 6 + "\r\r").encode())
    with pytest.raises(CoNLLUError, match="mac.conllu:2000: unknown UPOS") as error:
        list(read_conllu(path))
    assert len(str(error.value)) < 500


# -- line ends and a byte-order mark come back as they came ---------------------------

BOM = b"\xef\xbb\xbf"


@st.composite
def files(draw):
    """(the bytes of a CoNLL-U file with GOOD's lines, each ended by LF, CRLF or CR as drawn,
    a BOM or none; its sentences' word counts)."""
    ends = draw(st.lists(st.sampled_from([b"\n", b"\r\n", b"\r"]), min_size=len(GOOD),
                         max_size=len(GOOD)))
    for k in range(1, len(GOOD)):  # CR, then an empty line's LF, would read as one CRLF
        if ends[k - 1] == b"\r" and not GOOD[k] and ends[k] == b"\n":
            ends[k] = b"\r"
    body = b"".join(line.encode() + end for line, end in zip(GOOD, ends))
    return (BOM if draw(st.booleans()) else b"") + body, [len(f) for f, _ in EXPECTED]


@given(files())
def test_any_line_ends_and_a_bom_are_read_from_a_path_and_a_binary_file(tmp_path_factory,
                                                                       file):
    data, _ = file
    path = tmp_path_factory.mktemp("conllu") / "in.conllu"
    path.write_bytes(data)
    assert list(read_conllu(path)) == EXPECTED
    assert list(read_conllu(io.BytesIO(data))) == EXPECTED  # as the lemmatizer passes it


@given(files())
def test_filling_a_column_writes_back_every_other_byte(tmp_path_factory, file):
    data, words = file
    folder = tmp_path_factory.mktemp("conllu")
    (folder / "in.conllu").write_bytes(data)
    fill_column(folder / "in.conllu", [["x"] * n for n in words], 2, folder / "out.conllu")
    back = (folder / "out.conllu").read_bytes()
    given_lines, back_lines = data.splitlines(keepends=True), back.splitlines(keepends=True)
    assert len(back_lines) == len(given_lines)
    for line, written in zip(given_lines, back_lines):
        cols = line.split(b"\t")
        if len(cols) == 10 and cols[0].removeprefix(BOM).isdigit():
            assert written == b"\t".join(cols[:2] + [b"x"] + cols[3:])
        else:
            assert written == line


@given(files())
def test_tag_conllu_keeps_line_ends_and_bom_through_a_text_stream(tmp_path_factory, file):
    data, words = file
    path = tmp_path_factory.mktemp("conllu") / "in.conllu"
    path.write_bytes(data)
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # what `tag` writes through
    fill_upos(path, [["X"] * n for n in words], out)
    out.flush()
    back = out.buffer.getvalue()
    assert back.startswith(BOM) == data.startswith(BOM)
    assert [line[len(line.rstrip(b"\r\n")):] for line in back.splitlines(keepends=True)] == [
        line[len(line.rstrip(b"\r\n")):] for line in data.splitlines(keepends=True)]
    assert back.count(b"\tX\t") == sum(words)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_given_as_a_path_is_refused_at_once(device, tmp_path):
    """/dev/zero would never end, and a link to it no sooner: neither is read at all."""
    link = tmp_path / "link.conllu"
    link.symlink_to(device)
    for path in (device, link):
        with pytest.raises(FileFormatError, match="is a device; expected a CoNLL-U file"):
            at_once(lambda p: list(read_conllu(p)), path)


def test_a_fifo_is_read_as_a_redirect_would(tmp_path):
    fifo = tmp_path / "in.conllu"
    os.mkfifo(fifo)
    text = b"1\tHi\t_\tINTJ\t_\t_\t0\t_\t_\t_\r\n\r\n"
    writer = threading.Thread(target=fifo.write_bytes, args=(text,), daemon=True)
    writer.start()
    assert at_once(lambda p: list(read_conllu(p)), fifo) == [(["Hi"], ["INTJ"])]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_read_texts_takes_the_text_comments_with_any_line_end_and_a_bom(tmp_path, end):
    words = b"1\tHi\t_\tINTJ\t_\t_\t0\t_\t_\t_"
    lines = [b"\xef\xbb\xbf# text = Hi there", b"# sent_id = 1", words, b"",
             "# text = Ça va".encode(), words, b""]
    path = tmp_path / "x.conllu"
    path.write_bytes(end.join(lines))
    assert read_texts(path) == ["Hi there", "Ça va"]


def test_read_texts_refuses_a_file_without_text_and_bad_utf8(tmp_path):
    path = tmp_path / "x.conllu"
    path.write_bytes(b"1\tHi\t_\tINTJ\t_\t_\t0\t_\t_\t_\n\n")
    with pytest.raises(FileFormatError, match="x.conllu: holds no '# text"):
        read_texts(path)
    path.write_bytes(b"# text = ok\n# text = \xff\n")
    with pytest.raises(FileFormatError, match="line 2: not UTF-8"):
        read_texts(path)
