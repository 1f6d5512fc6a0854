"""Fetching UD English EWT into the cache when no data folder is there (fetch.py, data.py),
from a mirror on 127.0.0.1 serving small files made here, with their checksums passed in."""

import hashlib
import http.server
import json
import socket
import threading
from pathlib import Path

import pytest

from examples.pos_tagging.__main__ import main
from tests.cli_helpers import one_line_error
from unroll.tools import ewt as data
from unroll.tools import fetch
from unroll.tools.conllu import write_conllu
from unroll.tools.ewt import (
    DATA_ENV,
    DEV_FILE,
    HOME_ENV,
    TEST_FILE,
    TRAIN_FILE,
    cache_dir,
    data_dir,
    fetched_data_dir,
)
from unroll.tools.fetch import URL_ENV, FetchError, fetch_ewt


class Mirror:
    """An HTTP server on 127.0.0.1 serving ``files``; names in ``drop`` are cut off halfway
    (a Content-Length of the whole file, half of it sent, the connection closed)."""

    def __init__(self, files: dict):
        self.files, self.drop, self.requests = files, set(), []
        self.checksums = {name: hashlib.sha256(body).hexdigest() for name, body in files.items()}
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                name = self.path.rsplit("/", 1)[-1]
                mirror.requests.append(name)
                if name not in mirror.files:
                    self.send_error(404)
                    return
                body = mirror.files[name]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:len(body) // 2] if name in mirror.drop else body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/ewt/r2.16/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def mirror(corpus, tmp_path, monkeypatch):
    """A mirror of made-up train/dev/test files, named by $UNROLL_EWT_URL; an empty cache."""
    test = [["every", "old", "dog", "sleeps", "."], ["a", "tree", "!"]]
    write_conllu(test, [["DET", "ADJ", "NOUN", "VERB", "PUNCT"], ["DET", "NOUN", "PUNCT"]],
                 corpus / TEST_FILE)
    files = {name: (corpus / name).read_bytes() for name in (TRAIN_FILE, DEV_FILE, TEST_FILE)}
    server = Mirror(files)
    monkeypatch.setenv(URL_ENV, server.url)
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    yield server
    server.close()


@pytest.fixture
def no_data_folder(tmp_path, monkeypatch):
    """Neither $UNROLL_EWT_DATA nor ../shared/data: the cache is where the data is."""
    monkeypatch.delenv(DATA_ENV, raising=False)
    monkeypatch.setattr(data, "DEFAULT_DATA", tmp_path / "no-shared-data")


def looks_complete(folder: Path) -> set:
    """The files of ``folder`` under a release file's name, and any temp file left."""
    names = {p.name for p in folder.iterdir()}
    return {n for n in names if n in fetch.SHA256 or n.endswith(".tmp")}



def test_fetch_verifies_the_files_and_writes_the_licence_once(mirror, tmp_path, capsys):
    folder = fetch_ewt(checksums=mirror.checksums, quiet=True)
    assert folder == tmp_path / "home" / "ud_english_ewt" / "r2.16" == cache_dir()
    for name, body in mirror.files.items():
        assert (folder / name).read_bytes() == body
    assert sorted(mirror.requests) == sorted(mirror.files)
    licence = (folder / "LICENSE.txt").read_text()
    readme = (folder / "README.txt").read_text()
    assert "CC BY-SA 4.0" in licence and "creativecommons.org/licenses/by-sa/4.0" in licence
    assert "A Gold Standard Dependency Corpus for English" in readme
    assert all(sha in readme for sha in mirror.checksums.values())
    err = capsys.readouterr().err
    assert "CC BY-SA 4.0" in err and "Silveira" in err

    assert fetch_ewt(checksums=mirror.checksums, quiet=True) == folder
    assert len(mirror.requests) == 3  # nothing downloaded again
    assert "CC BY-SA" not in capsys.readouterr().err  # printed once
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_damaged_file_in_the_cache_is_deleted_reported_and_fetched_again(mirror, capsys):
    folder = fetch_ewt(checksums=mirror.checksums, quiet=True)
    (folder / DEV_FILE).write_bytes(b"1\tdamaged\n")
    capsys.readouterr()
    fetch_ewt(checksums=mirror.checksums, quiet=True)
    assert mirror.requests[3:] == [DEV_FILE]
    assert (folder / DEV_FILE).read_bytes() == mirror.files[DEV_FILE]
    err = capsys.readouterr().err
    assert f"{folder / DEV_FILE}: its SHA-256 is not release r2.16's; deleted it" in err


