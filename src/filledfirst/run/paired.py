"""An intervention's paired check (filledfirst.frontier.paired): closed loops of the same
requests on the intervention's server and on its parent's, in blocks, one server running at
a time: the other stopped, or paused while a later block needs it (`engine.pause_between_blocks`:
then each side starts once). At the end of the intervention's own search's job the blocks go B A A B (its server
is up; the parent's runs blocks 2 and 3); in the parent's job, for an intervention judged
side by side alone, A B B A after the parent's search. Each block is an ordinary run
folder in the intervention's folder, `DIR/paired<i>-<side>`, not ingested (search.json
keeps what each measured, `paired`), read back when an interrupted job runs again with
the same spec, as the capacity estimate is.

From each block's scrapes (its samples.parquet) come the shares the verdict needs that do
not depend on speed: the scrapes with the relaxed resource beyond the parent's limit in
some engine (sequences running above the parent's cap; KV tokens held above its budget)
and those with requests waiting, both of the scrapes with anything running or waiting.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import duckdb

from filledfirst import metrics
from filledfirst.contracts.search import Intervention, Knob, PairedBlock, PairedCheck, Side
from filledfirst.frontier.plan import paired_requests
from filledfirst.run import folder

log = logging.getLogger(__name__)

PAIRED_PREFIX = "paired"


def block_dir_name(block: int, side: Side) -> str:
    return f"{PAIRED_PREFIX}{block}-{side}"


def block_evidence(run_dir: Path, knob: Knob, before: int) -> tuple[float | None, float | None]:
    """(beyond share, queue share) of a block's scrapes (module doc); None without busy
    scrapes, and a beyond share of None when they do not say the resource (a KV budget
    needs the cache settings)."""
    path = str(Path(run_dir) / folder.SAMPLES).replace("'", "''")
    # a data-parallel server's cache settings carry every engine's blocks, on each engine's series
    held = "running" if knob is Knob.SEQS else "kv_used * (blocks / engines.n) * block_size"
    state = metrics.scheduler_state_sql(f"SELECT 'block' AS run_id, * FROM read_parquet('{path}')")
    con = duckdb.connect()
    try:
        rows = con.execute(f"""
        WITH state AS ({state}),
             engines AS (SELECT count(DISTINCT engine) AS n FROM state),
             scrape AS (SELECT t, sum(running) + sum(waiting) AS load, sum(waiting) AS waiting,
                               bool_or({held} > {int(before)}) AS beyond
                        FROM state, engines GROUP BY t)
        SELECT count(*) FILTER (load > 0), count(*) FILTER (load > 0 AND beyond IS NOT NULL),
               count(*) FILTER (load > 0 AND beyond), count(*) FILTER (load > 0 AND waiting > 0)
        FROM scrape""").fetchall()
    finally:
        con.close()
    busy, known, beyond, queued = rows[0]
    if not busy:
        return None, None
    return (beyond / known if known else None), queued / busy


def block_dirs(out: Path, order: tuple[Side, ...]) -> list[Path]:
    """The paired check's block folders in an intervention's folder, in `order`."""
    return [Path(out) / block_dir_name(i, side) for i, side in enumerate(order, 1)]


def all_blocks(out: Path) -> list[Path]:
    """Every paired block folder in an intervention's folder, of either order."""
    return sorted(Path(out).glob(f"{PAIRED_PREFIX}[0-9]*-*"))


def _whole_pairs(out: Path, order: tuple[Side, ...]) -> None:
    """Remove both blocks of a pair of which one did not finish (an interrupted job): the
    blocks of a pair are measured one right after the other, or not reused. Blocks of the
    other order (the check moved between jobs) go too."""
    dirs = block_dirs(out, order)
    for stale in set(all_blocks(out)) - set(dirs):
        shutil.rmtree(stale, ignore_errors=True)
    for pair in zip(dirs[::2], dirs[1::2]):
        if not all((d / folder.RUN_JSON).is_file() for d in pair):
            for d in pair:
                shutil.rmtree(d, ignore_errors=True)


def run_paired(prober, parent, relaxed: Intervention, n: int, order: tuple[Side, ...]) -> PairedCheck:
    """The paired check of the intervention `prober` measures against `parent`, the prober
    of the setting it relaxes, in closed loops of `n` (`concurrency`), in `order`
    (frontier.paired: the side whose server is up first). The caller closes the prober it
    opened for the check."""
    plan, setting = prober.plan, prober.setting
    _whole_pairs(prober.out, order)
    pause = parent.study.engine.pause_between_blocks
    blocks = []
    for i, side in enumerate(order, 1):
        who, other, other_side = ((prober, parent, Side.PARENT) if side is Side.RELAXED
                                  else (parent, prober, Side.RELAXED))
        # one engine running at a time: the other paused when a later block needs it again
        if pause and other_side in order[i:]:
            other.shared.pause()
        else:
            other.shared.stop()
        tag = block_dir_name(i, side)
        log.info("%s/%s: paired check, block %d of %d: %s (%s)", plan.name, setting, i, len(order), side, who.setting)
        loop = who.reference(tag, n, into=prober.out, requests=paired_requests(n))
        beyond, queued = (block_evidence(prober.out / tag, relaxed.knob, relaxed.before)
                          if loop.status != "failed" else (None, None))
        blocks.append(PairedBlock(side=side, loop=loop, beyond_share=beyond, queue_share=queued))
    return PairedCheck(concurrency=n, blocks=blocks)
