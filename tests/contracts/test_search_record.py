"""search.json, typed (filledfirst.contracts.search): a file as the search writes it reads
back unchanged and writes the same bytes; one that does not fit is refused, naming it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from filledfirst.contracts.search import SearchRecord, StopReason
from filledfirst.errors import UserError

# A search.json as `filledfirst frontier run` writes it (a real one, two of its probes kept).
WRITTEN = {
    "bounds": {"budget": 11, "growth": 2.0, "maximum": 256.0, "precision": 1.1, "repeats": 0, "start": 0.5,
               "target": 0.95},
    "fingerprint": "9e2f6f0839d0a145",
    "frontier": "azure",
    "probe_lifetimes": 4.0,
    "probe_max_s": 120.0,
    "probe_s": 10.0,
    "probes": [
        {"attainment": 1.0, "error": None, "held": True, "lifetime_p90_s": 0.3351080615000136, "probe": 1,
         "probe_s": 10.0, "rate": 0.5, "requests": 2, "reused": False, "run_dir": "p01",
         "run_id": "azure/default/p01-20261201T033152-6a9048", "status": "ok"},
        {"attainment": None, "error": "server never became healthy", "held": None, "lifetime_p90_s": None,
         "probe": 2, "probe_s": 10.0, "rate": 1.0, "requests": None, "reused": True, "run_dir": "p02",
         "run_id": "azure/default/p02-20261201T033218-c40fa6", "status": "failed"},
    ],
    "result": {"error": None, "hi": 17.448123722644123, "lo": 16.0, "ratio": 1.0905077326652577,
               "reason": "converged"},
    "setting": "default",
    "slo": {"itl_ms": 2000.0, "ttft_ms": 4000.0},
    "workload": "azure_conv",
}


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
