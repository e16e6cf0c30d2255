"""Arrival processes: the gaps between requests of a phase, seeded so a workload is fixed.

`interval_s` is the mean gap in every process; what changes is how gaps scatter around it:
- constant: every gap equals the mean (the seed study's synthetic workloads);
- poisson: exponential gaps (independent arrivals, coefficient of variation 1);
- gamma: gamma gaps with a chosen coefficient of variation `cv` (>1 is burstier than
  Poisson, <1 more regular), as serving papers use to model bursty traffic.
"""

from __future__ import annotations

import numpy as np

PROCESSES = ("constant", "poisson", "gamma")


def arrival_times(count: int, start_s: float, interval_s: float, process: str = "constant",
                  cv: float = 1.0, seed: int = 0) -> np.ndarray:
    if process not in PROCESSES:
        raise ValueError(f"arrival process {process!r} is not one of {PROCESSES}")
    if process == "constant" or interval_s == 0 or count <= 1:
        # start + k*interval rather than a running sum, so no error accumulates.
        return start_s + interval_s * np.arange(count, dtype=np.float64)
    rng = np.random.default_rng(seed)
    if process == "poisson":
        gaps = rng.exponential(interval_s, size=count - 1)
    else:
        shape = 1.0 / (cv * cv)  # gamma's cv is 1/sqrt(shape); mean = shape * scale
        gaps = rng.gamma(shape, interval_s / shape, size=count - 1)
    # The first request arrives at start_s, as in the constant process.
    return start_s + np.concatenate([[0.0], np.cumsum(gaps)])
