"""An intervention's start (filledfirst.run.search.parent_knee): its parent's knee, moved
by the shift in its prediction.json only where that was predicted from the very search
beside it (filledfirst.analysis.predicted_start writes it)."""

from __future__ import annotations

import logging

import pytest

from filledfirst.analysis.predicted_start import predict_start
from filledfirst.config import load_study
from filledfirst.contracts.search import PREDICTION_JSON, SEARCH_JSON, Intervention, Knob, PredictedStart
from filledfirst.errors import UserError
from filledfirst.run.search import parent_knee

from conftest import REPO
from helpers.searches import search_record

RELAXED = Intervention(parent="seq2", knob=Knob.SEQS, before=2, after=4, changes={"max_num_seqs": 4})


@pytest.fixture
def out(tmp_path):
    parent = tmp_path / "knee" / "seq2"
    parent.mkdir(parents=True)
    search_record(setting="seq2", lo=4.0, hi=4.4).write(parent / SEARCH_JSON)  # fingerprint "x"
    mine = tmp_path / "knee" / "seq2_seqs_x2"
    mine.mkdir()
    return mine


def predicted(shift: float | None, fingerprint: str = "x", knee: float | None = 4.0) -> PredictedStart:
    return PredictedStart(frontier="knee", setting="seq2_seqs_x2", parent="seq2", parent_fingerprint=fingerprint,
                          parent_knee_rps=knee, shift=shift, model_scope="engine", why="a test")


def test_without_a_prediction_it_starts_at_its_parents_knee(out):
    start = parent_knee(out, RELAXED)
    assert start.first == 4.0 and start.predicted is None and start.against.lo == 4.0
    assert start.least_shift == pytest.approx(0.3)


def test_a_prediction_of_its_parents_search_moves_the_start_by_its_shift(out):
    predicted(0.5).write(out / PREDICTION_JSON)
    start = parent_knee(out, RELAXED)
    assert start.first == pytest.approx(6.0) and start.predicted == predicted(0.5)
    assert start.against.lo == 4.0  # still judged against the parent's measured knee


@pytest.mark.parametrize("stale", [predicted(0.5, fingerprint="y"), predicted(0.5, knee=3.0)],
                         ids=["another search", "another knee"])
def test_a_prediction_of_another_search_of_its_parent_is_not_used(out, stale, caplog):
    stale.write(out / PREDICTION_JSON)
    with caplog.at_level(logging.WARNING):
        start = parent_knee(out, RELAXED)
    assert start.first == 4.0 and start.predicted is None
    assert "predicted from another search of seq2" in caplog.text


def test_a_prediction_that_could_not_say_leaves_the_parents_knee(out):
    predicted(None).write(out / PREDICTION_JSON)
    assert parent_knee(out, RELAXED).first == 4.0 and parent_knee(out, RELAXED).predicted is None


def test_a_file_that_is_not_a_prediction_is_refused_naming_it(out):
    (out / PREDICTION_JSON).write_text('{"frontier": 3}')
    with pytest.raises(UserError, match=f"{PREDICTION_JSON}: not an intervention's predicted start"):
        parent_knee(out, RELAXED)


def test_only_an_interventions_start_is_predicted_and_from_its_parents_search(tmp_path):
    study = load_study([REPO / "config" / "cpu.yaml"])
    with pytest.raises(UserError, match="decode/default is not an intervention"):
        predict_start(study, "decode", "default", [])
    other = tmp_path / SEARCH_JSON
    search_record(frontier="decode", setting="default").write(other)
    with pytest.raises(UserError, match="relaxes 'capped': give its search.json \\(decode/default\\)"):
        predict_start(study, "decode", "capped_seqs_x2", [other])
