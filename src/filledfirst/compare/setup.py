"""What differs in the setup of two studies, from the provenance each run recorded
(run.json: model, versions, hardware), each matched experiment's server settings and spec
fingerprint, and each matched capacity search's server settings: shown first, so a reader
knows what the comparison is of."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from filledfirst.report import run_json
from filledfirst.report.sections import shared_setup

VARIES = "(differs between runs)"


def _common(documents: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    by_run, common, differing = shared_setup(documents)
    return {**common, **{k: VARIES for k in differing}}


def _differences(name: str, base: Mapping[str, Any], cand: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": f"{name}: {key}", "base": run_json.fmt_value(base.get(key)),
             "candidate": run_json.fmt_value(cand.get(key))}
            for key in dict.fromkeys([*base, *cand]) if base.get(key) != cand.get(key)]


def setup_rows(base_docs: Mapping[str, Mapping[str, Any]], cand_docs: Mapping[str, Mapping[str, Any]],
               experiments: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]],
               searches: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One row per key whose value differs (key, base, candidate): the shared setup of the
    study runs (VARIES for a key a side's runs disagree on); each matched experiment's
    server settings and spec fingerprint, and each matched search's server settings
    (name -> (baseline run.json, candidate run.json): a search's from one of its probes)."""
    b, c = _common(base_docs), _common(cand_docs)
    rows = [{"key": key, "base": run_json.fmt_value(b.get(key)), "candidate": run_json.fmt_value(c.get(key))}
            for key in dict.fromkeys([*b, *c]) if b.get(key) != c.get(key)]
    for name, (db, dc) in [*experiments.items(), *searches.items()]:
        sb = {f"server.{k}": v for k, v in run_json.section(db, "spec.server").items()}
        sc = {f"server.{k}": v for k, v in run_json.section(dc, "spec.server").items()}
        if name in experiments:
            sb["spec fingerprint"], sc["spec fingerprint"] = db.get("spec_fingerprint"), dc.get("spec_fingerprint")
        rows += _differences(name, sb, sc)
    return rows
