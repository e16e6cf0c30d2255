"""search.json, typed (filledfirst.contracts.search): a file as the search writes it reads
back unchanged and writes the same bytes; one that does not fit is refused, naming it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from filledfirst.contracts.search import Knob, SearchRecord, Side, StopReason
from filledfirst.errors import UserError

# A search.json as `filledfirst frontier run` writes it (two probes and both closed loops).
WRITTEN = {
    "bounds": {"backlog_max_growth": 0.05, "budget": 11, "confidence": 0.9, "estimate_step": 1.25,
               "extensions": 2, "growth": 2.0, "maximum": 256.0, "precision": 1.1, "repeats": 0, "start": 0.5,
               "target": 0.95},
    "check": {"concurrency": 64, "error": None, "requests": 192, "run_dir": "check",
              "run_id": "azure/default/check-20261201T034052-aa9048", "status": "ok", "throughput_rps": 15.1},
    "drift": {"change": -0.0125, "drifted": False, "end_rps": 15.1, "max_change": 0.1, "start_rps": 15.29},
    "estimate": {"concurrency": 64, "error": None, "requests": 192, "run_dir": "estimate",
                 "run_id": "azure/default/estimate-20261201T033100-6a9041", "status": "ok", "throughput_rps": 15.29},
    "estimate_rps": 15.29,
    "fingerprint": "9e2f6f0839d0a145",
    "frontier": "azure",
    "intervention": None,
    "paired": None,
    "predicted_start": None,
    "probe_lifetimes": 4.0,
    "probe_max_s": 120.0,
    "probe_s": 10.0,
    "probe_stretches": 4,
    "probes": [
        {"attainment": 1.0, "attainment_hi": 1.0, "attainment_lo": 0.984, "backlog_growth": 0.004, "error": None,
         "held": True, "lifetime_p90_s": 0.3351080615000136, "met": 165, "offered_rps": 16.5, "probe": 1,
         "probe_s": 10.0, "rate": 15.29, "requests": 165, "reused": False, "run_dir": "p01",
         "run_id": "azure/default/p01-20261201T033152-6a9048", "status": "ok", "verdict": "held"},
        {"attainment": None, "attainment_hi": None, "attainment_lo": None, "backlog_growth": None,
         "error": "server never became healthy", "held": None, "lifetime_p90_s": None, "met": None,
         "offered_rps": None, "probe": 2, "probe_s": 10.0, "rate": 19.1125, "requests": None, "reused": True,
         "run_dir": "p02", "run_id": "azure/default/p02-20261201T033218-c40fa6", "status": "failed",
         "verdict": None},
    ],
    "result": {"confidence": 0.9, "error": None, "floor": 14.545454545454545, "hi": 17.448123722644123,
               "hi_inconclusive": False, "lo": 16.0, "ratio": 1.0905077326652577, "reason": "converged"},
    "setting": "default",
    "slo": {"itl_ms": 2000.0, "ttft_ms": 4000.0},
    "start_rps": None,
    "workload": "azure_conv",
}

# One written before searches had an interval, an estimate and a drift check: it still reads.
WRITTEN_BEFORE = {k: v for k, v in WRITTEN.items()
                  if k not in ("check", "drift", "estimate", "estimate_rps", "probe_stretches", "intervention",
                               "start_rps", "paired", "predicted_start")} | {
    "bounds": {k: WRITTEN["bounds"][k] for k in ("budget", "growth", "maximum", "precision", "repeats", "start",
                                                  "target")},
    "probes": [{k: v for k, v in p.items() if k not in ("attainment_hi", "attainment_lo", "backlog_growth", "met",
                                                          "offered_rps", "verdict")} for p in WRITTEN["probes"]],
    "result": {k: WRITTEN["result"][k] for k in ("error", "hi", "lo", "ratio", "reason")},
}


def test_a_search_json_written_before_the_interval_reads():
    search = SearchRecord.decode(WRITTEN_BEFORE, "old.json")
    assert search.estimate is None and search.drift is None and search.result.floor is None
    assert search.probe_stretches == 1  # trace probes took the window's start
    assert search.result.lo == 16.0 and search.probes[0].verdict is None


def test_a_search_json_as_written_today_round_trips(tmp_path):
    path = tmp_path / "search.json"
    path.write_text(json.dumps(WRITTEN, indent=2, sort_keys=True) + "\n")
    search = SearchRecord.read(path)
    assert search.key == "azure/default" and search.result.reason is StopReason.CONVERGED
    assert search.bounds.start == 0.5 and search.slo.ttft_ms == 4000.0
    assert [p.run_dir for p in search.probes] == ["p01", "p02"] and search.probes[1].error
    assert search.run_dirs(tmp_path) == [tmp_path / "p01", tmp_path / "p02"]
    assert search.to_doc() == WRITTEN
    again = tmp_path / "again.json"
    search.write(again)
    assert again.read_text() == path.read_text()


def test_an_intervention_keeps_what_it_relaxed_and_where_it_started():
    doc = {**WRITTEN, "setting": "default_seqs_x2", "estimate": None, "check": None, "drift": None,
           "estimate_rps": None, "start_rps": 27.2,
           "predicted_start": {"frontier": "azure", "setting": "default_seqs_x2", "parent": "default",
                               "parent_fingerprint": "ab12", "parent_knee_rps": 16.0, "shift": 0.7,
                               "model_scope": "engine", "searches": ["azure/default"], "why": "max_num_seqs x2: ..."},
           "intervention": {"after": 128, "before": 64, "changes": {"max_num_seqs": 128}, "knob": "max_num_seqs",
                            "min_shift": 0.3, "paired": True, "parent": "default", "search": True},
           "paired": {"concurrency": 128, "blocks": [
               {"side": side, "beyond_share": beyond, "queue_share": queue,
                "loop": {**WRITTEN["check"], "run_dir": f"paired{i}-{side}", "concurrency": 128}}
               for i, (side, beyond, queue) in enumerate((("relaxed", 0.8, 0.0), ("parent", 0.0, 0.9),
                                                          ("parent", 0.0, 0.9), ("relaxed", 0.7, None)), 1)]}}
    search = SearchRecord.decode(doc, "s.json")
    assert search.intervention.knob is Knob.SEQS and search.intervention.parent == "default"
    assert [b.side for b in search.paired.blocks] == [Side.RELAXED, Side.PARENT, Side.PARENT, Side.RELAXED]
    assert search.paired.blocks[0].loop.run_dir == "paired1-relaxed"
    assert search.predicted_start.start_rps == pytest.approx(search.start_rps)
    assert search.to_doc() == doc


def test_unknown_keys_are_allowed():
    assert SearchRecord.decode({**WRITTEN, "newer": 1}, "s.json") == SearchRecord.decode(WRITTEN, "s.json")


def broken(change) -> dict:
    doc = copy.deepcopy(WRITTEN)
    change(doc)
    return doc


@pytest.mark.parametrize("doc, why", [
    (broken(lambda d: d.pop("result")), "missing required field `result`"),
    (broken(lambda d: d["result"].update(reason="gave_up")), r"\$.result.reason"),
    (broken(lambda d: d["probes"][0].update(rate="fast")), r"\$.probes\[0\].rate"),
    (broken(lambda d: d["bounds"].update(maximum=0.1)), "maximum must be above start"),
    ([], "Expected `object`, got `array`"),
])
def test_a_document_that_does_not_fit_is_refused_naming_the_file(tmp_path, doc, why):
    path = tmp_path / "search.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=why) as err:
        SearchRecord.read(path)
    assert str(err.value).startswith(f"{path} is not a capacity search's search.json: ")
    assert "\n" not in str(err.value)


def test_a_file_that_is_not_json_is_refused_naming_it(tmp_path):
    path = tmp_path / "search.json"
    path.write_text("{")
    with pytest.raises(UserError, match=f"^{path} is not a capacity search's search.json: Expecting"):
        SearchRecord.read(path)
    with pytest.raises(FileNotFoundError):
        SearchRecord.read(Path(tmp_path / "missing.json"))
