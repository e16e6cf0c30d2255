"""Stand-ins for the vLLM server the runner starts, so `filledfirst run` and a capacity
search go through their real code with no vLLM: `FakeVllm` in place of VllmServer (set on
filledfirst.engine.shared), `FakeShared` in place of SharedServer (set where the runner or
the search builds one)."""

from __future__ import annotations

from filledfirst import interrupts
from filledfirst.contracts.gauges import Gauges
from filledfirst.engine.command import ServerCommand
from filledfirst.engine.server import ServerStartError, log_excerpt
from filledfirst.engine.shared import SharedServer

from helpers.stream_double import StreamDouble

IDLE = Gauges(running=0.0, waiting=0.0, kv_pct=0.0)


class FakeVllm:
    """Stands in for VllmServer: keeps the command it was given and starts nothing, or, with
    `serve`, the loopback double answers on the host and port the runner chose. The runner
    builds the instances, so the knobs are class attributes (a subclass per test sets its
    own): `fail` makes the start fail as VllmServer's does, log excerpt and all; `lives`
    makes the server seen alive that many times, then dead; `start_log` is what it writes
    to the server log first; `commands` collects every command started."""

    serve = False
    fail = False
    lives: int | None = None
    commands: list[ServerCommand] = []
    startup_s = 0.0

    def __init__(self, cmd: ServerCommand, *, host: str, port: int, log_path, startup_timeout_s: float,
                 nice: int = 0):
        self.cmd, self.host, self.port, self.log_path = cmd, host, port, log_path
        self._serving = None

    def start_log(self) -> str:
        return ""

    def __enter__(self):
        type(self).commands.append(self.cmd)
        with open(self.log_path, "a") as f:
            f.write(self.start_log())
        if self.fail:
            raise ServerStartError("vLLM exited with code 1 before it was healthy. " + log_excerpt(self.log_path))
        if self.serve:
            self._serving = StreamDouble(ttft_s=0.01, itl_s=0.005).serving_in_thread(self.host, self.port)
            self._serving.__enter__()
        return self

    def alive(self) -> bool:
        if self.lives is not None:
            self.lives -= 1
            return self.lives >= 0
        return self._serving is not None or not self.serve

    def version(self) -> str:
        return "fake"

    def scheduler_load(self) -> Gauges:
        return IDLE

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.__exit__(None, None, None)
            self._serving = None


class _Proc:
    def __init__(self):
        self.running = True

    def alive(self):
        return self.running

    def stop(self):
        self.running = False

    def resume(self):  # never paused
        pass

    def scheduler_load(self):
        return IDLE


class FakeShared(SharedServer):
    """A SharedServer whose starts write a start-up line to the log instead of starting vLLM
    (`failing_starts`: the experiments whose start fails; `starts`: every start asked for)."""

    def __init__(self, log_path, failing_starts=()):
        super().__init__({}, log_path)
        self.failing_starts = failing_starts
        self.extra_args: list[str] = []
        self.starts: list[str] = []

    def _start(self, experiment):
        self.starts.append(experiment)
        self.cmd, self.base_url = ServerCommand(["vllm", "serve", *self.extra_args]), "http://fake"
        self.start_offset = self.log_offset()
        with open(self.log_path, "a") as f:
            f.write(f"start-up for {experiment}\n")
        if experiment in self.failing_starts:
            self.start_error = ServerStartError(f"vLLM exited with code 1 before it was healthy ({experiment})")
            raise self.start_error
        self.server, self.started_by, self.startup_s = _Proc(), experiment, 1.5

    def replayed(self, replay, name: str, what: str | None) -> bool:
        """What a stand-in replay of `name` leaves: a line in the server log, and with `what`
        the server dead ("server dies") or an interrupt noted ("interrupt") meanwhile, which
        ends the replay (True)."""
        with open(self.log_path, "a") as f:
            f.write(f"requests of {name}\n")
        if what == "server dies":
            self.server.running = False
            replay.server_died = True
        elif what == "interrupt":
            interrupts.note_interrupt("received SIGINT")
            replay.interrupted = "received SIGINT"
        return what is not None
