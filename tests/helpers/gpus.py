"""A stand-in nvidia-smi (this machine has no GPU): `install(tmp_path, monkeypatch, mib)`
puts one on PATH that lists a GPU of `mib` MiB per entry, answering the query
filledfirst asks (index, name, memory, driver), and points the device locks
(filledfirst.engine.devices) at a folder of the test's, outside any batch job."""

from __future__ import annotations

import os
import sys
import textwrap

from filledfirst.engine import devices


def install(tmp_path, monkeypatch, mib: list[int]) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!{sys.executable}\n" + textwrap.dedent(f"""
        import sys
        cards = {list(mib)!r}
        if "--query-gpu=index,name,memory.total,driver_version" in sys.argv:
            print("\\n".join(f"{{i}}, NVIDIA Stand-in, {{m}}, 550.54" for i, m in enumerate(cards)))
        else:
            sys.exit(f"stand-in nvidia-smi: unexpected {{sys.argv[1:]}}")
    """))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(devices.VISIBLE, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(devices, "lock_dir", lambda: tmp_path / "locks")
