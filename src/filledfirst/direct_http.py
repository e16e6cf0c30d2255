"""GET from a server of our own (one we started, or the endpoint a replay measures),
never through a proxy from the environment.

urllib's plain `urlopen` honours `http_proxy`/`HTTPS_PROXY`: on a proxied cluster node a
health check of a vLLM on 127.0.0.1 went to the proxy, so every start timed out, or the
proxy's own 200 passed as healthy. The load generator's requests and the scraper never
use a proxy; nothing that asks our servers anything may either.
"""

from __future__ import annotations

import urllib.error
import urllib.request

# An empty ProxyHandler: no proxy at all, whatever the environment says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def open_url(url: str, *, timeout_s: float, headers: dict[str, str] | None = None):
    """The response of GET `url` (a context manager, as urlopen's); raises as urlopen does."""
    return _OPENER.open(urllib.request.Request(url, headers=headers or {}), timeout=timeout_s)


def get(url: str, *, timeout_s: float, headers: dict[str, str] | None = None) -> tuple[int, bytes] | None:
    """(status, body) of GET `url`, or None when nothing answered (refused, timed out,
    reset). An HTTP error status is an answer: (status, its body)."""
    try:
        with open_url(url, timeout_s=timeout_s, headers=headers) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, exc.read()
        except OSError:
            return exc.code, b""
    except (urllib.error.URLError, OSError, ValueError):
        return None
