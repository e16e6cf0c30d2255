"""A non-editable install has everything a study needs: every module, the schema and the
shipped sections file, and nothing resolves against the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from conftest import REPO


def test_a_wheel_runs_a_study_config_from_anywhere(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
                            str(source), "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("filledfirst-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    package = REPO / "src" / "filledfirst"
    wanted = {f"filledfirst/{p.relative_to(package)}" for p in package.rglob("*")
              if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts}
    assert not wanted - shipped, f"missing from the wheel: {sorted(wanted - shipped)}"

    # The wheel's package alone on the path (not the checkout's), a shipped config copied
    # elsewhere, run from a third folder: its `sections: original-study.yaml` is the package's.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    study = tmp_path / "elsewhere" / "cpu.yaml"
    study.parent.mkdir()
    shutil.copy(REPO / "config" / "cpu.yaml", study)
    shutil.copy(REPO / "config" / "study.yaml", study.parent)  # the study it extends, beside it
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    code = ("import sys, filledfirst; from filledfirst.config import load_study\n"
            "assert filledfirst.__file__.startswith(sys.argv[2]), filledfirst.__file__\n"
            "print(sorted(load_study([sys.argv[1]]).sections))")
    ran = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); " + code,
                          str(study), str(site)], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "interference" in ran.stdout and "sequence_limit" in ran.stdout
