"""The server we measure is the one we started, reached without a proxy; no vLLM starts
here (the thing under test is how we start, check and reach a server, so stand-in
processes play it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from filledfirst.engine.command import ServerCommand
from filledfirst.engine.server import (
    PortTaken,
    ServerStartError,
    VllmServer,
    free_port,
    port_in_use,
    port_was_taken,
)

from helpers.stream_double import StreamDouble

# A stand-in for vLLM: one process that listens on its port and answers /health and
# /v1/models (with the model name it is given), as vLLM's API server does.
STAND_IN = textwrap.dedent("""
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port, model = int(sys.argv[1]), sys.argv[2]
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": model}]}).encode() if self.path == "/v1/models" else b""
            self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def _server(tmp_path: Path, argv: list[str], port: int, served_name: str | None = "tiny") -> VllmServer:
    return VllmServer(ServerCommand(argv, served_name=served_name), host="127.0.0.1", port=port,
                      log_path=tmp_path / "server.log", startup_timeout_s=20)


def test_a_port_another_program_answers_on_is_refused_before_anything_starts(tmp_path):
    marker = tmp_path / "started"
    with StreamDouble().serving_in_thread() as base:  # answers /health with 200
        port = int(base.rsplit(":", 1)[1])
        assert port_in_use("127.0.0.1", port)
        with pytest.raises(PortTaken, match=f"port {port} on 127.0.0.1 is already in use"):
            with _server(tmp_path, [sys.executable, "-c", f"open({str(marker)!r}, 'w')"], port):
                pass
    assert not marker.exists()  # nothing was started


def test_a_port_left_in_time_wait_is_free(tmp_path):
    """A server we stopped leaves its port in TIME_WAIT; the next start may use it."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = listener.accept()
        conn.close()  # the server side closes first: its end goes to TIME_WAIT
        client.close()
    assert not port_in_use("127.0.0.1", port)


def test_a_healthy_answer_from_another_program_is_not_our_server(tmp_path):
    """The port was free when we looked, then another program took it before our process
    listened: its /health answers, but what answers is not ours."""
    port = free_port("127.0.0.1")
    server = _server(tmp_path, [sys.executable, "-c", "import time; time.sleep(60)"], port)
    server.start()
    try:
        with StreamDouble().serving_in_thread(port=port):
            with pytest.raises(PortTaken, match="does not listen there") as err:
                server.wait_healthy()
        assert port_was_taken(err.value)  # a port the study picked is picked again
        assert server.alive()  # the caller stops it
    finally:
        server.stop()
    assert not server.alive()


def test_our_process_serving_another_model_is_not_our_server(tmp_path):
    port = free_port("127.0.0.1")
    with pytest.raises(PortTaken, match="does not serve the model 'tiny'"):
        with _server(tmp_path, [sys.executable, "-c", STAND_IN, str(port), "another"], port):
            pass


def test_our_process_serving_our_model_is_healthy(tmp_path):
    port = free_port("127.0.0.1")
    with _server(tmp_path, [sys.executable, "-c", STAND_IN, str(port), "tiny"], port) as server:
        assert server.startup_s is not None and server.alive()
    assert not server.alive()


# Every way we ask our own servers something, in a process whose environment names a proxy
# from its start (urllib builds its default opener, proxies included, once per process).
_ASK_DIRECTLY = textwrap.dedent("""
    import sys
    from pathlib import Path
    from filledfirst.contracts.gauges import Gauges
    from filledfirst.engine.command import ServerCommand
    from filledfirst.engine.server import VllmServer
    from filledfirst.loadgen.endpoint import check_endpoint
    from filledfirst.run import runner
    base, port = sys.argv[1], int(sys.argv[1].rsplit(":", 1)[1])
    server = VllmServer(ServerCommand(["unused"]), host="127.0.0.1", port=port, log_path=Path("unused.log"),
                        startup_timeout_s=1)
    assert server._get("/health", timeout=5) == b"", "health"
    assert server.scheduler_load() == Gauges(running=0.0, waiting=0.0, kv_pct=0.0), "metrics"
    assert server.version() == "double", "version"
    assert runner.server_version(base) == "double", "the runner's version"
    check_endpoint(base)
""")


def test_our_servers_are_reached_without_the_environments_proxy(tmp_path):
    """A proxy in the environment (as on a proxied cluster node) sees none of our health,
    version, metrics or endpoint checks: they reach the server itself."""
    proxy, target = StreamDouble(), StreamDouble()
    with proxy.serving_in_thread() as proxy_url, target.serving_in_thread() as base:
        env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
        env.update({name: proxy_url for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "all_proxy")})
        proc = subprocess.run([sys.executable, "-c", _ASK_DIRECTLY, base], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert target.connections >= 5
        assert proxy.connections == 0


def test_a_launcher_not_on_path_is_a_start_error_that_says_so(tmp_path):
    missing = "vllm-not-installed-here"
    with pytest.raises(ServerStartError, match=f"cannot run '{missing}'.*must be on PATH"):
        with _server(tmp_path, [missing, "serve", "m"], free_port("127.0.0.1")):
            pass
