"""Resumable, checked downloads, against a tiny HTTP server on 127.0.0.1 (never the network)."""

from __future__ import annotations

import hashlib
import http.server
import re
import threading
from collections.abc import Iterator

import pytest

from filledfirst.errors import UserError
from filledfirst.trace.fetch import MIRROR_ENV, fetch_trace

from conftest import REPO

PAYLOAD = bytes(range(256)) * 400  # 102,400 bytes
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class _Server(http.server.ThreadingHTTPServer):
    honour_range = True
    cut_after: int | None = None  # send only this many body bytes, then hang up
    ranges: list[str | None]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        rng = self.headers.get("Range")
        self.server.ranges.append(rng)
        start = 0
        m = re.fullmatch(r"bytes=(\d+)-", rng or "")
        if m and self.server.honour_range:
            start = int(m[1])
            if start >= len(PAYLOAD):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(PAYLOAD)}")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}")
        else:
            self.send_response(200)
        body = PAYLOAD[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = self.server.cut_after
        self.wfile.write(body if cut is None else body[:cut])
        if cut is not None:
            self.wfile.flush()
            self.close_connection = True

    def log_message(self, *args) -> None:  # keep the test output quiet
        pass


@pytest.fixture
def server(monkeypatch) -> Iterator[_Server]:
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.ranges = []
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _entry(srv: _Server, **extra) -> dict:
    return {"url": f"http://127.0.0.1:{srv.server_port}/t.csv", "file": "t.csv", **extra}


def test_interrupted_download_resumes_with_range(server, tmp_path):
    out = tmp_path / "traces" / "t.csv"
    server.cut_after = 30_000
    with pytest.raises(UserError, match="run again to resume"):
        fetch_trace(_entry(server, sha256=SHA, size=len(PAYLOAD)), out)
    part = out.with_name("t.csv.part")
    assert part.stat().st_size == 30_000 and not out.exists()

    server.cut_after = None
    fetch_trace(_entry(server, sha256=SHA, size=len(PAYLOAD)), out)
    assert out.read_bytes() == PAYLOAD and not part.exists()
    assert server.ranges == [None, "bytes=30000-"]


def test_server_ignoring_range_restarts_cleanly(server, tmp_path):
    out = tmp_path / "t.csv"
    out.with_name("t.csv.part").write_bytes(PAYLOAD[:5000])
    server.honour_range = False
    fetch_trace(_entry(server, sha256=SHA), out)
    assert out.read_bytes() == PAYLOAD


def test_complete_part_is_verified_and_renamed(server, tmp_path):
    out = tmp_path / "t.csv"
    out.with_name("t.csv.part").write_bytes(PAYLOAD)
    fetch_trace(_entry(server, sha256=SHA, size=len(PAYLOAD)), out)
    assert out.read_bytes() == PAYLOAD and server.ranges == [f"bytes={len(PAYLOAD)}-"]


def test_corrupt_part_fails_the_checksum_and_is_dropped(server, tmp_path):
    out = tmp_path / "t.csv"
    part = out.with_name("t.csv.part")
    part.write_bytes(b"x" * 1000)  # wrong bytes: the resumed file cannot match
    with pytest.raises(UserError, match="sha256 mismatch"):
        fetch_trace(_entry(server, sha256=SHA), out)
    assert not part.exists() and not out.exists()
    fetch_trace(_entry(server, sha256=SHA), out)  # and the next run starts over
    assert out.read_bytes() == PAYLOAD


def test_unchecked_entry_downloads(server, tmp_path):
    """The 2024 catalog entries have no size or sha256 yet."""
    out = tmp_path / "t.csv"
    fetch_trace(_entry(server), out)
    assert out.read_bytes() == PAYLOAD


def test_catalogs_name_the_known_traces():
    from filledfirst.config import load_config

    for name in ("config.yaml", "cpu.yaml"):
        traces = load_config([REPO / "config" / name])["traces"]
        assert traces["azure2023_conv"]["size"] == 719_188
        assert traces["azure2023_code"]["sha256"].startswith("54e9a6d2")
        for key in ("azure2024_conv_1week", "azure2024_code_1week"):
            assert "infererence" in traces[key]["url"] and "sha256" not in traces[key]