def test_a_checksum_mismatch_keeps_nothing_that_looks_complete(mirror):
    wrong = dict(mirror.checksums, **{DEV_FILE: "0" * 64})
    with pytest.raises(FetchError) as failed:
        fetch_ewt(checksums=wrong, quiet=True)
    message = str(failed.value)
    assert f"{mirror.url}{DEV_FILE}: SHA-256 {mirror.checksums[DEV_FILE]}" in message
    assert f"expected release r2.16's {'0' * 64}" in message and "--data DIR" in message
    assert looks_complete(cache_dir()) == {TRAIN_FILE}  # the file before it, verified
    assert not (cache_dir() / "LICENSE.txt").exists()


def test_a_connection_dropped_halfway_keeps_nothing_that_looks_complete(mirror):
    mirror.drop.add(TRAIN_FILE)
    with pytest.raises(FetchError) as failed:
        fetch_ewt(checksums=mirror.checksums, quiet=True)
    size = len(mirror.files[TRAIN_FILE])
    message = str(failed.value)
    assert f"{mirror.url}{TRAIN_FILE}" in message and "--data DIR" in message
    assert f"the connection ended after {size // 2} of {size} bytes" in message
    assert looks_complete(cache_dir()) == set()
    mirror.drop.clear()  # the next run starts over and succeeds
    fetch_ewt(checksums=mirror.checksums, quiet=True)
    assert (cache_dir() / TRAIN_FILE).read_bytes() == mirror.files[TRAIN_FILE]


@pytest.fixture
def closed_port(monkeypatch, tmp_path):
    """$UNROLL_EWT_URL on a port of 127.0.0.1 that nothing listens on; an empty cache."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/ewt/"
    monkeypatch.setenv(URL_ENV, url)
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    return url


@pytest.mark.parametrize("command", [["fetch"], ["train", "--model-dir", "{tmp}/m"],
                                     ["evaluate", "--model-dir", "{tmp}/m", "--split", "dev"]])
def test_an_unreachable_server_is_one_line_naming_url_cache_and_data(
        command, closed_port, no_data_folder, tmp_path, capsys):
    assert main([a.format(tmp=tmp_path) for a in command]) == 2
    one_line_error(capsys, f"cannot fetch {closed_port}{TRAIN_FILE}", str(cache_dir()),
                   "pass --data DIR")
    assert looks_complete(cache_dir()) == set()


def test_the_fetch_command_prints_the_folder(mirror, monkeypatch, capsys):
    monkeypatch.setattr(fetch, "SHA256", mirror.checksums)
    assert main(["fetch", "--quiet"]) == 0
    assert capsys.readouterr().out == f"{cache_dir()}\n"
    assert sorted(mirror.requests) == sorted(mirror.files)


def test_train_and_evaluate_without_data_fetch_it_first(mirror, no_data_folder, monkeypatch,
                                                        tmp_path, capsys, tiny_args):
    monkeypatch.setattr(fetch, "SHA256", mirror.checksums)
    model_dir = tmp_path / "m"
    argv = ["train", "--model-dir", str(model_dir), "--epochs", "1", "--quiet", *tiny_args]
    assert main(argv) == 0
    assert [e["epoch"] for e in json.loads((model_dir / "log.json").read_text())] == [1]
    assert sorted(mirror.requests) == sorted(mirror.files)
    assert main(["evaluate", "--model-dir", str(model_dir), "--split", "test"]) == 0
    assert len(mirror.requests) == 3  # verified in the cache, not fetched again
    assert "UPOS accuracy:" in capsys.readouterr().out


def test_the_data_folder_is_the_option_then_the_variable_then_shared_then_the_cache(
        monkeypatch, tmp_path, corpus):
    def no_network(*args, **kwargs):
        raise AssertionError("fetched although a data folder was there")

    monkeypatch.setattr(fetch.urllib.request, "urlopen", no_network)
    monkeypatch.setattr(data, "DEFAULT_DATA", corpus)
    monkeypatch.setenv(DATA_ENV, "/from/env")
    assert fetched_data_dir("given") == data_dir("given") == Path("given")
    assert fetched_data_dir() == data_dir() == Path("/from/env")
    monkeypatch.delenv(DATA_ENV)
    assert fetched_data_dir() == data_dir() == corpus  # ../shared/data, as on CI: no fetch
    monkeypatch.setattr(data, "DEFAULT_DATA", tmp_path / "absent")
    assert data_dir() == cache_dir()
    with pytest.raises(AssertionError, match="fetched although"):
        fetched_data_dir()


def test_the_release_checksums_are_those_of_the_shared_data():
    """The pinned SHA-256 match the r2.16 train and dev files of ../shared/data."""
    shared = data.DEFAULT_DATA
    if not (shared / TRAIN_FILE).is_file():
        pytest.skip(f"no shared data at {shared}")
    for name in (TRAIN_FILE, DEV_FILE):
        assert fetch.sha256_of(shared / name) == fetch.SHA256[name], name
