"""What one streamed chunk costs the writing side of a loopback TCP connection, with nothing
else to do: the floor under any test double (Python or not) that writes each chunk.

    .venv/bin/python benchmarks/loopback_floor.py --connections 400 --ticks 100 --tick-ms 20

A reader process opens `--connections` connections and discards what arrives (an asyncio
Protocol); the writer writes one chunk of the double's (the same bytes, HTTP chunk framing
included) to every connection per tick, `--tick-ms` apart, with os.write: well under a
microsecond of Python per write. The writer's CPU time (user + system, getrusage) per write
is the floor. On loopback the kernel delivers into the reader's socket, and wakes it, in
the writer's system call, so that work is counted on the writer's side too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.stream_double import _chunks  # noqa: E402 - the double's own bytes


def reader(port: int, n: int, seconds: float) -> None:
    class Discard(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            pass

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(n):
            await loop.create_connection(Discard, "127.0.0.1", port)
        await asyncio.sleep(seconds)

    asyncio.run(run())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=400)
    p.add_argument("--ticks", type=int, default=100)
    p.add_argument("--tick-ms", type=float, default=20)
    a = p.parse_args()
    chunk = _chunks("completions", 50)[49]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    port = listener.getsockname()[1]
    pid = os.fork()
    if pid == 0:
        reader(port, a.connections, a.ticks * a.tick_ms / 1000 + 5)
        os._exit(0)
    conns = [listener.accept()[0] for _ in range(a.connections)]
    for c in conns:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    fds = [c.fileno() for c in conns]
    time.sleep(0.5)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(a.ticks):
        for fd in fds:
            os.write(fd, chunk)
        time.sleep(a.tick_ms / 1000)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    writes = a.ticks * a.connections
    user, system = (r1.ru_utime - r0.ru_utime) / writes * 1e6, (r1.ru_stime - r0.ru_stime) / writes * 1e6
    print(f"{a.connections} connections, a {len(chunk)}-byte chunk to each every {a.tick_ms:g} ms, {writes:,} writes: "
          f"{user + system:.1f} us of CPU per write (user {user:.1f}, system {system:.1f}), "
          f"i.e. {user + system:.1f} ms per 1,000 one-token chunks")


if __name__ == "__main__":
    main()
