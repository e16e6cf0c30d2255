"""The client's own open-file limit (RLIMIT_NOFILE): raised before a replay sends, and,
when even that is too low, the run's fault rather than the server's.

A replay holds one connection, one descriptor, per request in flight: an open loop at
twice a server's knee has thousands. The common soft limit of 1,024 ran out at that,
and the requests that found no descriptor came back as failed and as SLO misses, so the
knee came out lower. Every process that sends (the replay's, each worker's) raises its
soft limit to the hard limit first (raising the hard limit needs privileges). A request
that still finds none (EMFILE, or ENFILE: the whole system's table is full) never reached
the server: it is `not_sent` with CLIENT_OUT_OF_FILES in its error, and the run is
`failed` with `client_fault`'s reason.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

CLIENT_OUT_OF_FILES = "the client ran out of file descriptors"


def raise_open_file_limit() -> int:
    """The soft limit raised to the hard one; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # some systems cap it lower (macOS: OPEN_MAX)
            log.warning("could not raise the open-file limit from %s to %s: %s", soft, target, exc)
    return soft


def limits_text() -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    name = {resource.RLIM_INFINITY: "unlimited"}
    return f"open-file limit {name.get(soft, soft)}, hard limit {name.get(hard, hard)}"


def out_of_files_error(exc: OSError) -> str:
    """A request's error when it found no descriptor for its connection."""
    return f"{CLIENT_OUT_OF_FILES} ({limits_text()}): no connection could be opened: {exc}"


def client_fault(requests) -> str | None:
    """Why the run is the client's failure (some requests found no descriptor), or None."""
    short = [r for r in requests if r.status == "not_sent" and (r.error or "").startswith(CLIENT_OUT_OF_FILES)]
    if not short:
        return None
    return (f"{short[0].error.splitlines()[0]}; {len(short)} of {len(requests)} requests were not sent, so the "
            "load asked for was not offered (nothing is counted against the server). Raise the limit in the "
            "shell that starts the run (`ulimit -n` up to the hard limit; the replay already raises its soft "
            "limit to the hard one), or have the hard limit raised (/etc/security/limits.conf, systemd's "
            "LimitNOFILE, the cluster's administrators), or offer fewer requests at once")
