import os
import sys
from pathlib import Path

import pytest

from filledfirst.config import deep_merge

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# A config layered over every engine test's own (a larger tiny model, other server
# settings): how the suite is run against a slower or faster server, to show that no
# engine test depends on how fast this machine is. Unset: the tests' configs as they are.
ENGINE_OVERLAY = "FILLEDFIRST_TEST_ENGINE_CONFIG"


def engine_overlay_files() -> list[Path]:
    path = os.environ.get(ENGINE_OVERLAY)
    return [Path(path).resolve()] if path else []


def engine_overlay() -> dict:
    import yaml

    out: dict = {}
    for path in engine_overlay_files():
        out = deep_merge(out, yaml.safe_load(path.read_text()) or {})
    return out


def with_engine_overlay(cfg: dict) -> dict:
    return deep_merge(cfg, engine_overlay())


def build_test_model(out: Path) -> None:
    """The tiny model in the shape the overlay asks for (default: the usual tiny one)."""
    from filledfirst.model.tiny import build_tiny_model

    build_tiny_model(out, **engine_overlay().get("model", {}).get("tiny", {}))


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
        "--snakefile", str(REPO / "workflow" / "Snakefile"),
        "--directory", str(workdir),
        "--cores", "1",
        *targets,
        "--configfile", str(configfile), *map(str, engine_overlay_files()),
    ]


def mirrored(file: str) -> Path:
    """A trace file from the mirror (never committed); the test is skipped without it."""
    mirror = trace_mirror()
    hits = sorted(mirror.rglob(file)) if mirror else []
    if not hits:
        pytest.skip(f"{file} not found under $FILLEDFIRST_TRACE_MIRROR or ../shared/data")
    return hits[0]


@pytest.fixture(scope="session")
def conv_trace() -> Path:
    """The real 2023 Azure conversation trace."""
    return mirrored("AzureLLMInferenceTrace_conv.csv")


@pytest.fixture(scope="session")
def mooncake_trace() -> Path:
    """The Mooncake conversation trace (FAST'25)."""
    return mirrored("conversation_trace.jsonl")


@pytest.fixture
def chromium() -> Path:
    """Headless Chromium for the browser tests (helpers/chromium.py runs it)."""
    from helpers.chromium import CHROMIUM

    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} missing in CI: apt-get install chromium")
        pytest.skip(f"{CHROMIUM} not installed")
    return CHROMIUM


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


@pytest.fixture(autouse=True)
def no_interrupt_left_behind(monkeypatch):
    """An interrupt a test provokes is noted for the whole process (so the runner can tell
    the pipeline the job is not done); it must not end the next test's runs."""
    from filledfirst import interrupts

    monkeypatch.setattr(interrupts, "_interrupt_reason", None)
