"""Popen recorded instead of run: what a process would have been started with."""

from __future__ import annotations


def record_popen(monkeypatch, module) -> list[tuple[list[str], dict]]:
    """Replace `module.subprocess.Popen` with a recorder; returns the calls, (args, kwargs) each."""
    calls: list[tuple[list[str], dict]] = []

    class Recorder:
        pid = 4242

        def __init__(self, args, **kw):
            calls.append((args, kw))

    monkeypatch.setattr(module.subprocess, "Popen", Recorder)
    return calls
