"""The one deadline of a run: when the replay stops waiting, and what a batch system
budgets for it (filledfirst.cluster). One definition, so a job's time limit is never
shorter than the run it holds.

- Open loop: the last scheduled arrival plus `drain_timeout_s` (the requests still open
  then are cancelled as timeouts).
- Closed loop: `concurrency` workers each send their next request when the last one
  ended, so one worker sends at most ceil(n / concurrency) requests one after another,
  each bounded by `request_timeout_s`: that is the longest the run can take by its own
  per-request limits, and its deadline. A run the request timeouts allow is never cut,
  and against a hung server the run costs what the batch system was told.
"""

from __future__ import annotations

import math


def run_deadline_s(mode: str, n_requests: int, concurrency: int | None, last_arrival_s: float,
                   request_timeout_s: float, drain_timeout_s: float) -> float:
    """Seconds from the run's start (its clock's zero) to its deadline."""
    if mode == "closed":
        if not concurrency or concurrency < 1:
            raise ValueError(f"a closed loop needs a concurrency of at least 1, got {concurrency!r}")
        return math.ceil(n_requests / concurrency) * float(request_timeout_s)
    return float(last_arrival_s) + float(drain_timeout_s)
