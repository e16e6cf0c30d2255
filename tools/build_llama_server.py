"""Build llama.cpp's server from the tree the llama-cpp-python source package carries, once.

    python tools/build_llama_server.py [--prefix .venv]

Installs `<prefix>/bin/llama-server` (linked statically: no shared libraries to find) and
`<prefix>/share/llama.cpp/` (the tree's `convert_hf_to_gguf.py` with its `conversion` and
`gguf-py`, which write a model as GGUF). The build is kept in `~/.cache/filledfirst/llama.cpp/<version>-<cpu>/`
(XDG_CACHE_HOME respected) and reused: a second install, or a second checkout on the same
machine, builds nothing. It is built for this CPU (GGML_NATIVE), so the cache is keyed on the
CPU's flags: machines of this kind differ (AVX-512 or not), and a binary built on one can
stop with an illegal instruction on another.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python's source package: the llama.cpp tree it vendors
CMAKE_OPTIONS = (
    "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF",
)


def cpu_key() -> str:
    """The CPU's instruction-set flags and the build's options, hashed: what a native build
    depends on."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                break
    except OSError:
        pass
    return hashlib.sha256(f"{platform.machine()} {flags} {CMAKE_OPTIONS}".encode()).hexdigest()[:12]


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "filledfirst" / "llama.cpp" / f"{VERSION}-{cpu_key()}"


def _run(argv: list[str], cwd: Path | None = None) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, cwd=cwd, check=True)


def build(into: Path) -> None:
    """Download the source package, build llama-server, and move the result to `into`
    whole (a half-built cache is never seen)."""
    jobs = str(os.cpu_count() or 2)
    with tempfile.TemporaryDirectory(prefix="llama-build-") as tmp_name:
        tmp = Path(tmp_name)
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
              f"llama-cpp-python=={VERSION}", "-d", str(tmp)])
        sdist = next(tmp.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            # the safe filter where this Python has it (3.11.4 on)
            tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        tree = next(tmp.glob("llama_cpp_python-*/vendor/llama.cpp"))
        _run(["cmake", "-S", str(tree), "-B", str(tree / "build"), *CMAKE_OPTIONS])
        _run(["cmake", "--build", str(tree / "build"), "--target", "llama-server", "-j", jobs])
        staged = Path(tempfile.mkdtemp(prefix=".staging-", dir=into.parent))
        try:
            _stage(tree, staged)
            staged.rename(into)
        except OSError:
            if not (into / "bin" / "llama-server").is_file():  # not another install's finished build
                raise
        finally:
            shutil.rmtree(staged, ignore_errors=True)


def _stage(tree: Path, staged: Path) -> None:
    """The built server and the converter, laid out as the cache keeps them."""
    (staged / "bin").mkdir()
    shutil.copy2(tree / "build" / "bin" / "llama-server", staged / "bin" / "llama-server")
    share = staged / "share" / "llama.cpp"
    share.mkdir(parents=True)
    shutil.copy2(tree / "convert_hf_to_gguf.py", share / "convert_hf_to_gguf.py")
    for part in ("conversion", "gguf-py"):  # the converter's model classes, and its GGUF writer
        shutil.copytree(tree / part, share / part)
    (staged / "VERSION").write_text(f"llama-cpp-python {VERSION}\n")
    staged.chmod(0o755)  # mkdtemp made it private


def install(prefix: Path) -> Path:
    cached = cache_dir()
    if not (cached / "bin" / "llama-server").is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        print(f"building llama-server (llama.cpp of llama-cpp-python {VERSION}) into {cached}: "
              "6-11 min on 2 cores; it needs cmake, ninja, a C++ compiler and the package registry", flush=True)
        build(cached)
        print(f"built in {time.monotonic() - start:.0f} s", flush=True)
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    target = prefix / "bin" / "llama-server"
    tmp = target.with_name(".llama-server.tmp")
    shutil.copy2(cached / "bin" / "llama-server", tmp)
    tmp.replace(target)
    share = prefix / "share" / "llama.cpp"
    if share.exists():
        shutil.rmtree(share)
    shutil.copytree(cached / "share" / "llama.cpp", share)
    shutil.copy2(cached / "VERSION", share / "VERSION")  # the engine's version in every run's identity
    print(f"llama-server: {target}")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=Path, default=Path(sys.prefix))
    install(parser.parse_args().prefix.resolve())


if __name__ == "__main__":
    main()
