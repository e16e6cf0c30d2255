"""Start one engine's server (vLLM, llama-server), wait until it is healthy, and always stop it."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import socket
import subprocess
import time
from collections import deque
from pathlib import Path

import psutil

from filledfirst import direct_http
from filledfirst.contracts.gauges import Gauges
from filledfirst.engine.command import ServerCommand
from filledfirst.engine.lifetime import pause_group, resume_group, server_preexec, start_guardian, stop_group
from filledfirst.metrics import latest_gauges, parse_metrics
from filledfirst.redact import redact_argv

log = logging.getLogger(__name__)


class ServerStartError(Exception):
    """The server exited or never became healthy; the message carries its log tail."""


class PortTaken(ServerStartError):
    """Another program holds the port, or answers on it: nothing of ours is measured there."""


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str) -> int:
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """Another socket listens on host:port. With SO_REUSEADDR, as vLLM binds: a port a
    stopped server left in TIME_WAIT is free, one that something listens on is not."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen()
        except OSError as exc:
            # Anything else (a privileged port, an address not on this host) is vLLM's to
            # refuse, with its own reason in its log.
            return exc.errno == errno.EADDRINUSE
    return False


# How each engine says its port was taken: vLLM (Python's socket error) and llama-server.
_PORT_TAKEN = ("Address already in use", "Errno 98", "couldn't bind HTTP server socket")


def port_was_taken(exc: ServerStartError) -> bool:
    """vLLM could not bind or listen on its port, or another program answered there: quick
    when another process listens there (vLLM binds first), only after the model loaded
    when another vLLM merely bound it."""
    if isinstance(exc, PortTaken):
        return True
    cause = str(exc).split("\nLast lines of", 1)[0]  # this start's first error, not the shared tail
    return any(sign in cause for sign in _PORT_TAKEN)


def _listening_ports(pid: int) -> set[int] | None:
    """Ports the process `pid` and its descendants listen on; None when the system does
    not let us look."""
    try:
        root = psutil.Process(pid)
        ports: set[int] = set()
        for proc in [root, *root.children(recursive=True)]:
            try:
                ports |= {c.laddr.port for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
            except psutil.NoSuchProcess:
                continue
        return ports
    except psutil.AccessDenied:
        return None
    except psutil.NoSuchProcess:
        return set()


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


def server_version(base_url: str) -> str | None:
    """The server's own version: what vLLM's /version says, else llama-server's build on
    /props; None for a server that says neither."""
    for path, key in (("/version", "version"), ("/props", "build_info")):
        answer = direct_http.get(base_url + path, timeout_s=5.0)
        try:
            if answer is not None and answer[0] == 200:
                return str(json.loads(answer[1])[key])
        except (ValueError, KeyError, TypeError):
            continue
    return None


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
        self._host, self._port = host, port
        self.paused = False

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
        if port_in_use(self._host, self._port):
            raise PortTaken(
                f"port {self._port} on {self._host} is already in use by another program, so {self.cmd.engine} was not "
                "started there (leave engine.port unset and the study picks a free port)")
        log.info("starting %s: %s", self.cmd.engine, " ".join(redact_argv(self.cmd.argv)))
        with open(self.log_path, "ab") as logf:
            self._log_from = logf.tell()  # this start's lines begin here
            try:
                self.proc = subprocess.Popen(
                    self.cmd.argv,
                    env={**os.environ, **self.cmd.env},
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group, stopped as one
                    preexec_fn=server_preexec(self.nice),
                )
            except (FileNotFoundError, PermissionError) as exc:
                raise ServerStartError(
                    f"cannot run {self.cmd.argv[0]!r} ({exc.strerror}): the launcher's command (or "
                    "engine.wrapper's, e.g. apptainer) must be on PATH in the environment the study runs in "
                    "(install vLLM there: `pip install vllm` on a GPU, `make install` on a CPU; `make install` "
                    "also builds llama-server)") from None
        self._guardian = start_guardian(self.proc.pid)
        self._t_start = time.monotonic()

    def wait_healthy(self) -> None:
        assert self.proc is not None
        deadline = self._t_start + self.startup_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"{self.cmd.engine} exited with code {code} before it was healthy. "
                    + log_excerpt(self.log_path, since=self._log_from)
                )
            if self._get("/health", timeout=2.0) is not None:
                self._check_ours()
                self.startup_s = time.monotonic() - self._t_start
                log.info("%s healthy at %s after %.1f s", self.cmd.engine, self.base_url, self.startup_s)
                return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{self.cmd.engine} was not healthy after {self.startup_timeout_s:.0f} s "
                    f"(engine.startup_timeout_s). " + log_excerpt(self.log_path, since=self._log_from)
                )
            time.sleep(0.5)

    def _check_ours(self) -> None:
        """The server that answered /health is the one we started: our process is alive and
        listens on the port, and it serves our model. Otherwise another program answers
        there, and the replay would measure it."""
        assert self.proc is not None
        ports = _listening_ports(self.proc.pid)
        if self.proc.poll() is not None or (ports is not None and self._port not in ports):
            raise PortTaken(
                f"another program answers on {self.base_url}: the {self.cmd.engine} started for this run "
                f"(pid {self.proc.pid}) "
                "does not listen there. " + log_excerpt(self.log_path, since=self._log_from))
        if self.cmd.served_name is None:
            return
        answer = direct_http.get(self.base_url + "/v1/models", timeout_s=5.0)
        if answer is None or answer[0] in (401, 403):
            return  # no list without the server's API key: the listening check above holds
        try:
            served = {m["id"] for m in json.loads(answer[1])["data"]}
        except (ValueError, KeyError, TypeError):
            served = set()
        if answer[0] != 200 or self.cmd.served_name not in served:
            raise PortTaken(
                f"the server on {self.base_url} does not serve the model {self.cmd.served_name!r} "
                f"(HTTP {answer[0]} from /v1/models, models {sorted(served)}): not the {self.cmd.engine} started "
                "for this run")

    def version(self) -> str | None:
        return server_version(self.base_url)

    def scheduler_load(self) -> Gauges | None:
        """The scheduler's gauges from one read of /metrics; None when it did not answer."""
        body = self._get("/metrics", timeout=5.0)
        if body is None:
            return None
        try:
            return latest_gauges(parse_metrics(body.decode(errors="replace"), 0.0))
        except ValueError:  # a malformed exposition counts as no answer
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self) -> None:
        """Stop the whole server where it is (no CPU, its memory kept) until `resume`."""
        if self.alive() and not self.paused:
            pause_group(self.proc.pid)
            self.paused = True
            log.info("%s paused (pid %d)", self.cmd.engine, self.proc.pid)

    def resume(self) -> None:
        if self.paused and self.alive():
            resume_group(self.proc.pid)
            log.info("%s resumed (pid %d)", self.cmd.engine, self.proc.pid)
        self.paused = False

    def _get(self, path: str, timeout: float) -> bytes | None:
        answer = direct_http.get(self.base_url + path, timeout_s=timeout)
        return answer[1] if answer is not None and answer[0] == 200 else None

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc.pid)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) did not exit after SIGKILL", self.cmd.engine, self.proc.pid)
            log.info("%s stopped (exit code %s)", self.cmd.engine, self.proc.returncode)
            self.proc = None
            self.paused = False
        if self._guardian is not None:
            self._guardian.stdin.close()  # the group is gone; the guardian exits at once
            self._guardian.wait(timeout=30)
            self._guardian = None
