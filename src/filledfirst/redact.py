"""Secrets out of everything a run stores or shows; what is sent to a server stays as it is.

A value is secret by its name: a name whose words include secret, password, passwd,
authorization or credential(s), or whose last word is key, token or apikey (`HF_TOKEN`,
`MY_SECRET_KEY`, `--api-key`, `Authorization`; not `prompt_token_ids`, `max_tokens` or
`api_key_env`, which name a variable and hold no secret). That covers environment
variables, `--flag value` and `--flag=value` pairs of a command line, and keys anywhere in
a document. A URL keeps its address and loses its user and password.

Free text (an error message quoting the server's log, the log itself) gets the same by
name where a secret stands beside its name, and loses every secret value already known,
however the text quotes it: what the runner passed to vLLM is known, so a log line that
prints its arguments in any format is cleaned too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MARK = "<redacted>"

_ANYWHERE = {"secret", "secrets", "password", "passwd", "authorization", "credential", "credentials"}
_LAST = {"key", "token", "apikey"}
# Known values shorter than this are not searched for in free text: a one-character
# "secret" would replace that character everywhere, and guards nothing.
_MIN_KNOWN = 4

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# A URL's user information: scheme://user[:password]@
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^/\s?#'\"<>]*)@")
# --name value / --name=value in text (a command line, a log line)
_FLAG = re.compile(r"(?<![\w-])(?P<name>--?[A-Za-z][\w.-]*)(?P<sep>=|\s+)(?P<value>[^\s'\",)\]}]+)")
# name=value, name: value, 'name': 'value', "name": ["value"], Authorization: Bearer value
_PAIR = re.compile(
    r"(?<![\w.-])(?P<name>[A-Za-z_][\w.-]*)(?P<q>['\"]?)(?P<sep>\s*[=:]\s*)(?P<open>[\['\"(]*)"
    r"(?P<value>(?:(?:Bearer|Basic|Token)\s+)?[^\s'\",)\]}]+)")


def is_secret_name(name: str) -> bool:
    words = [w.lower() for w in _WORD.findall(name)]
    return bool(words) and (words[-1] in _LAST or any(w in _ANYWHERE for w in words))


def redact_url(text: str) -> str:
    """A URL (or every URL in a text) without its user and password:
    http://user:pw@host:8000 -> http://host:8000."""
    return _USERINFO.sub(r"\g<scheme>", text)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with the value of every secret flag replaced (`--api-key X`,
    `--api-key=X`), URLs without credentials."""
    args = list(argv)
    out = [redact_url(a) for a in args]
    for i in range(len(args)):
        if (found := _secret_flag_value(args, i)) is not None:
            at, value = found
            out[at] = args[at][: len(args[at]) - len(value)] + MARK
    return out


def _secret_flag_value(args: list, i: int) -> tuple[int, str] | None:
    """Where the value of the secret flag `args[i]` is, and the value (`--api-key=X`: in
    the same element; `--api-key X`: the next one), if it is a secret flag with a value. A
    flag followed by another flag has none (vLLM's `--hf-token` alone means the token
    saved on disk)."""
    if not isinstance(args[i], str) or not args[i].startswith("-"):
        return None
    name, eq, value = args[i].partition("=")
    if not is_secret_name(name):
        return None
    if eq:
        return i, value
    following = args[i + 1] if i + 1 < len(args) else None
    return (i + 1, following) if isinstance(following, str) and not following.startswith("--") else None


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment variables with the value of each secret one replaced."""
    return {k: (MARK if is_secret_name(k) and v else v) for k, v in env.items()}


def secret_values(argv: Iterable[str] = (), env: Mapping[str, str] | None = None) -> frozenset[str]:
    """The secrets of a command and its environment, to find again in what the process
    writes (its log)."""
    return secrets_in(list(argv)) | secrets_in(dict(env or {}))


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """Free text without the `known` secret values, URL credentials and secrets standing
    beside their names."""
    for value in sorted({v for v in known if len(v) >= _MIN_KNOWN}, key=len, reverse=True):
        text = text.replace(value, MARK)
    text = _FLAG.sub(_hide, redact_url(text))
    return _PAIR.sub(_hide, text)


def redact_document(doc: Any, known: Iterable[str] = ()) -> Any:
    """A copy of a JSON-like document (run.json) with every value under a secret key, every
    secret flag's value in a list of strings and every URL's credentials replaced; the
    secrets found there (`secrets_in`) and `known` are then removed from all of its text as
    well: an error message quoting the server's log carries what the server was given."""
    return _walk(doc, secrets_in(doc) | {v for v in known if v})


def _hide(m: re.Match) -> str:
    if not is_secret_name(m["name"]) or m["value"] == MARK:
        return m[0]
    return m[0][: m.start("value") - m.start()] + MARK


def secrets_in(doc: Any) -> frozenset[str]:
    """The secret values a document holds: under secret keys, after secret flags in lists
    of strings, and the users and passwords of its URLs."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                if isinstance(k, str) and is_secret_name(k):
                    found.update(_strings(v))
                else:
                    visit(v)
        elif isinstance(node, (list, tuple)):
            items = list(node)
            for i, item in enumerate(items):
                if (flagged := _secret_flag_value(items, i)) is not None:
                    found.add(flagged[1])
                visit(item)
        elif isinstance(node, str):
            for m in _USERINFO.finditer(node):
                found.update(p for p in m["info"].split(":", 1) if p)

    visit(doc)
    return frozenset(v for v in found if v and v != MARK)


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, Mapping):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, (list, tuple)):
        return [s for v in node for s in _strings(v)]
    return []


def _walk(node: Any, known: frozenset[str]) -> Any:
    if isinstance(node, Mapping):
        return {k: (_mark(v) if isinstance(k, str) and is_secret_name(k) else _walk(v, known))
                for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        items = list(node)
        if all(isinstance(i, str) for i in items):
            items = redact_argv(items)
        return [_walk(i, known) for i in items]
    if isinstance(node, str):
        return redact_text(node, known)
    return node


def _mark(value: Any) -> Any:
    """What stands for a secret value: nothing set stays visibly unset, and a number or a
    flag keeps its type (a document's reader may rely on it; none is a credential)."""
    if value is None or isinstance(value, (bool, int, float)) or value in ("", [], {}):
        return value
    return MARK
