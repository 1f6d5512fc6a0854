"""Fuzzed CoNLL-U and model-folder bytes: only our own error types escape."""

import io

from hypothesis import given
from hypothesis import strategies as st

from examples.pos_tagging.features import Featurizer
from examples.pos_tagging.tagger import TaggerConfig
from unroll.core.errors import FileFormatError
from unroll.tools.conllu import UPOS_TAGS, CoNLLUError, fill_upos, read_conllu

FIELDS = [b"1", b"2", b"3", b"1-2", b"2-3", b"1.1", b"0", b"-1", b"x", b"_", b"", b"NOUN",
          b"PUNCT", b"nOUN", b"\xff", b"\xc3", b"\xef\xbb\xbf", b" ", b"# c", b"word"]
ENDS = [b"\n", b"\r\n", b"\r", b""]


@st.composite
def conllu_bytes(draw):
    """Lines that are mostly CoNLL-U shaped: 10 tab-separated fields, with mistakes."""
    lines = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            line = b""
        elif kind == 1:
            line = b"# " + draw(st.binary(max_size=6))
        else:
            n = draw(st.sampled_from([10, 10, 10, 9, 11]))
            line = b"\t".join(draw(st.sampled_from(FIELDS)) for _ in range(n))
        lines.append(line + draw(st.sampled_from(ENDS)))
    return b"".join(lines)


def check(data: bytes, tmp_path_factory, upos: bool):
    path = tmp_path_factory.mktemp("fuzz") / "f.conllu"
    path.write_bytes(data)
    try:
        sentences = list(read_conllu(path, upos=upos))
    except CoNLLUError as e:
        assert str(e).startswith(f"{path}:") and len(str(e)) < 1000
        return None
    for forms, tags in sentences:
        assert forms and len(forms) == len(tags)
        assert not upos or set(tags) <= set(UPOS_TAGS)
    return path, sentences


@given(conllu_bytes())
def test_fuzzed_conllu_raises_only_conllu_errors(tmp_path_factory, data):
    check(data, tmp_path_factory, upos=True)


@given(conllu_bytes() | st.binary(max_size=300))
def test_fuzzed_untagged_conllu_reads_and_writes_back_every_line(tmp_path_factory, data):
    read = check(data, tmp_path_factory, upos=False)
    if read is None:
        return
    path, sentences = read
    out = io.BytesIO()
    fill_upos(path, [["X"] * len(forms) for forms, _ in sentences], out)
    # every byte but column 4 of the word lines comes back: line ends (LF, CRLF, CR) and BOM
    given, written = data.splitlines(keepends=True), out.getvalue().splitlines(keepends=True)
    assert len(written) == len(given)
    for k, (line, back) in enumerate(zip(given, written)):
        cols = (line.removeprefix(b"\xef\xbb\xbf") if k == 0 else line).split(b"\t")
        if len(cols) == 10 and cols[0].isdigit():
            assert back == line.replace(b"\t".join(cols), b"\t".join(cols[:3] + [b"X"] + cols[4:]))
        else:
            assert back == line


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 300) | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["embed", "hidden", "chars", "features", "tokens", "counts", "word",
                         "feature_dims", "cell", "x"]), inner, max_size=4),
    max_leaves=12,
)


@given(JSONISH.map(lambda v: __import__("json").dumps(v).encode()) | st.binary(max_size=60))
def test_fuzzed_model_json_raises_only_file_format_errors(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("fuzz")
    for load, name in ((TaggerConfig.load, "config.json"), (Featurizer.load, "features.json")):
        (folder / name).write_bytes(data)
        try:
            load(folder / name)
        except FileFormatError as e:
            assert name in str(e)
