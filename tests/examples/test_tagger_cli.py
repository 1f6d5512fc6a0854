"""`python -m examples.pos_tagging`: one-line errors and exit codes, and tag --conllu."""

import errno
import os

import pytest

from examples.pos_tagging.__main__ import main
from examples.pos_tagging.features import Featurizer
from examples.pos_tagging.tagger import Tagger, TaggerConfig
from tests.cli_helpers import one_line_error
from unroll.tools.conllu import UPOS_TAGS

pytestmark = pytest.mark.slow



@pytest.fixture
def model_dir(tmp_path, tiny):
    """A folder with an untrained tiny tagger saved as best and last."""
    path = tmp_path / "m"
    tagger = Tagger(Featurizer.build([["I", "saw", "her", "duck", "."]]), TaggerConfig(**tiny))
    for name in ("best", "last"):
        tagger.save(path, name)
    return path


def test_tag_conllu_fills_column_4_and_keeps_every_other_line(model_dir, tmp_path, capsys):
    lines = [
        "# newdoc id = d1", "# sent_id = s1", "# text = I saw her duck.",
        "1\tI\tI\t_\tPRP\t_\t2\tnsubj\t_\t_",
        "2\tsaw\tsee\t_\tVBD\tTense=Past\t0\troot\t_\t_",
        "3\ther\ther\tX\t_\t_\t4\tnmod:poss\t_\t_",  # a tag already there is replaced
        "4-5\tduck.\t_\t_\t_\t_\t_\t_\t_\t_",
        "4\tduck\tduck\t_\t_\t_\t2\tobj\t_\tSpaceAfter=No",
        "4.1\tducked\tduck\t_\t_\t_\t_\t_\t2:ref\t_",
        "5\t.\t.\t_\t_\t_\t2\tpunct\t_\t_",
        "",
    ]
    source = tmp_path / "in.conllu"
    source.write_text("\n".join(lines) + "\n")
    assert main(["tag", "--model-dir", str(model_dir), "--conllu", str(source)]) == 0
    out = capsys.readouterr().out.split("\n")
    assert len(out) == len(lines) + 1 and out[-1] == ""
    for given, written in zip(lines, out):
        cols = given.split("\t")
        if len(cols) == 10 and cols[0].isdigit():  # a word: only column 4 changes
            filled = written.split("\t")
            assert filled[3] in UPOS_TAGS
            assert filled[:3] + filled[4:] == cols[:3] + cols[4:]
        else:
            assert written == given


@pytest.mark.parametrize("argv, status, parts", [
    (["evaluate", "{data}"], 2, ["is a folder; expected a CoNLL-U file"]),
    (["evaluate", "{empty}"], 2, ["empty.conllu: holds no sentences"]),
    (["evaluate", "{cr}"], 2, ["only-cr.conllu:2:"]),
    (["evaluate", "{dev}", "--model-dir", "{model_file}"], 2, ["no such folder"]),
    (["tag", "{latin1}"], 2, ["latin1.txt: not UTF-8"]),
    (["train", "--data", "{data}", "--model-dir", "{model_file}"], 2,
     ["is a file; expected a folder"]),
    (["train", "--data", "{data}", "--model-dir", "{model_file}/sub"], 2,
     ["is a file, not a folder"]),
    (["train", "--data", "{tmp}", "--model-dir", "{tmp}/new"], 2, ["UD_English-EWT"]),
    (["train", "--data", "{data}", "--model-dir", "{tmp}/n", "--hidden", "0"], 2,
     ["hidden must be an integer >= 1, found 0"]),
    (["train", "--data", "{data}", "--model-dir", "{tmp}/n", "--cell", "nocell"], 2,
     ["--cell nocell: neither a built-in step template"]),
])
def test_errors_are_one_line_naming_the_file(argv, status, parts, corpus, tmp_path, capsys):
    (tmp_path / "empty.conllu").write_text("")
    (tmp_path / "only-cr.conllu").write_bytes(b"# sent_id = 1\r1\tword\r\r")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "file").write_text("not a folder")
    names = {"data": corpus, "empty": tmp_path / "empty.conllu", "tmp": tmp_path,
             "cr": tmp_path / "only-cr.conllu", "latin1": tmp_path / "latin1.txt",
             "dev": corpus / "en_ewt-ud-dev.conllu", "model_file": tmp_path / "file"}
    argv = [a.format(**names) for a in argv]
    if argv[0] != "train" and "--model-dir" not in argv:
        argv += ["--model-dir", str(tmp_path / "file")]
    assert main(argv) == status
    one_line_error(capsys, *parts)


def test_damaged_folder_files_are_one_line_errors(model_dir, tmp_path, capsys):
    text = tmp_path / "s.txt"
    text.write_text("I saw her\n")
    for name, content, part in [
        ("best.caffemodel", b"\x0a\xff\xff", "best.caffemodel: not a .caffemodel"),
        ("features.json", b"", "features.json: not valid JSON"),
        ("config.json", b"[]", "config.json: expected an object"),
    ]:
        good = (model_dir / name).read_bytes()
        (model_dir / name).write_bytes(content)
        assert main(["tag", "--model-dir", str(model_dir), str(text)]) == 2
        one_line_error(capsys, part)
        (model_dir / name).write_bytes(good)
    assert main(["tag", "--model-dir", str(model_dir), str(text)]) == 0


def test_debug_shows_the_traceback(tmp_path):
    from unroll.core.errors import FileFormatError

    (tmp_path / "empty.conllu").write_text("")
    with pytest.raises(FileFormatError, match="holds no sentences"):
        main(["evaluate", str(tmp_path / "empty.conllu"), "--debug"])


def test_a_log_holding_nothing_is_refused_by_resume(corpus, tmp_path, capsys, tiny_args):
    model_dir = tmp_path / "m"
    (model_dir).mkdir()
    (model_dir / "log.json").write_text("[]")
    argv = ["train", "--data", str(corpus), "--model-dir", str(model_dir), "--epochs", "1",
            "--quiet", "--resume", *tiny_args]
    assert main(argv) == 2
    one_line_error(capsys, "--resume:", "config.json is missing", "--overwrite")
    assert sorted(p.name for p in model_dir.iterdir()) == ["log.json", "train.lock"]
    (model_dir / "log.json").write_text('[{"epoch": 1}]')
    assert main(argv) == 2
    one_line_error(capsys, "--resume:", "--overwrite")


def test_a_full_disk_fails_at_once_with_status_1(corpus, tmp_path, capsys, monkeypatch,
                                                 tiny_args):
    real_write = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    argv = ["train", "--data", str(corpus), "--model-dir", str(tmp_path / "m"), "--quiet",
            *tiny_args]
    assert main(argv) == 1
    monkeypatch.setattr(os, "write", real_write)
    one_line_error(capsys, "No space left on device", str(tmp_path / "m"))  # names the folder
    assert not (tmp_path / "m" / "config.json").exists()


def test_divergence_exits_1_with_one_line(corpus, tmp_path, capsys, tiny_args):
    argv = ["train", "--data", str(corpus), "--model-dir", str(tmp_path / "m"), "--quiet",
            "--lr", "1e38", *tiny_args]
    assert main(argv) == 1
    one_line_error(capsys, "training diverged", "--overwrite")  # no epoch to resume from


def test_resume_and_overwrite_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train", "--resume", "--overwrite"])
    assert stop.value.code == 2
