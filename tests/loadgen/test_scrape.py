"""The scraper's parsing and its compact sample store."""

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filledfirst.contracts.gauges import Gauges
from filledfirst.contracts.records import (
    SAMPLE_SCHEMA,
    TOKEN_SCHEMA,
    RecordColumns,
    SampleRecord,
    TokenRecord,
    to_table,
)
from filledfirst.metrics import latest_gauges, parse_metrics

EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 7.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:gpu_cache_usage_perc{engine="1",model_name="tiny"} 0.5
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="tiny"} 5.0
vllm:time_to_first_token_seconds_count{model_name="tiny"} 5.0
vllm:time_to_first_token_seconds_sum{model_name="tiny"} 0.3
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 100.0
"""


def test_every_vllm_sample_is_kept_and_the_older_kv_name_understood():
    samples = parse_metrics(EXPOSITION, 1.5)
    assert {s.metric for s in samples} == {
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count",
        "vllm:time_to_first_token_seconds_sum",
    }
    assert len(samples) == 9 and all(s.t == 1.5 for s in samples)
    assert latest_gauges(samples) == Gauges(running=5.0, waiting=7.0, kv_pct=50.0)


names = st.text(min_size=0, max_size=12)
ints = st.integers(0, 2**62)
samples = st.lists(st.builds(SampleRecord, st.floats(0, 1e6), names, names, st.floats(allow_nan=False)), max_size=60)
tokens = st.lists(st.builds(TokenRecord, ints, ints, st.floats(0, 1e6), ints), max_size=60)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(samples, tokens)
def test_columns_give_the_table_the_records_would(sample_recs, token_recs):
    cases = ((sample_recs, SampleRecord, SAMPLE_SCHEMA), (token_recs, TokenRecord, TOKEN_SCHEMA))
    for recs, record_type, schema in cases:
        cols = RecordColumns(record_type)
        cols.extend(recs)
        table = to_table(cols, schema)
        assert table.schema == schema
        assert table.equals(to_table(recs, schema))
        assert list(cols) == recs and len(cols) == len(recs)


def test_columns_store_a_name_once():
    cols = RecordColumns(SampleRecord)
    page = parse_metrics(EXPOSITION, 0.0)
    for _ in range(1000):
        cols.extend(page)
    assert len(cols) == 9000
    assert len(cols._names) == len({s.metric for s in page} | {s.labels for s in page})
    assert cols.to_table().column("metric").type == pa.string()


def test_a_bad_value_leaves_the_columns_aligned_and_a_table_leaves_them_appendable():
    cols = RecordColumns(TokenRecord)
    cols.append(TokenRecord(1, 0, 0.5, 1))
    with pytest.raises(TypeError):
        cols.append(TokenRecord(1, 1, 0.6, None))  # the last field fails after the others
    assert list(cols) == [TokenRecord(1, 0, 0.5, 1)]
    table = cols.to_table()
    cols.append(TokenRecord(1, 1, 0.7, 2))  # while the table is alive
    assert table.num_rows == 1 and len(cols) == 2


async def _scrape_slowly(delays: list[float], interval_s: float, run_for_s: float, page=lambda k: EXPOSITION):
    """A /metrics double answering after delays[k] on its k-th call (0 after them) with
    page(k) (text, or bytes sent as they are); returns the scraper and when each GET
    reached the server, on the scraper's clock."""
    import asyncio
    import time

    import aiohttp
    from aiohttp import web

    from filledfirst.loadgen.scrape import Scraper

    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0  # noqa: E731
    arrived: list[float] = []

    async def metrics(request):
        arrived.append(clock())
        await asyncio.sleep(delays[len(arrived) - 1] if len(arrived) <= len(delays) else 0.0)
        body = page(len(arrived) - 1)
        if isinstance(body, bytes):
            return web.Response(body=body, content_type="text/plain")
        return web.Response(text=body)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]
        scraper = Scraper(f"http://127.0.0.1:{port}/metrics", interval_s, clock)
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as session:
            task = asyncio.create_task(scraper.run(session, stop))
            await asyncio.sleep(run_for_s)
            stop.set()
            await task
    finally:
        await runner.cleanup()
    return scraper, arrived


