"""The order of a paired check's blocks and its servers (filledfirst.run.paired.run_paired),
on stand-in probers: the thing under test is which server runs each block, that only one
runs at a time, that the parent's is stopped whatever happens, and which blocks are reused."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from filledfirst.contracts.search import Intervention, Knob, Reference
from filledfirst.run.paired import block_dirs, run_paired


@dataclass
class Plan:
    name: str = "knee"


@dataclass
class Shared:
    setting: str
    events: list

    def stop(self) -> None:
        self.events.append(("stop", self.setting))


@dataclass
class Prober:
    setting: str
    out: Path
    events: list
    fail_at: str | None = None
    plan: Plan = field(default_factory=Plan)

    def __post_init__(self) -> None:
        self.shared = Shared(self.setting, self.events)

    def reference(self, tag: str, n: int) -> Reference:
        if tag == self.fail_at:
            raise KeyboardInterrupt
        self.events.append(("loop", self.setting, tag, n))
        return Reference(run_dir=tag, run_id=tag, status="failed", concurrency=n)

    def close(self) -> None:
        self.events.append(("close", self.setting))


RELAXED = Intervention(parent="seq2", knob=Knob.SEQS, before=2, after=4, changes={"max_num_seqs": 4}, paired=True)


def test_blocks_run_relaxed_parent_parent_relaxed_one_server_at_a_time(tmp_path):
    events: list = []
    check = run_paired(Prober("seq2_seqs_x2", tmp_path, events), Prober("seq2", tmp_path, events), RELAXED, 4)
    assert [e for e in events if e[0] == "loop"] == [
        ("loop", "seq2_seqs_x2", "paired1-relaxed", 4), ("loop", "seq2", "paired2-parent", 4),
        ("loop", "seq2", "paired3-parent", 4), ("loop", "seq2_seqs_x2", "paired4-relaxed", 4)]
    # before each block the other side's server is stopped; the parent's at the end
    assert events[0] == ("stop", "seq2") and events[2] == ("stop", "seq2_seqs_x2")
    assert events[-1] == ("close", "seq2")
    assert [b.side for b in check.blocks] == ["relaxed", "parent", "parent", "relaxed"]
    assert all(b.beyond_share is None for b in check.blocks)  # a failed loop has no evidence


def test_the_parents_server_is_stopped_on_an_interrupt(tmp_path):
    events: list = []
    with pytest.raises(KeyboardInterrupt):
        run_paired(Prober("x", tmp_path, events), Prober("seq2", tmp_path, events, fail_at="paired3-parent"),
                   RELAXED, 4)
    assert events[-1] == ("close", "seq2")


def test_a_pair_with_an_unfinished_block_is_measured_again_whole(tmp_path):
    dirs = block_dirs(tmp_path)
    for d in dirs:
        d.mkdir()
    for d in (dirs[0], dirs[2], dirs[3]):  # block 2 was interrupted
        (d / "run.json").write_text("{}")
    run_paired(Prober("x", tmp_path, []), Prober("seq2", tmp_path, []), RELAXED, 4)
    assert not dirs[0].exists() and not dirs[1].exists() and dirs[2].exists() and dirs[3].exists()
