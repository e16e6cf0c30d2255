"""`python -m filledfirst.engine.guardian PGID`: stop PGID when stdin reaches EOF."""

from __future__ import annotations

import signal
import sys

from filledfirst.engine.lifetime import stop_group


def main() -> None:
    pgid = int(sys.argv[1])
    # Ctrl-C reaches the whole terminal group; the guardian must outlive it to clean up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    sys.stdin.buffer.read()  # returns once the run process closed its end or died
    stop_group(pgid)


if __name__ == "__main__":
    main()