def test_a_scrape_is_timed_at_the_answer_and_missed_ticks_are_skipped():
    import asyncio

    scraper, arrived = asyncio.run(_scrape_slowly([0.45], interval_s=0.1, run_for_s=0.9))
    times = sorted({s.t for s in scraper.samples if s.metric == "vllm:num_requests_running"})
    assert times[0] >= arrived[0] + 0.4  # the values are the server's at its answer, not at our ask
    ticks = [int(a / 0.1) for a in arrived]
    assert len(set(ticks)) == len(ticks), arrived  # no burst of catch-up scrapes after the slow one


def test_scrapes_are_not_phase_locked_to_a_grid_of_arrivals():
    """One scrape per slot, at a seeded point in the first half of it: a run whose requests
    arrive on the same grid is not seen at one phase only (every scrape just before an
    arrival), and gaps stay within 0.5-1.5 intervals, inside the diagnosis's hold."""
    import asyncio

    scraper, arrived = asyncio.run(_scrape_slowly([], interval_s=0.1, run_for_s=1.5))
    scheduled = arrived[1:-1]  # the first is at the start, the last after the stop
    phases = [(a / 0.1) % 1.0 for a in scheduled]
    assert len(scheduled) >= 10 and max(phases) - min(phases) > 0.2, phases
    assert len({int(a / 0.1) for a in scheduled}) == len(scheduled)  # one per slot
    gaps = [b - a for a, b in zip(arrived, arrived[1:-1])]
    assert all(0.04 < g < 0.17 for g in gaps), gaps


# A page with a byte that is not UTF-8 (in a HELP line: the values are fine).
BAD_BYTE_PAGE = EXPOSITION.replace("Number of requests", "Number of r\xe9quests").encode("latin-1")


def test_a_page_that_is_not_utf8_is_a_failed_scrape_counted_and_scraping_goes_on():
    """Prometheus' text format is UTF-8, and prometheus_client (vLLM's) always writes it:
    a page that is not was damaged on its way, so none of its values is kept. It is a
    failed scrape like a timeout (counted, a scrape_error sample naming it), and the next
    scrape is taken as usual."""
    import asyncio

    bad = lambda k: k in (1, 2, 4)  # noqa: E731
    scraper, arrived = asyncio.run(_scrape_slowly([], interval_s=0.05, run_for_s=0.8,
                                                  page=lambda k: BAD_BYTE_PAGE if bad(k) else EXPOSITION))
    served_bad = sum(bad(k) for k in range(len(arrived)))
    assert len(arrived) >= 6 and served_bad == 3 and scraper.errors == served_bad
    errors = [s for s in scraper.samples if s.metric == "filledfirst:scrape_error"]
    assert len(errors) == served_bad and {s.labels for s in errors} == {"error=parse:UnicodeDecodeError"}
    good = sorted({s.t for s in scraper.samples if s.metric == "vllm:num_requests_running"})
    assert len(good) == len(arrived) - served_bad and good[-1] > max(s.t for s in errors)


def test_any_exception_in_a_scrape_is_a_failed_scrape(monkeypatch):
    """Not only the client's errors and timeouts: whatever a scrape raises (here a bug in
    the parser, once) fails that scrape alone."""
    import asyncio

    from filledfirst.loadgen import scrape

    calls = []

    def flaky(text, t):
        calls.append(t)
        if len(calls) == 2:
            raise KeyError("a bug")
        return parse_metrics(text, t)

    monkeypatch.setattr(scrape, "parse_metrics", flaky)
    scraper, arrived = asyncio.run(_scrape_slowly([], interval_s=0.05, run_for_s=0.4))
    assert scraper.errors == 1 and len(calls) == len(arrived) >= 4
    assert [s.labels for s in scraper.samples if s.metric == "filledfirst:scrape_error"] == ["error=parse:KeyError"]


def test_a_nan_or_infinite_sample_is_kept_as_the_server_wrote_it():
    """Prometheus' text allows NaN and +Inf; the run folder says what the server said (the
    analysis turns them into NULL, filledfirst.analysis.signals.SAMPLES)."""
    import math

    waiting = 'vllm:num_requests_waiting{engine="0",model_name="tiny"}'
    page = EXPOSITION.replace('model_name="tiny"} 0.25', 'model_name="tiny"} NaN').replace(
        f"{waiting} 7.0", f"{waiting} +Inf")
    values = {(s.metric, s.labels): s.value for s in parse_metrics(page, 0.0)}
    assert math.isnan(values[("vllm:gpu_cache_usage_perc", "engine=0,model_name=tiny")])
    assert values[("vllm:num_requests_waiting", "engine=0,model_name=tiny")] == math.inf
