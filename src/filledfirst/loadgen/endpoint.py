"""Is there a server at the URL, and does it take our key? Asked once, before the schedule
starts, of an endpoint nobody started here: a wrong URL, port or key then fails in a
second with its reason, instead of after the whole schedule as a run of failed requests.

A server the study starts needs no check: it is waited for until /health answers."""

from __future__ import annotations

import http.client
import socket
import urllib.error

from filledfirst import direct_http
from filledfirst.errors import UserError
from filledfirst.redact import redact_text, redact_url

CHECK_TIMEOUT_S = 5.0
_BODY_MAX = 200


class EndpointError(UserError):
    """The endpoint cannot be replayed against; the message is one line saying why."""


def check_endpoint(base_url: str, api_key: str | None = None, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """GET /v1/models, with the API key when there is one (vLLM guards every /v1 path with
    it): 200 is a server to replay against. A server that lists no models (404) passes
    when its /health answers 200. Anything else raises EndpointError; neither the key nor
    the URL's user and password appear in a message. Those are not sent either: the replay
    does not send them (filledfirst.run.runner)."""
    base_url = redact_url(base_url.rstrip("/"))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    status, body = _get(base_url, "/v1/models", headers, timeout_s)
    body = redact_text(body, [api_key] if api_key else [])  # a server may quote what it was sent
    if status == 200:
        return
    if status in (401, 403):
        if api_key:
            raise EndpointError(f"{base_url} refused the API key (HTTP {status} from /v1/models)")
        raise EndpointError(f"{base_url} wants an API key (HTTP {status} from /v1/models): "
                            "name the environment variable that holds it (--api-key-env, server.api_key_env)")
    if status == 404:
        health, _ = _get(base_url, "/health", headers, timeout_s)
        if health == 200:
            return
        raise EndpointError(f"{base_url} does not look like an OpenAI-compatible server "
                            f"(HTTP 404 from /v1/models, HTTP {health} from /health)")
    raise EndpointError(f"{base_url} is not ready: HTTP {status} from /v1/models" + (f": {body}" if body else ""))


def _get(base_url: str, path: str, headers: dict, timeout_s: float) -> tuple[int, str]:
    """(HTTP status, the start of the body's first line); unreachable raises EndpointError."""
    try:
        with direct_http.open_url(base_url + path, timeout_s=timeout_s, headers=headers) as resp:
            return resp.status, ""
    except urllib.error.HTTPError as exc:
        try:
            text = exc.read(4096).decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            text = ""
        lines = text.strip().splitlines()
        return exc.code, (lines[0][:_BODY_MAX] if lines else "")
    except urllib.error.URLError as exc:
        raise EndpointError(f"cannot reach {base_url}: {_why(exc.reason, timeout_s)}") from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise EndpointError(f"cannot reach {base_url}: {_why(exc, timeout_s)}") from None


def _why(reason: object, timeout_s: float) -> str:
    if isinstance(reason, http.client.RemoteDisconnected):
        return "the server closed the connection without an answer"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (is the server running, on this host and port?)"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"no answer within {timeout_s:g} s"
    if isinstance(reason, socket.gaierror):
        return f"unknown host ({reason.strerror or reason})"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror[0].lower() + reason.strerror[1:]
    return str(reason) or type(reason).__name__
