"""Each job's wall time in a study folder: its log's first to last timestamped line
(results/logs/*.log), and their sum.

    .venv/bin/python tools/job_times.py [FOLDER]    # FOLDER: the study's, . by default
"""

from __future__ import annotations

import re
import sys
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+")


def job_seconds(log: Path) -> tuple[float, datetime, datetime] | None:
    """(seconds, first, last) of a job's log; None when no line is timestamped."""
    stamps = [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
              for line in log.read_text(errors="replace").splitlines() if (m := STAMP.match(line))]
    return None if not stamps else ((stamps[-1] - stamps[0]).total_seconds(), stamps[0], stamps[-1])


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else ".")
    logs = sorted((folder / "results" / "logs").glob("*.log"))
    if not logs:
        print(f"no job logs in {folder / 'results' / 'logs'}", file=sys.stderr)
        return 1
    total = 0.0
    for log in logs:
        if (found := job_seconds(log)) is not None:
            seconds, first, last = found
            total += seconds
            print(f"{log.stem:50s} {seconds:7.0f} s  {first.time()} to {last.time()}")
    print(f"{'sum':50s} {total:7.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
