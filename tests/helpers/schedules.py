"""A schedule file for `filledfirst replay --schedule` or a runner's Job: `n` probe requests
`gap_s` apart, each with the same prompt and output lengths."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from filledfirst.contracts.records import SCHEDULE_SCHEMA


def probe_schedule(path: Path, n: int, gap_s: float = 0.05, prompt: int = 8, output: int = 4) -> Path:
    pq.write_table(pa.table({
        "request_id": list(range(n)), "t_offset_s": [gap_s * i for i in range(n)],
        "prompt_tokens": [prompt] * n, "output_tokens": [output] * n, "role": ["probe"] * n,
        "prefix_blocks": [[]] * n, "block_tokens": [0] * n, "ideal_cached_tokens": [0] * n,
    }, schema=SCHEDULE_SCHEMA), path)
    return path
