"""One vLLM server for several experiments with identical server settings.

Started when the first experiment needs it, reused (once idle) by the next ones,
started afresh when it died, stopped at the end. Its whole log goes to one file; each
run copies the part written while it was the current one.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from pathlib import Path

from filledfirst import redact
from filledfirst.engine import devices
from filledfirst.engine.command import ServerCommand, server_command
from filledfirst.engine.server import ServerStartError, VllmServer, free_port, port_was_taken
from filledfirst.model.fit import kv_fit_problem
from filledfirst.study import EngineStart, ServerSpec

log = logging.getLogger(__name__)

# A finished run leaves nothing in flight (the client cancels what outlived the drain
# timeout and vLLM aborts a request whose connection closed), so idleness normally
# comes within a second; this is for a server that never gets there.
IDLE_TIMEOUT_S = 120.0
IDLE_POLL_S = 0.25
PORT_ATTEMPTS = 3
# vLLM logs the per-step token budget when it is given (0.32's SchedulerConfig, once per
# process); left to its hardware default it says it nowhere, log or /metrics.
_BUDGET_LOGGED = re.compile(rb"max_num_batched_tokens=(\d+)")


class ServerNotIdle(Exception):
    """Requests of an earlier experiment were still running or waiting after the timeout."""


class SharedServer:
    def __init__(self, spec: ServerSpec, log_path: Path, idle_timeout_s: float = IDLE_TIMEOUT_S):
        self.spec = spec
        self.log_path = log_path
        self.idle_timeout_s = idle_timeout_s
        self.server: VllmServer | None = None
        self.cmd: ServerCommand | None = None  # of the latest start attempt
        self.base_url: str | None = None
        self.started_by: str | None = None  # the experiment that paid the current start-up
        self.startup_s: float | None = None
        self.version: str | None = None
        self.token_budget: int | None = None  # max_num_batched_tokens, as the latest start logged it
        self.start_offset = 0  # log offset where the latest start attempt began
        # A start that failed is not retried: the same settings would fail the same way,
        # after up to startup_timeout_s each.
        self.start_error: ServerStartError | None = None
        self.lease: devices.Lease | None = None  # the GPUs the running server holds (filledfirst.engine.devices)

    @property
    def engine(self) -> EngineStart:
        """How to start it; the spec's `server` holds the merged vLLM settings apart."""
        return self.spec.engine

    def alive(self) -> bool:
        return self.server is not None and self.server.alive()

    def ready(self, experiment: str) -> float | None:
        """Make the server ready for `experiment`: the seconds waited for it to be idle
        when it was reused, None when it was started for this experiment."""
        if self.start_error is not None:
            raise self.start_error
        if self.server is not None:
            self.server.resume()  # if paused
            if not self.alive():
                log.warning("vLLM exited after the previous experiment; starting a fresh one for %s", experiment)
            else:
                try:
                    return self._wait_idle()
                except ServerNotIdle as exc:
                    log.error("%s; starting a fresh server for %s", exc, experiment)
            self.stop()
        self._start(experiment)
        return None

    def _start(self, experiment: str) -> None:
        host, fixed_port = self.engine.host, self.engine.port
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = fixed_port or free_port(host)
            try:
                self._start_on(experiment, host, port)
                return
            except ServerStartError as exc:
                # Another process may take the port between our probe and vLLM's bind (two
                # pipelines on one machine): a port we chose is worth choosing again.
                if fixed_port or not port_was_taken(exc) or attempt == PORT_ATTEMPTS:
                    self.start_error = exc
                    raise
                log.warning("port %d was taken before vLLM could bind it; trying another", port)

    def _start_on(self, experiment: str, host: str, port: int) -> None:
        engine = self.engine
        cmd = server_command(self.spec, host, port)
        if devices.leased(engine.launcher, engine.env):  # its own GPUs, whatever else runs here
            self.lease = devices.lease(devices.needed(self.spec.server))
            if self.lease.devices:
                cmd = dataclasses.replace(cmd, env={**cmd.env, devices.VISIBLE: ",".join(self.lease.devices)})
        self.cmd = cmd
        self.base_url = f"http://{host}:{port}"
        self.start_offset = self.log_offset()
        try:  # a start that does not come up gives its GPUs back
            if engine.launcher == "gpu":
                self._check_kv_fits()
            server = VllmServer(
                self.cmd, host=host, port=port, log_path=self.log_path,
                startup_timeout_s=engine.startup_timeout_s, nice=engine.server_nice,
            )
            server.__enter__()  # healthy, or stopped again and raised
        except BaseException:
            self._release()
            raise
        self.server, self.started_by, self.startup_s = server, experiment, server.startup_s
        self.version = server.version()
        self.token_budget = self._logged_budget()

    def _check_kv_fits(self) -> None:
        """A fixed KV budget its GPUs cannot hold stops here, not minutes into a start
        (filledfirst.model.fit)."""
        card = devices.memory(self.lease.devices if self.lease else devices.visible_devices())
        if card is None:
            return
        model = self.spec.model
        problem = kv_fit_problem(model.folder, model.dtype, self.spec.server, card[1], card[0])
        if problem:
            raise ServerStartError(problem)

    def _logged_budget(self) -> int | None:
        """The token budget this start's log names (the first mention after its offset)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.start_offset)
                found = _BUDGET_LOGGED.search(f.read())
        except OSError:
            return None
        return int(found.group(1)) if found else None

    def _wait_idle(self) -> float:
        """Seconds until /metrics showed nothing running or waiting: every experiment
        starts on an empty scheduler, whatever the one before it left."""
        assert self.server is not None
        t0 = time.monotonic()
        load = None
        while time.monotonic() - t0 < self.idle_timeout_s:
            if not self.alive():
                raise ServerNotIdle("vLLM exited while waiting for it to be idle")
            load = self.server.scheduler_load()
            if load is not None and load.idle():
                waited = time.monotonic() - t0
                log.info("vLLM idle after %.1f s", waited)
                return waited
            time.sleep(IDLE_POLL_S)
        seen = str(load) if load is not None else "/metrics not answering"
        raise ServerNotIdle(f"vLLM was not idle {self.idle_timeout_s:.0f} s after the previous experiment ({seen})")

    def pause(self) -> None:
        """Pause the running server (filledfirst.engine.server.VllmServer.pause) while another
        runs; the next `ready` resumes it, `stop` stops it paused or not."""
        if self.server is not None:
            self.server.pause()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        self._release()

    def _release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def log_offset(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    @property
    def secrets(self) -> frozenset[str]:
        """The secrets of the latest start's command and environment: vLLM may print them
        (older versions log their arguments, api_key included)."""
        return redact.secret_values(self.cmd.argv, self.cmd.env) if self.cmd is not None else frozenset()

    def copy_log(self, since: int, dest: Path) -> int:
        """Copy the log from byte `since` to its current end (a run's own part of it) to
        `dest`, redacted line by line; returns that end, where the next part begins."""
        secrets = self.secrets
        with open(dest, "w", encoding="utf-8", errors="surrogateescape", newline="") as out:
            try:
                with open(self.log_path, "rb") as src:
                    src.seek(since)
                    for line in src:
                        out.write(redact.redact_text(line.decode("utf-8", "surrogateescape"), secrets))
                    return src.tell()
            except FileNotFoundError:
                return since  # the server was never started: an empty log
