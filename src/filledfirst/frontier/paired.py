"""The paired check of an intervention: its setting and its parent's, side by side.

Two searches run one after the other compare knees measured minutes apart, on a machine
whose speed wanders: a control can move by itself, a relaxation can hide. The paired check
measures both settings in alternating blocks, parent (A) and relaxed (B), starting on the
server that is running: B A A B after the intervention's own search (`AFTER_RELAXED`),
A B B A in its parent's job, right after the parent's search (`AFTER_PARENT`, the
intervention judged side by side alone). Each block is a closed loop of the same requests
at the same concurrency, enough sequences to fill the larger of the two limits, so each
measures the completions per second its setting sustains on the machine as it is then.
Adjacent blocks form pairs: within a pair the machine's speed is about the same, and across
the two a steady drift falls once before and once after, so the geometric mean of the
pairs' ratios is the shift with the drift taken out (`measured`).

The verdict (`verdict`) rests on that shift and on what does not depend on speed: whether the
relaxed setting used its relaxed resource beyond the parent's limit (sequences running
above the parent's cap, KV tokens held above its budget). Confirmed: every pair moved by
at least the least shift and the resource was used beyond the old limit; not confirmed:
no pair moved by the least shift, or the resource was never used beyond it (the limit did
not hold the server back); inconclusive otherwise (the pairs straddle the least shift, a
block failed, or the scrapes cannot tell). Whether the queue share fell is reported
beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from filledfirst.contracts.frontiers import Confirmation
from filledfirst.contracts.search import PairedCheck, Side

# Either way the server running first serves blocks 1 and 4, the other blocks 2 and 3 on one start.
AFTER_RELAXED = (Side.RELAXED, Side.PARENT, Side.PARENT, Side.RELAXED)
AFTER_PARENT = (Side.PARENT, Side.RELAXED, Side.RELAXED, Side.PARENT)


@dataclass(frozen=True, slots=True)
class Block:
    """One block's evidence: the side it measured, its completions per second (None: the
    block failed), the share of its scrapes with the relaxed resource beyond the parent's
    limit, and the share with requests waiting (None: not scraped)."""

    side: Side
    throughput_rps: float | None
    beyond_share: float | None = None
    queue_share: float | None = None


@dataclass(frozen=True, slots=True)
class PairedVerdict:
    """The verdict and what it rests on (None where a block failed or nothing was scraped)."""

    verdict: Confirmation
    least_shift: float
    shift: float | None = None  # relaxed over parent, the pairs' geometric mean, minus one
    shift_lo: float | None = None  # the smallest pair's shift
    shift_hi: float | None = None  # the largest pair's
    used: bool | None = None  # the relaxed resource used beyond the parent's limit in some relaxed block
    fell: bool | None = None  # every relaxed block's queue share below every parent block's


def blocks_of(check: PairedCheck) -> list[Block]:
    """A search.json's paired check as the verdict reads it."""
    return [Block(b.side, b.loop.throughput_rps, b.beyond_share, b.queue_share) for b in check.blocks]


def pairs(blocks: list[Block]) -> list[tuple[Block, Block]]:
    """The adjacent (parent, relaxed) pairs of blocks in either order (repeated): blocks 1-2, 3-4, ..."""
    out = []
    for first, second in zip(blocks[::2], blocks[1::2]):
        if {first.side, second.side} != {Side.PARENT, Side.RELAXED}:
            raise ValueError(f"blocks {first.side}, {second.side}: a pair is one of each side")
        out.append((first, second) if first.side is Side.PARENT else (second, first))
    return out


def measured(blocks: list[Block]) -> tuple[float, float, float] | None:
    """(shift, lowest pair's shift, highest pair's) of relaxed over parent; None when a
    block measured nothing."""
    ratios = []
    for parent, relaxed in pairs(blocks):
        if not parent.throughput_rps or relaxed.throughput_rps is None:
            return None
        ratios.append(relaxed.throughput_rps / parent.throughput_rps)
    if not ratios:
        return None
    mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if all(r > 0 for r in ratios) else 0.0
    return mean - 1, min(ratios) - 1, max(ratios) - 1


def verdict(blocks: list[Block], least_shift: float) -> PairedVerdict:
    """The paired check's verdict (module doc); `least_shift`: the least shift that counts
    as a move."""
    found = measured(blocks)
    if found is None:
        return PairedVerdict(Confirmation.INCONCLUSIVE, least_shift)
    shift, lo, hi = found
    beyond = [b.beyond_share for b in blocks if b.side is Side.RELAXED and b.beyond_share is not None]
    used = None if not beyond else max(beyond) > 0
    queues = {side: [b.queue_share for b in blocks if b.side is side and b.queue_share is not None] for side in Side}
    fell = (None if not queues[Side.PARENT] or not queues[Side.RELAXED]
            else max(queues[Side.RELAXED]) < min(queues[Side.PARENT]))
    if used is False or hi < least_shift:
        said = Confirmation.NOT_CONFIRMED
    elif lo >= least_shift and used:
        said = Confirmation.CONFIRMED
    else:
        said = Confirmation.INCONCLUSIVE
    return PairedVerdict(said, least_shift, shift, lo, hi, used, fell)
