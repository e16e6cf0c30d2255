"""The paired check (filledfirst.frontier.paired) against the sequential comparison of two
searches, on a simulated engine whose speed wanders (helpers.sim_engine).

The case: a cap of 4 sequences fills first; doubling it moves the knee about +68 %,
doubling the KV budget (the control) moves nothing. Between the parent's search and the
intervention's the machine's speed changes by 1.5x, the way these VMs wander within a
search: slower before a relaxation is measured, faster before a control is (the
directions in which a sequential comparison errs). The paired check runs then, its
four blocks under a further drift of up to +-10 % across them and +-3 % of noise each.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from filledfirst.contracts.frontiers import Confirmation
from filledfirst.frontier.interventions import Move, Span, move
from filledfirst.frontier.paired import AFTER_PARENT, AFTER_RELAXED, Block, Side, measured, pairs, verdict
from filledfirst.frontier.plan import paired_requests

from helpers.sim_engine import Engine, knee, run

LAW = (4.0, 0.05, 0.25)  # ms a step, a token, a sequence
N = 200
PROMPTS, OUTPUTS = np.full(N, 150), np.full(N, 160)
TTFT_S, ITL_S, TARGET = 2.0, 1.0, 0.95
PARENT = Engine(LAW, cap=4, kv_tokens=10**6, budget=2048)
LEAST = 0.3  # interventions.min_shift's default
WANDER = 1.5


def at(engine: Engine, speed: float) -> Engine:
    return Engine(engine.law, engine.cap, engine.kv_tokens, engine.budget, speed=lambda t: speed)


def searched(engine: Engine, speed: float, seed: int) -> Span:
    """A search's knee on the engine at `speed`, to 2 %."""
    k = knee(at(engine, speed), PROMPTS, OUTPUTS, TTFT_S, ITL_S, TARGET, 2.0 * speed, 20.0 * speed, seed)
    return Span.of(k / 1.01, k * 1.01, k / 1.01)


def block(side: Side, engine: Engine, speed: float, concurrency: int, seed: int) -> Block:
    """A closed loop of `concurrency` on the engine at `speed`: its completions per second
    after the first batch and, from its steps, the share beyond the parent's limits and the
    share with a queue."""
    steps: list = []
    k = paired_requests(concurrency)  # the requests of a paired block
    reqs = run(at(engine, speed), 1.0, PROMPTS[:k], OUTPUTS[:k], seed=seed, concurrency=concurrency, steps=steps)
    done = sorted(r.finished for r in reqs)
    rps = (len(done) - concurrency) / (done[-1] - done[concurrency - 1])
    beyond = sum(1 for _, running, _, kv in steps if running > PARENT.cap or kv > PARENT.kv_tokens) / len(steps)
    queued = sum(1 for _, _, waiting, _ in steps if waiting) / len(steps)
    return Block(side, rps, beyond, queued)


def paired(relaxed: Engine, speeds: list[float], seed: int, order=AFTER_RELAXED) -> list[Block]:
    concurrency = max(PARENT.cap, relaxed.cap)
    return [block(side, relaxed if side is Side.RELAXED else PARENT, s, concurrency, seed + i)
            for i, (side, s) in enumerate(zip(order, speeds))]


RELAXED = {"seqs": Engine(LAW, cap=8, kv_tokens=10**6, budget=2048),
           "kv": Engine(LAW, cap=4, kv_tokens=2 * 10**6, budget=2048)}


def test_the_seeded_truth():
    """The case as the docstring says: at one speed the cap's relaxation moves the knee
    beyond the least shift and the control does not."""
    parent = searched(PARENT, 1.0, 0)
    assert move(parent, searched(RELAXED["seqs"], 1.0, 0), LEAST) is Move.UP
    assert move(parent, searched(RELAXED["kv"], 1.0, 0), LEAST) is Move.NO


# either order: after the intervention's own search (B A A B) or in its parent's job (A B B A)
@pytest.mark.parametrize("order", [AFTER_RELAXED, AFTER_PARENT])
def test_side_by_side_the_verdict_survives_a_wander_the_sequential_one_does_not(order):
    right = wrong_sequential = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        knob = "seqs" if seed % 2 == 0 else "kv"
        truth = Confirmation.CONFIRMED if knob == "seqs" else Confirmation.NOT_CONFIRMED
        speed = 1 / WANDER if knob == "seqs" else WANDER
        # today's: the parent searched at speed 1, the intervention after the wander
        sequential = move(searched(PARENT, 1.0, seed), searched(RELAXED[knob], speed, seed), LEAST)
        said = Confirmation.CONFIRMED if sequential is Move.UP else Confirmation.NOT_CONFIRMED
        wrong_sequential += said is not truth
        ramp = rng.uniform(-0.1, 0.1)
        speeds = [speed * (1 + ramp * i / 3) * rng.uniform(0.97, 1.03) for i in range(len(order))]
        right += verdict(paired(RELAXED[knob], speeds, seed * 10, order), LEAST).verdict is truth
    assert wrong_sequential == 20
    assert right >= 18


@pytest.mark.parametrize("order", [AFTER_RELAXED, AFTER_PARENT])
def test_a_steady_drift_falls_on_both_sides_of_the_pairs(order):
    # the same setting on both sides, the machine slowing 30 % across the four blocks:
    # each pair's ratio is off by the drift between its blocks, their mean is not
    speeds = [1.0, 0.9, 0.8, 0.7]
    blocks = [Block(side, 10.0 * s) for side, s in zip(order, speeds)]
    shift, lo, hi = measured(blocks)
    assert lo < -0.09 and hi > 0.09
    assert abs(shift) < 0.02


def test_a_relaxation_never_used_beyond_the_old_limit_is_not_confirmed():
    blocks = [Block(Side.RELAXED, 14.0, 0.0, 0.0), Block(Side.PARENT, 10.0, None, 0.5),
              Block(Side.PARENT, 10.0, None, 0.5), Block(Side.RELAXED, 14.0, 0.0, 0.0)]
    found = verdict(blocks, LEAST)
    assert found.verdict is Confirmation.NOT_CONFIRMED and found.used is False
    assert found.shift == pytest.approx(0.4)


def test_pairs_that_straddle_the_least_shift_are_inconclusive_and_a_failed_block_too():
    blocks = [Block(Side.RELAXED, 14.0, 0.5), Block(Side.PARENT, 10.0),
              Block(Side.PARENT, 10.0), Block(Side.RELAXED, 12.0, 0.5)]
    assert verdict(blocks, LEAST).verdict is Confirmation.INCONCLUSIVE
    failed = [*blocks[:3], Block(Side.RELAXED, None)]
    assert verdict(failed, LEAST).verdict is Confirmation.INCONCLUSIVE and verdict(failed, LEAST).shift is None


def test_a_move_the_scrapes_cannot_show_used_is_not_confirmed():
    blocks = [Block(Side.RELAXED, 14.0), Block(Side.PARENT, 10.0), Block(Side.PARENT, 10.0), Block(Side.RELAXED, 14.0)]
    found = verdict(blocks, LEAST)
    assert found.used is None and found.verdict is Confirmation.INCONCLUSIVE


def test_a_pair_is_one_block_of_each_side():
    with pytest.raises(ValueError, match="one of each side"):
        pairs([Block(Side.PARENT, 1.0), Block(Side.PARENT, 1.0)])
    assert math.isclose(measured([Block(Side.PARENT, 2.0), Block(Side.RELAXED, 3.0)])[0], 0.5)
