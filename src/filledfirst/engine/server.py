"""Start one vLLM server, wait until it is healthy, and always stop it."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

from filledfirst.engine.command import ServerCommand
from filledfirst.engine.lifetime import server_preexec, start_guardian, stop_group
from filledfirst.redact import redact_argv
from filledfirst.run.scrape import latest_gauges, parse_metrics

log = logging.getLogger(__name__)


class ServerStartError(Exception):
    """The server exited or never became healthy; the message carries its log tail."""


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_was_taken(exc: ServerStartError) -> bool:
    """vLLM could not bind or listen on its port: quick when another process listens there
    (vLLM binds first), only after the model loaded when another vLLM merely bound it."""
    cause = str(exc).split("\nLast lines of", 1)[0]  # this start's first error, not the shared tail
    return "Address already in use" in cause or "Errno 98" in cause


# A Python exception line, at the start of the line or right after vLLM's ERROR prefix
# (warnings that merely mention an error do not match).
_EXCEPTION_LINE = re.compile(
    r"^(?:\(.*?\) ERROR .*?\] )?([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$"
    r"|^\S+: (error): (.+)$"  # argparse: "api_server.py: error: unrecognized arguments: ..."
)


def first_error(path: Path, since: int = 0) -> str | None:
    """The first exception vLLM logged from byte `since` (where this start's lines begin,
    in a log several starts share): the root cause, where the log's last lines often
    hold only "Engine core initialization failed. See root cause above"."""
    try:
        with open(path, errors="replace") as f:
            f.seek(since)
            for line in f:
                m = _EXCEPTION_LINE.match(line.strip())
                if m:
                    name, text = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
                    return f"{name}: {text}"
    except FileNotFoundError:
        pass
    return None


def log_excerpt(path: Path, lines: int = 40, since: int = 0) -> str:
    """The root cause (if one was logged after byte `since`), then the last lines of the log."""
    cause = first_error(path, since)
    head = f"First error: {cause}\n" if cause else ""
    return f"{head}Last lines of {path.name}:\n{log_tail(path, lines)}"


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except FileNotFoundError:
        return "(no server log)"


class VllmServer:
    """Context manager: `with VllmServer(...) as s:` the server is healthy inside, gone after."""

    def __init__(
        self, cmd: ServerCommand, *, host: str, port: int, log_path: Path, startup_timeout_s: float, nice: int = 0
    ):
        self.cmd = cmd
        self.nice = nice
        self.base_url = f"http://{host}:{port}"
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self._guardian: subprocess.Popen | None = None
        self.startup_s: float | None = None
        self._log_from = 0

    def __enter__(self) -> "VllmServer":
        try:
            self.start()
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        log.info("starting vLLM: %s", " ".join(redact_argv(self.cmd.argv)))
        with open(self.log_path, "ab") as logf:
            self._log_from = logf.tell()  # this start's lines begin here
            self.proc = subprocess.Popen(
                self.cmd.argv,
                env={**os.environ, **self.cmd.env},
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, stopped as one
                preexec_fn=server_preexec(self.nice),
            )
        self._guardian = start_guardian(self.proc.pid)
        self._t_start = time.monotonic()

    def wait_healthy(self) -> None:
        assert self.proc is not None
        deadline = self._t_start + self.startup_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"vLLM exited with code {code} before it was healthy. "
                    + log_excerpt(self.log_path, since=self._log_from)
                )
            if self._get("/health", timeout=2.0) is not None:
                self.startup_s = time.monotonic() - self._t_start
                log.info("vLLM healthy at %s after %.1f s", self.base_url, self.startup_s)
                return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"vLLM was not healthy after {self.startup_timeout_s:.0f} s "
                    f"(engine.startup_timeout_s). " + log_excerpt(self.log_path, since=self._log_from)
                )
            time.sleep(0.5)

    def version(self) -> str | None:
        body = self._get("/version", timeout=5.0)
        try:
            return json.loads(body)["version"] if body else None
        except (ValueError, KeyError):
            return None

    def scheduler_load(self) -> dict[str, float] | None:
        """running / waiting / kv from one read of /metrics; None when it did not answer."""
        body = self._get("/metrics", timeout=5.0)
        if body is None:
            return None
        try:
            return latest_gauges(parse_metrics(body.decode(errors="replace"), 0.0))
        except ValueError:  # a malformed exposition counts as no answer
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _get(self, path: str, timeout: float) -> bytes | None:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=timeout) as resp:
                return resp.read() if resp.status == 200 else None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return None

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc.pid)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.error("vLLM (pid %d) did not exit after SIGKILL", self.proc.pid)
            log.info("vLLM stopped (exit code %s)", self.proc.returncode)
            self.proc = None
        if self._guardian is not None:
            self._guardian.stdin.close()  # the group is gone; the guardian exits at once
            self._guardian.wait(timeout=30)
            self._guardian = None
