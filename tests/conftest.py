import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def trace_mirror() -> Path | None:
    """Where the offline copies of the Azure traces are (the Makefile exports it)."""
    env = os.environ.get("FILLEDFIRST_TRACE_MIRROR")
    for candidate in (Path(env) if env else None, SHARED_DATA):
        if candidate and candidate.is_dir():
            return candidate
    return None


def snakemake_argv(workdir: Path, configfile: Path, *targets: str) -> list[str]:
    return [
        sys.executable, "-m", "snakemake",
        "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(workdir),
        "--cores", "1",
        *targets,
        "--configfile", str(configfile),
    ]


@pytest.fixture(scope="session")
def conv_trace() -> Path:
    """The real 2023 Azure conversation trace, from the mirror (never committed)."""
    mirror = trace_mirror()
    hits = sorted(mirror.rglob("AzureLLMInferenceTrace_conv.csv")) if mirror else []
    if not hits:
        pytest.skip("AzureLLMInferenceTrace_conv.csv not found under $FILLEDFIRST_TRACE_MIRROR or ../shared/data")
    return hits[0]


@pytest.fixture
def pipeline_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    mirror = trace_mirror()
    if mirror is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have the trace mirror (../shared/data beside the clone)")
        pytest.skip("no trace mirror: set FILLEDFIRST_TRACE_MIRROR to a folder holding AzureLLMInferenceTrace_conv.csv")
    env["FILLEDFIRST_TRACE_MIRROR"] = str(mirror)
    env["HF_HUB_OFFLINE"] = "1"
    return env
