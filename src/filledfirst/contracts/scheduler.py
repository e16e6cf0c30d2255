"""The scheduler's state at one scrape of one engine, engine-neutral: what it held, what
it could admit, who waited first, and what kept that request waiting (`Constraint`).
Table `scheduler_states` stores a row per scrape and engine
(filledfirst.analysis.diagnosis.scheduler builds it from an engine's samples and the
requests' server timings)."""

from __future__ import annotations

from enum import StrEnum

import msgspec


class Constraint(StrEnum):
    """What kept a waiting request from being admitted at a scrape, in the order the
    scheduler meets them (docs/diagnosis.md): a running request lost its blocks; the
    running set was at its cap; the head of the queue needed more free blocks than there
    were; the step's token budget was full; else it waited for the step in flight."""

    PREEMPTION = "preemption"
    CAP = "cap"
    KV = "KV blocks"
    BUDGET = "token budget"
    COMPUTE = "compute"


class SchedulerState(msgspec.Struct, frozen=True, kw_only=True):
    """One engine at one scrape. Counts over an interval are from the previous scrape
    (preempted) or to the next one (steps and tokens): what happened around the state.
    None where the engine did not say."""

    run_id: str
    t: float  # on the run's clock
    engine: str
    running: float | None
    waiting: float | None
    cap: int | None  # the running set's cap in effect (max_num_seqs, lowered where the engine lowers it)
    kv_pct: float | None
    blocks: int | None  # the KV cache's blocks
    blocks_free: int | None
    block_size: int | None
    budget: int | None  # tokens per step
    preempted: float | None  # since the previous scrape
    steps: float | None  # to the next scrape
    step_tokens: float | None  # the tokens those steps computed
    prompt_tokens: float | None  # of which prompt (prefill) tokens
    step_ms: float | None  # the interval over its steps
    head_request: int | None  # the request waiting longest (its server timings say when it was queued)
    head_blocks: int | None  # the blocks its whole prompt needs
    head_wait_s: float | None  # how long it had waited
    constraint: Constraint | None  # None: nothing waited
