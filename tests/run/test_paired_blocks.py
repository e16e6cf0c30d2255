"""The order of a paired check's blocks and its servers (filledfirst.run.paired.run_paired),
on stand-in probers: the thing under test is which server runs each block, that only one
runs at a time (the other stopped, or paused while a later block needs it), that every
block goes in the intervention's folder, and which blocks are reused."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from filledfirst.contracts.search import Intervention, Knob, Reference
from filledfirst.frontier.paired import AFTER_PARENT, AFTER_RELAXED
from filledfirst.run.paired import block_dirs, run_paired


@dataclass
class Plan:
    name: str = "knee"


@dataclass
class Engine:
    pause_between_blocks: bool = False


@dataclass
class Study:
    engine: Engine


@dataclass
class Shared:
    setting: str
    events: list

    def stop(self) -> None:
        self.events.append(("stop", self.setting))

    def pause(self) -> None:
        self.events.append(("pause", self.setting))


@dataclass
class Prober:
    setting: str
    out: Path
    events: list
    plan: Plan = field(default_factory=Plan)
    pause: bool = False

    def __post_init__(self) -> None:
        self.study = Study(Engine(self.pause))
        self.shared = Shared(self.setting, self.events)

    def reference(self, tag: str, n: int, into: Path, requests: int) -> Reference:
        self.events.append(("loop", self.setting, tag, n, into, requests))
        return Reference(run_dir=tag, run_id=tag, status="failed", concurrency=n)

    def close(self) -> None:
        self.events.append(("close", self.setting))


RELAXED = Intervention(parent="seq2", knob=Knob.SEQS, before=2, after=4, changes={"max_num_seqs": 4}, paired=True)


def test_after_its_own_search_blocks_run_relaxed_parent_parent_relaxed_one_server_at_a_time(tmp_path):
    events: list = []
    out = tmp_path / "seq2_seqs_x2"
    check = run_paired(Prober("seq2_seqs_x2", out, events), Prober("seq2", tmp_path / "seq2", events), RELAXED, 4,
                       AFTER_RELAXED)
    # each 14 rounds of 4 (filledfirst.frontier.plan.paired_requests), in the intervention's folder
    assert [e for e in events if e[0] == "loop"] == [
        ("loop", "seq2_seqs_x2", "paired1-relaxed", 4, out, 56), ("loop", "seq2", "paired2-parent", 4, out, 56),
        ("loop", "seq2", "paired3-parent", 4, out, 56), ("loop", "seq2_seqs_x2", "paired4-relaxed", 4, out, 56)]
    # before each block the other side's server is stopped; the caller closes what it opened
    assert [e for e in events if e[0] == "stop"] == [("stop", s) for s in ("seq2", "seq2_seqs_x2", "seq2_seqs_x2",
                                                                           "seq2")]
    assert not [e for e in events if e[0] == "close"]
    assert [b.side for b in check.blocks] == ["relaxed", "parent", "parent", "relaxed"]
    assert all(b.beyond_share is None for b in check.blocks)  # a failed loop has no evidence


def test_in_its_parents_job_blocks_run_parent_relaxed_relaxed_parent_into_the_interventions_folder(tmp_path):
    events: list = []
    out = tmp_path / "seq2_seqs_x2"
    check = run_paired(Prober("seq2_seqs_x2", out, events), Prober("seq2", tmp_path / "seq2", events), RELAXED, 4,
                       AFTER_PARENT)
    assert [e[1:4] for e in events if e[0] == "loop"] == [
        ("seq2", "paired1-parent", 4), ("seq2_seqs_x2", "paired2-relaxed", 4),
        ("seq2_seqs_x2", "paired3-relaxed", 4), ("seq2", "paired4-parent", 4)]
    assert {e[4] for e in events if e[0] == "loop"} == {out}
    # the parent's server (up after its search) first; the intervention's stopped before block 4
    assert events[0] == ("stop", "seq2_seqs_x2") and events[-2] == ("stop", "seq2_seqs_x2")
    assert [b.side for b in check.blocks] == ["parent", "relaxed", "relaxed", "parent"]
    assert not [e for e in events if e[0] == "pause"]


def test_paused_the_other_side_waits_for_its_next_block_and_each_side_starts_once(tmp_path):
    """engine.pause_between_blocks: the side not measured is paused while a later block needs
    it (its next `reference` resumes it), stopped once none does."""
    for order, first, second in ((AFTER_PARENT, "seq2", "seq2_seqs_x2"), (AFTER_RELAXED, "seq2_seqs_x2", "seq2")):
        events: list = []
        run_paired(Prober("seq2_seqs_x2", tmp_path / "x", events), Prober("seq2", tmp_path, events, pause=True),
                   RELAXED, 4, order)
        # the first block's other side is not up yet (pausing it does nothing); block 2 pauses
        # the first side, block 4 stops the second for good
        assert [e[:2] for e in events if e[0] in ("pause", "stop")] == [
            ("pause", second), ("pause", first), ("pause", first), ("stop", second)]


def test_a_pair_with_an_unfinished_block_is_measured_again_whole(tmp_path):
    dirs = block_dirs(tmp_path, AFTER_RELAXED)
    for d in dirs:
        d.mkdir()
    for d in (dirs[0], dirs[2], dirs[3]):  # block 2 was interrupted
        (d / "run.json").write_text("{}")
    run_paired(Prober("x", tmp_path, []), Prober("seq2", tmp_path, []), RELAXED, 4, AFTER_RELAXED)
    assert not dirs[0].exists() and not dirs[1].exists() and dirs[2].exists() and dirs[3].exists()


def test_blocks_of_the_other_order_go(tmp_path):
    """A check that moved between jobs (interventions.search changed) measures its own blocks:
    the other order's are no block of it."""
    old = block_dirs(tmp_path, AFTER_RELAXED)
    for d in old:
        d.mkdir()
        (d / "run.json").write_text("{}")
    kept = block_dirs(tmp_path, AFTER_PARENT)
    kept[0].mkdir()
    (kept[0] / "run.json").write_text("{}")
    kept[1].mkdir()
    (kept[1] / "run.json").write_text("{}")
    run_paired(Prober("x", tmp_path, []), Prober("seq2", tmp_path, []), RELAXED, 4, AFTER_PARENT)
    assert not any(d.exists() for d in old) and kept[0].exists() and kept[1].exists()
