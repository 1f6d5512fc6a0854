"""The fetcher's bounds (unroll.tools.fetch): a mirror that trickles bytes fails the fetch
within its deadline, and no message shows the mirror's credentials."""

import base64
import http.server
import threading
import time

import pytest

from tests.hang import at_once
from unroll.tools.ewt import TRAIN_FILE
from unroll.tools.fetch import URL_ENV, FetchError, fetch_ewt, redacted

#: seconds the trickling server keeps a connection at most: it stops by itself
SERVE_S = 30


class Trickle:
    """An HTTP server on 127.0.0.1 that promises a large file and sends one byte at a time,
    each as soon as the last went, until the client leaves or SERVE_S passes."""

    def __init__(self):
        self.authorization = []
        trickle = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                trickle.authorization.append(self.headers.get("Authorization"))
                self.send_response(200)
                self.send_header("Content-Length", str(1 << 30))
                self.end_headers()
                stop = time.monotonic() + SERVE_S
                try:
                    while time.monotonic() < stop:
                        self.wfile.write(b"1")
                        self.wfile.flush()
                        threading.Event().wait(0.01)  # a trickle, not a flood
                except OSError:  # the client gave up: what the test waits for
                    pass

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def trickle():
    server = Trickle()
    yield server
    server.close()


def test_a_trickling_mirror_fails_within_the_deadline_without_showing_credentials(
        trickle, tmp_path, monkeypatch):
    monkeypatch.setenv(URL_ENV, f"http://ada:s3cret@127.0.0.1:{trickle.port}/ewt/")
    with pytest.raises(FetchError) as e:  # at once: long before the server would stop
        at_once(fetch_ewt, tmp_path / "cache", {TRAIN_FILE: "0" * 64}, True, 0.5)
    message = str(e.value)
    assert f"http://ada:***@127.0.0.1:{trickle.port}/ewt/{TRAIN_FILE}" in message
    assert "s3cret" not in message and "0.5 s, the most one file may take" in message
    assert not list((tmp_path / "cache").glob(f"*{TRAIN_FILE}*"))  # nothing kept
    # the credentials went as basic authentication, not in the request line
    assert trickle.authorization == ["Basic " + base64.b64encode(b"ada:s3cret").decode()]


@pytest.mark.parametrize("url, shown", [
    ("https://mirror.example/ewt/", "https://mirror.example/ewt/"),
    ("https://ada:s3cret@mirror.example:8443/e", "https://ada:***@mirror.example:8443/e"),
    ("https://ada:p%40ss@mirror.example/", "https://ada:***@mirror.example/"),
])
def test_a_url_is_shown_with_its_password_replaced(url, shown):
    assert redacted(url) == shown
