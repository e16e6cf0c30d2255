"""The run folder: what `filledfirst run` leaves and `filledfirst ingest` reads."""

from __future__ import annotations

from pathlib import Path

from filledfirst.contracts import runmeta

RUN_JSON = "run.json"
REQUESTS = "requests.parquet"
TOKENS = "tokens.parquet"
SAMPLES = "samples.parquet"
SERVER_LOG = "server.log"
SCHEDULE = "schedule.parquet"

# `ok`: every scheduled request was sent and the run ended on its own.
# `partial`: the run was cut short (server died, interrupted); what was measured is kept.
# `failed`: nothing was measured (e.g. the server never became healthy).
RUN_STATUSES = ("ok", "partial", "failed")


class IncompleteRunDir(Exception):
    pass


def read_run_json(run_dir: str | Path) -> dict:
    """A finished run folder's run.json as its document (runmeta.decode types it); an
    IncompleteRunDir when the folder is not finished."""
    run_dir = Path(run_dir)
    path = run_dir / RUN_JSON
    if not path.is_file():
        raise IncompleteRunDir(
            f"{run_dir}: no {RUN_JSON}; the run did not finish writing this folder "
            "(re-run the experiment)"
        )
    meta = runmeta.loads(path.read_text())
    if meta.get("status") not in RUN_STATUSES:
        raise IncompleteRunDir(f"{path}: status {meta.get('status')!r} is not one of {RUN_STATUSES}")
    if meta["status"] != "failed":
        missing = [n for n in (REQUESTS, TOKENS, SAMPLES) if not (run_dir / n).is_file()]
        if missing:
            raise IncompleteRunDir(f"{run_dir}: status {meta['status']} but {', '.join(missing)} missing")
    return meta
