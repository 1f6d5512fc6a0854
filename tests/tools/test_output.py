"""``-o OUT`` (unroll.tools.output.write_output, design: 8. Trust): through a device, a
symlink's file or a FIFO as the shell's ``> OUT`` would; a regular file replaced atomically."""

import errno
import os
import stat
import threading

import pytest

from tests.hang import at_once, limit
from unroll.tools.output import write_output

DATA = b"1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\r\n\r\n"


def test_a_device_node_is_written_through_and_stays_a_device():
    at_once(write_output, DATA, os.devnull)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_a_symlink_has_its_file_written_and_stays_a_link(tmp_path):
    target = tmp_path / "mine.conllu"
    target.write_bytes(b"old\n")
    link = tmp_path / "out.conllu"
    link.symlink_to(target.name)
    write_output(DATA, link)
    assert link.is_symlink() and os.readlink(link) == target.name
    assert target.read_bytes() == DATA


def test_a_link_to_nothing_yet_creates_its_file(tmp_path):
    link = tmp_path / "out.conllu"
    link.symlink_to("made.conllu")
    write_output(DATA, link)
    assert link.is_symlink() and (tmp_path / "made.conllu").read_bytes() == DATA


def test_a_fifo_is_written_through_to_its_reader(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got = []

    def read():
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    at_once(write_output, DATA, fifo)
    reader.join(limit(10))
    assert got == [DATA] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_regular_file_is_replaced_atomically(tmp_path):
    out = tmp_path / "out.conllu"
    out.write_bytes(b"old\n")
    before = os.stat(out).st_ino
    write_output(DATA, out)
    assert out.read_bytes() == DATA
    assert os.stat(out).st_ino != before  # a new file renamed over the old, not rewritten
    assert [p.name for p in tmp_path.iterdir()] == ["out.conllu"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    out = tmp_path / "out.conllu"
    out.write_bytes(b"old\n")

    def full_disk(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match=f"{out}: No space left on device"):
        write_output(DATA, out)
    assert out.read_bytes() == b"old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.conllu"]


def test_a_folder_or_a_missing_folder_is_refused_naming_it(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a folder"):
        write_output(DATA, tmp_path)
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        write_output(DATA, tmp_path / "no-such-folder" / "out.conllu")


@pytest.mark.parametrize("path", [None, "-"])
def test_no_path_or_a_dash_is_standard_output(path, capfd):
    write_output(DATA, path)
    assert capfd.readouterr().out.encode() == DATA
