"""The study's plan (filledfirst.plan) holds the jobs the workflow ran before it existed:
the same jobs in the same order, each with the same tasks, files and log, for both
shipped studies (tests/workflow/plans/*.json, recorded from the workflow's dry runs)."""

import json

import pytest
import yaml

from filledfirst.config import load_study
from filledfirst.plan import build_plan

from conftest import REPO


@pytest.fixture(params=["cpu", "config"])
def study_and_recorded(request):
    recorded = json.loads((REPO / "tests" / "workflow" / "plans" / f"{request.param}.json").read_text())
    return load_study([REPO / "config" / f"{request.param}.yaml"]), recorded


def test_the_jobs_and_their_order_are_the_recorded_ones(study_and_recorded):
    study, recorded = study_and_recorded
    plan = build_plan(study)
    assert [job.name for job in plan.jobs] == [job["name"] for job in recorded["jobs"]]
    for job, old in zip(plan.jobs, recorded["jobs"]):
        assert [*job.search_outputs, *job.run_outputs] == old["outputs"], job.name
        inputs = {path for paths in (job.inputs.model, job.inputs.schedules, job.inputs.parents, job.inputs.knees,
                                     job.inputs.traces, job.inputs.stats) for path in paths}
        assert sorted(inputs) == old["inputs"], job.name
        assert job.log == old["log"]


def test_each_schedule_waits_for_the_recorded_searches(study_and_recorded):
    study, recorded = study_and_recorded
    plan = build_plan(study)
    for out, old_inputs in recorded["schedules"].items():
        step = next(s for s in plan.schedules.values() if s.out == out)
        assert sorted([*step.knees, *([step.trace_csv] if step.trace_csv else [])]) == old_inputs, out


def test_a_job_is_found_by_name_and_an_unknown_one_is_refused(study_and_recorded):
    from filledfirst.errors import UserError

    plan = build_plan(study_and_recorded[0])
    assert plan.job(plan.jobs[-1].name) is plan.jobs[-1]
    with pytest.raises(UserError, match="no job 'nope'.*run_group_"):
        plan.job("nope")


def test_every_experiment_runs_in_exactly_one_job(study_and_recorded):
    study, _ = study_and_recorded
    runs = [e.experiment for job in build_plan(study).jobs for e in job.experiments]
    assert sorted(runs) == sorted(study.experiments)


def test_the_job_command_lists_the_plan_and_needs_a_name(capsys):
    from filledfirst.cli import main

    cpu = str(REPO / "config" / "cpu.yaml")
    assert main(["job", "--config", cpu, "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("frontier_decode_default: search decode/default, search prefix/cache_off, ")
    assert lines[-1] == "run_group_budget_small: budget_small"
    assert ("frontier_kv_reduced: search kv/reduced, kv_heavy, paired check kv/reduced_seqs_x4, "
            "paired check kv/reduced_kv_x4") in lines
    assert main(["job", "--config", cpu]) == 2
    assert "give a job's name (or --list)" in capsys.readouterr().err


@pytest.fixture(params=["cpu", "config"])
def searched(request, tmp_path):
    """A shipped study with its interventions searched, each on a job of its own."""
    overlay = tmp_path / "searched.yaml"
    searched = {f: {"interventions": {"search": True}} for f in ("decode", "kv")}
    overlay.write_text(yaml.safe_dump({"frontiers": searched}))
    return load_study([REPO / "config" / f"{request.param}.yaml", overlay])


def test_interventions_judged_side_by_side_alone_are_checked_in_their_parents_job(study_and_recorded):
    from filledfirst.frontier.plan import frontier_plan
    from filledfirst.plan import search_json

    study, _ = study_and_recorded
    plan = build_plan(study)
    alone = {(f, s): i for f in study.frontiers for s, i in frontier_plan(study, f).interventions.items()
             if not i.search}
    assert alone and not plan.predictions  # nothing to start a search from
    for (frontier, setting), relaxed in alone.items():
        job = next(j for j in plan.jobs if search_json(frontier, setting) in j.search_outputs)
        assert [c.key for c in job.checks if c.key == f"{frontier}/{setting}"] == [f"{frontier}/{setting}"]
        assert f"{frontier}/{relaxed.parent}" in [s.key for s in job.searches]
        assert f"{frontier}/{setting}" not in [s.key for j in plan.jobs for s in j.searches]
        assert f"frontier_{frontier}_{setting}" not in [j.name for j in plan.jobs]
        assert job.fingerprint.split(" checks ")[1].split() == [c.fingerprint for c in job.checks]


def test_each_intervention_starts_from_a_prediction_made_before_it_from_the_searches_that_are_not_interventions(
        searched):
    study = searched
    plan = build_plan(study)
    from filledfirst.frontier.plan import frontier_plan
    from filledfirst.plan import search_json

    relaxed = {search_json(f, s) for f in study.frontiers for s in frontier_plan(study, f).interventions}
    assert len(plan.predictions) == len(relaxed) > 0
    by_output = {out: job for job in plan.jobs for out in job.search_outputs}
    for step in plan.predictions:
        own = search_json(step.frontier, step.setting)
        parent = search_json(step.frontier, frontier_plan(study, step.frontier).interventions[step.setting].parent)
        assert own in relaxed and parent in step.searches and not relaxed & set(step.searches)
        assert step.out == own.replace("search.json", "prediction.json")
        assert by_output[own].inputs.predicted == [step.out]
        # what the prediction reads waits for no intervention, through any chain of knees
        # (it would wait for itself)
        for search in step.searches:
            assert not relaxed & upstream(plan, search), search


def upstream(plan, search: str) -> set[str]:
    """Every search.json the job making `search` waits for, through knees and parents."""
    by_output = {out: job for job in plan.jobs for out in job.search_outputs}
    seen, todo = set(), [search]
    while todo:
        job = by_output[todo.pop()]
        for needed in {*job.inputs.knees, *job.inputs.parents} - seen:
            seen.add(needed)
            todo.append(needed)
    return seen


def test_a_search_that_waits_for_an_interventions_knee_through_another_is_not_predicted_from(searched):
    import msgspec

    from filledfirst.plan import _predictions

    study = searched
    plan = build_plan(study)
    step = plan.predictions[0]
    own = f"results/frontiers/{step.frontier}/{step.setting}/search.json"
    by_output = {out: job for job in plan.jobs for out in job.search_outputs}
    parent = f"results/frontiers/{step.frontier}/{parent_setting(study, step)}/search.json"
    others = []
    for search in step.searches:
        job = by_output[search]
        if job not in others and parent not in job.search_outputs:
            others.append(job)
    a, b = others[-2:]  # two roots' jobs: A waits for B's knee, B for the intervention's

    def waiting_for(job, knee):
        return msgspec.structs.replace(job, inputs=msgspec.structs.replace(job.inputs, knees=[*job.inputs.knees, knee]))

    changed = {a.name: waiting_for(a, b.search_outputs[0]), b.name: waiting_for(b, own)}
    found = next(p for p in _predictions(study, [changed.get(j.name, j) for j in plan.jobs])
                 if p.setting == step.setting)
    assert not {*a.search_outputs, *b.search_outputs} & set(found.searches)
    assert parent in found.searches


def parent_setting(study, step) -> str:
    from filledfirst.frontier.plan import frontier_plan

    return frontier_plan(study, step.frontier).interventions[step.setting].parent
