"""A replay split across worker processes (filledfirst.loadgen.workers), against the loopback
test double (the thing under test is our client): every request sent once, at its
scheduled time, on one clock; the merged run the same in shape as one process's;
interrupts and a dying worker lose nothing and leave no process."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from filledfirst.contracts.records import ScheduledRequest
from filledfirst.loadgen.replay import Replay
from filledfirst.loadgen.settings import ReplaySettings
from filledfirst.loadgen.workers import TOKENS_PER_CORE_S, auto_workers, shard

from conftest import REPO
from helpers.stream_double import StreamDouble

TOKENS = 8


def schedule(n: int, gap_s: float, tokens: int = TOKENS) -> list[ScheduledRequest]:
    return [ScheduledRequest(i, gap_s * i, 5, tokens, "probe") for i in range(n)]


def settings(**kw) -> ReplaySettings:
    return ReplaySettings(model="double", token_low=10, token_high=20, request_timeout_s=20, drain_timeout_s=20,
                          scrape_interval_s=0.25, **kw)


def replay(sched, workers: int, double: StreamDouble, during=None, run=asyncio.run, **kw) -> Replay:
    """Run a replay against the double (on a thread of its own: the workers are other
    processes). `during`: (n, action), `action(replay)` once the workers report `n`
    requests done, however long the workers took to start."""
    with double.serving_in_thread() as base:
        r = Replay(sched, base, settings(workers=workers, **kw), progress=False)
        if during is not None:
            threading.Thread(target=when_done, args=(r, *during), daemon=True).start()
        run(r.run())
    return r


def when_done(r: Replay, n: int, action) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if r._pool is not None and r._pool.progress()[1] >= n:
            action(r)
            return
        time.sleep(0.01)


def workers_of_this_process() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]


# ----------------------------------------------------------------- sharding


@given(n=st.integers(0, 60), workers=st.integers(1, 6), seed=st.randoms(use_true_random=False))
def test_open_loop_shards_hold_every_request_once_at_its_time(n, workers, seed):
    sched = [ScheduledRequest(i, round(seed.uniform(0, 10), 3), 5, 3, "r") for i in range(n)]
    shards = shard(sched, workers, "open", None)
    got = [r for s in shards for r in s.schedule]
    assert sorted(r.request_id for r in got) == list(range(n))
    assert {r.request_id: r.t_offset_s for r in got} == {r.request_id: r.t_offset_s for r in sched}
    assert len(shards) == max(1, min(workers, n))
    for s in shards:
        assert [r.t_offset_s for r in s.schedule] == sorted(r.t_offset_s for r in s.schedule)
    sizes = [len(s.schedule) for s in shards]
    assert max(sizes) - min(sizes) <= 1  # every N-th arrival each


def test_closed_loop_shards_split_the_concurrency_and_the_requests_with_it():
    shards = shard(schedule(100, 0.0), 3, "closed", 8)
    assert [s.concurrency for s in shards] == [3, 3, 2]
    assert [len(s.schedule) for s in shards] == [38, 37, 25]
    assert sorted(r.request_id for s in shards for r in s.schedule) == list(range(100))
    # never more processes than the concurrency
    assert [s.concurrency for s in shard(schedule(10, 0.0), 4, "closed", 2)] == [1, 1]


def test_auto_picks_processes_for_the_offered_token_rate():
    one_core = TOKENS_PER_CORE_S  # tokens per second that fill one process
    slow = schedule(100, 1.0, tokens=100)  # 100 tok/s
    fast = schedule(1000, 0.001, tokens=int(one_core * 0.002))  # 2 cores' worth
    assert auto_workers(slow, "open", cpus=8) == 1
    assert auto_workers(fast, "open", cpus=8) == 4  # half a core each
    assert auto_workers(fast, "open", cpus=2) == 1  # leaves a core to the rest of the machine
    assert auto_workers(fast, "closed", cpus=8) == 1


def test_workers_must_be_a_positive_number_or_auto():
    with pytest.raises(ValueError, match="positive number or 'auto'"):
        Replay(schedule(2, 0.1), "http://127.0.0.1:1", settings(workers=0), progress=False)


# ----------------------------------------------------------------- against the double


def shape(r: Replay) -> dict:
    """What must not depend on the number of processes."""
    chunks: dict[int, int] = {}
    for t in r.tokens:
        chunks[t.request_id] = chunks.get(t.request_id, 0) + 1
    return {
        "ids": [q.request_id for q in r.requests],
        "scheduled": [q.t_scheduled for q in r.requests],
        "status": [q.status for q in r.requests],
        "tokens": [q.output_tokens_received for q in r.requests],
        "chunks": [chunks.get(q.request_id, 0) for q in r.requests],
    }


def test_two_workers_give_the_run_one_gives_on_one_clock():
    sched = schedule(120, 0.01)
    one = replay(sched, 1, StreamDouble(ttft_s=0.02, itl_s=0.01))
    double = StreamDouble(ttft_s=0.02, itl_s=0.01)
    two = replay(sched, 2, double)
    assert two.workers == 2 and one.workers == 1
    assert shape(two) == shape(one)
    assert set(shape(two)["status"]) == {"ok"} and set(shape(two)["tokens"]) == {TOKENS}
    assert double.requests == 120  # each sent once
    # one clock: every time is on the main process's, after the schedule says and in order
    for q in two.requests:
        assert q.t_scheduled <= q.t_sent <= q.t_first_token <= q.t_done <= two.t_end
    by_id = {q.request_id: q for q in two.requests}
    for t in two.tokens:
        assert by_id[t.request_id].t_first_token <= t.t <= by_id[t.request_id].t_done
    assert two.client_cpu_s >= two.client_cpu_peak_s > 0
    assert not workers_of_this_process()


def test_records_larger_than_a_pipe_come_back_on_the_runs_own_loop():
    """The runner's event loop (uvloop where installed) makes watched descriptors
    non-blocking; a worker's records (here 30,000 chunks each, a megabyte, far more than a
    pipe holds) must still come back whole."""
    from filledfirst.loadgen import loop

    sched = schedule(600, 0.002, tokens=100)
    r = replay(sched, 2, StreamDouble(ttft_s=0.01, itl_s=0.001), run=loop.run)
    assert [q.status for q in r.requests] == ["ok"] * 600 and len(r.tokens) == 600 * 100
    assert not workers_of_this_process()


def test_closed_loop_with_workers_keeps_the_concurrency():
    sched = schedule(40, 0.0)
    r = replay(sched, 2, StreamDouble(ttft_s=0.02, itl_s=0.01), mode="closed", concurrency=4)
    assert [q.status for q in r.requests] == ["ok"] * 40
    events = sorted([(q.t_sent, 1) for q in r.requests] + [(q.t_done, -1) for q in r.requests])
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak <= 4


def test_an_interrupt_reaches_every_worker_and_nothing_is_lost():
    sched = schedule(400, 0.01, tokens=50)  # 4 s of arrivals, 0.5 s streams
    r = replay(sched, 2, StreamDouble(ttft_s=0.02, itl_s=0.01),
               during=(20, lambda _: os.kill(os.getpid(), signal.SIGINT)))
    assert r.interrupted == "received SIGINT"
    statuses = {q.status for q in r.requests}
    assert len(r.requests) == 400 and "ok" in statuses and "not_sent" in statuses
    cancelled = [q for q in r.requests if q.status not in ("ok", "not_sent")]
    assert all("SIGINT" in (q.error or "") for q in cancelled)
    assert not any(q.t_sent is None for q in r.requests if q.status == "ok")
    assert not workers_of_this_process()


def test_a_worker_that_dies_leaves_its_requests_unsent_with_the_reason():
    def kill_one(r: Replay) -> None:
        assert r._pool is not None
        os.kill(r._pool.workers[1].process.pid, signal.SIGKILL)

    sched = schedule(300, 0.01, tokens=20)
    r = replay(sched, 2, StreamDouble(ttft_s=0.02, itl_s=0.01), during=(20, kill_one))
    assert "replay worker 1 exited before sending its records (exit code -9)" in r.interrupted
    lost = [q for q in r.requests if q.request_id % 2 == 1]
    assert all(q.status == "not_sent" and "worker 1 lost its records" in q.error for q in lost)
    # the other worker was stopped with the reason: what it had sent kept, the rest not sent
    kept = [q for q in r.requests if q.request_id % 2 == 0]
    assert any(q.status == "ok" for q in kept) and any(q.status == "not_sent" for q in kept)
    assert all("worker 1 exited" in q.error for q in kept if q.status not in ("ok", "not_sent"))
    assert not workers_of_this_process()


def test_workers_die_with_a_killed_main_process(tmp_path):
    """SIGKILL of the process that started the workers (nothing of ours runs after it)."""
    import subprocess
    import sys

    script = tmp_path / "main.py"
    script.write_text(
        "import asyncio, sys\n"
        "sys.path[:0] = sys.argv[1:]\n"
        "from helpers.stream_double import StreamDouble\n"
        "from test_workers import schedule, settings\n"
        "from filledfirst.loadgen.replay import Replay\n"
        # the guard: a spawned worker imports this file again, and must not replay it
        "if __name__ == '__main__':\n"
        "    with StreamDouble(ttft_s=0.02, itl_s=0.01).serving_in_thread() as base:\n"
        "        asyncio.run(Replay(schedule(3000, 0.01), base, settings(workers=2), progress=False).run())\n"
    )
    proc = subprocess.Popen([sys.executable, str(script), str(REPO / "tests"), os.path.dirname(__file__)])
    try:
        deadline = time.monotonic() + 60
        kids: list[psutil.Process] = []
        while time.monotonic() < deadline and len(kids) < 2:
            time.sleep(0.2)
            kids = [p for p in psutil.Process(proc.pid).children(recursive=True)
                    if "spawn_main" in " ".join(p.cmdline())]
        assert len(kids) == 2, "the workers never started"
        proc.kill()
        proc.wait(timeout=10)
        gone, alive = psutil.wait_procs(kids, timeout=10)
        assert not alive, f"workers outlived their main process: {[p.pid for p in alive]}"
    finally:
        if proc.poll() is None:
            proc.kill()
