"""Snakemake's own lint of the workflow, less the one lint this workflow answers by design.

Every rule's command runs the interpreter Snakemake itself runs in (`python -m filledfirst`
of that environment: environment.yml, or the venv `make install` makes), so a rule has no
software of its own to name with `conda:` or `container:`; Snakemake lints every rule for
that. Any other lint fails.

    python tools/workflow_lint.py --configfile config/cpu.yaml
"""

from __future__ import annotations

import re
import subprocess
import sys

BY_DESIGN = "Specify a conda environment or container for each rule."


def lints(output: str) -> list[tuple[str, str]]:
    """(where, title) of every lint Snakemake printed."""
    found = []
    for block in re.split(r"\n(?=Lints for )", output):
        head = re.match(r"Lints for (.*?):\n", block)
        if head:
            found += [(head[1], title) for title in re.findall(r"^\s+\* (.*?):?$", block, re.M)]
    return found


def main(argv: list[str]) -> int:
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint", *argv], capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    found = lints(output)
    other = [(where, title) for where, title in found if title != BY_DESIGN]
    if other or (proc.returncode != 0 and not found):
        print(output, file=sys.stderr)
        return 1
    print(f"workflow lint clean ({len(found)} rules without a per-rule environment, by design)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
