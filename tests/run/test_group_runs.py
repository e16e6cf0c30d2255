"""How `filledfirst run` carries a group of experiments through a server that dies, never
starts or is interrupted, with a stand-in for vLLM and the replay (the real engine is in
test_pipeline_e2e)."""

import json

import pytest

from filledfirst import cli, config, interrupts
from filledfirst.config import load_config
from filledfirst.engine.command import ServerCommand
from filledfirst.loadgen.replay import Replay
from filledfirst.run import runner
from filledfirst.run.runner import Job, run_experiments
from filledfirst.study import as_study
from filledfirst.workloads.synthetic import write_synthetic_schedule

from conftest import REPO
from helpers.contracts import assert_round_trips
from helpers.fake_server import FakeShared


@pytest.fixture
def group(tmp_path, monkeypatch):
    """Experiments a, b, c sharing a server, their schedules, and hooks for what happens."""
    cfg = load_config([REPO / "tests" / "configs" / "e2e.yaml"])
    cfg["experiments"] = {name: {"workload": "light"} for name in ("a", "b", "c")}
    write_synthetic_schedule(cfg["workloads"]["light"], tmp_path / "s.parquet")
    jobs = [Job(name, tmp_path / "s.parquet", tmp_path / "runs" / name) for name in cfg["experiments"]]
    state = {"shared": None, "during": {}}  # during: experiment -> what happens in its replay

    def make_shared(spec, log_path):
        state["shared"] = FakeShared(log_path, state.get("failing_starts", ()))
        return state["shared"]

    async def fake_run(replay):
        experiment = state["current"] = next(j.experiment for j in jobs if not j.out.exists())
        state.setdefault("keys", []).append(replay.settings.api_key)
        replay.t_end, replay.client_cpu_s = 1.0, 0.1
        state["shared"].replayed(replay, experiment, state["during"].get(experiment))

    monkeypatch.setattr(runner, "SharedServer", make_shared)
    monkeypatch.setattr(Replay, "run", fake_run)
    # Leave the test process's own signal handlers and parent alone.
    monkeypatch.setattr(runner, "install_interrupt_handlers", lambda: None)
    monkeypatch.setattr(runner, "watch_owners", lambda: None)
    monkeypatch.setattr(interrupts, "_interrupt_reason", None)
    return cfg, jobs, state


def meta(job):
    return assert_round_trips(job.out / "run.json")


def server_log(job):
    return (job.out / "server.log").read_text()


def test_one_start_for_the_group_and_the_log_split(group):
    cfg, jobs, state = group
    assert run_experiments(as_study(cfg), jobs, progress=False) == ["ok", "ok", "ok"]
    assert state["shared"].starts == ["a"]
    assert server_log(jobs[0]) == "start-up for a\nrequests of a\n"
    assert [server_log(j) for j in jobs[1:]] == ["requests of b\n", "requests of c\n"]
    a, b = meta(jobs[0]), meta(jobs[1])
    assert a["timings"]["startup_s"] == 1.5 and "startup_reused_s" not in a["timings"]
    assert b["timings"]["startup_reused_s"] == 1.5 and "startup_s" not in b["timings"]
    assert b["server"]["shared_with"] == ["a", "b", "c"] and b["server"]["group_position"] == 2
    assert not list((jobs[0].out.parent).glob(".*"))  # no temp folder or log left


def test_a_server_that_dies_is_started_afresh_for_the_rest(group):
    cfg, jobs, state = group
    state["during"]["a"] = "server dies"
    assert run_experiments(as_study(cfg), jobs, progress=False) == ["partial", "ok", "ok"]
    assert state["shared"].starts == ["a", "b"]
    assert "vLLM exited during the run" in meta(jobs[0])["error"]
    assert server_log(jobs[1]).startswith("start-up for b\n")
    assert [meta(j)["server"]["started_by"] for j in jobs] == ["a", "b", "b"]
    assert "startup_s" in meta(jobs[1])["timings"] and "startup_reused_s" in meta(jobs[2])["timings"]


def test_a_failed_start_fails_every_experiment_that_needed_it(group):
    cfg, jobs, state = group
    state["during"]["a"] = "server dies"
    state["failing_starts"] = ("b",)
    assert run_experiments(as_study(cfg), jobs, progress=False) == ["partial", "failed", "failed"]
    assert state["shared"].starts == ["a", "b"]  # not retried for c
    for job in jobs[1:]:
        assert "exited with code 1 before it was healthy (b)" in meta(job)["error"]
        assert server_log(job) == "start-up for b\n"  # the failed start's log, for each


def test_an_interruption_publishes_the_current_run_and_starts_no_other(group):
    cfg, jobs, state = group
    state["during"]["b"] = "interrupt"
    with pytest.raises(interrupts.Interrupted, match="received SIGINT"):
        run_experiments(as_study(cfg), jobs, progress=False)
    assert [meta(j)["status"] for j in jobs[:2]] == ["ok", "partial"]
    assert not jobs[2].out.exists()
    assert not state["shared"].alive()  # stopped on the way out


def test_the_command_line_exits_130_for_an_interrupted_group(group, monkeypatch):
    """The runner raises; `filledfirst run` turns it into 130, so Snakemake sees the job
    as not done, with the folders published as the runner left them."""
    cfg, jobs, state = group
    state["during"]["b"] = "interrupt"
    monkeypatch.setattr(config, "load_config", lambda paths: cfg)
    argv = ["run", "--config", "study.yaml", "--no-progress"]
    for job in jobs:
        argv += ["--experiment", job.experiment, "--schedule", str(job.schedule), "--out", str(job.out)]
    assert cli.main(argv) == 130
    assert [meta(j)["status"] for j in jobs[:2]] == ["ok", "partial"]
    assert not jobs[2].out.exists()
    state["during"].clear()
    monkeypatch.setattr(interrupts, "_interrupt_reason", None)
    assert cli.main(argv) == 0  # the same call, not interrupted


def interrupted_at_b_then_cleaned(group, monkeypatch):
    """The job is interrupted during b; Snakemake then deletes all of the job's outputs."""
    import shutil

    cfg, jobs, state = group
    state["during"]["b"] = "interrupt"
    with pytest.raises(interrupts.Interrupted):
        run_experiments(as_study(cfg), jobs, progress=False)
    first_a = meta(jobs[0])["run_id"]
    for job in jobs:
        shutil.rmtree(job.out, ignore_errors=True)
    monkeypatch.setattr(interrupts, "_interrupt_reason", None)
    state["during"].clear()
    return first_a


def test_a_rerun_after_an_interruption_measures_only_what_was_unfinished(group, monkeypatch):
    cfg, jobs, state = group
    first_a = interrupted_at_b_then_cleaned(group, monkeypatch)
    warmups = []
    warm_up = runner._warm_up
    monkeypatch.setattr(runner, "_warm_up", lambda group, job, progress: (warmups.append(job.experiment),
                                                                          warm_up(group, job, progress))[1])
    assert run_experiments(as_study(cfg), jobs, progress=False) == ["ok", "ok", "ok"]
    assert meta(jobs[0])["run_id"] == first_a  # a was restored, not measured again
    # b meets the server as it did in the uninterrupted run: one that has just served a
    # (replayed, not recorded), not a freshly started one.
    assert warmups == ["a"]
    assert state["shared"].starts == ["a"]
    b = meta(jobs[1])
    assert b["status"] == "ok" and b["server"]["warmed_up_by"] == "a"
    assert "startup_reused_s" in b["timings"] and "startup_s" not in b["timings"]
    assert "warmed_up_by" not in meta(jobs[2])["server"]  # c followed b, measured in this call
    assert not list(jobs[0].out.parent.glob(".*"))  # the kept copies are gone with the job done


@pytest.mark.parametrize("what", ["vllm_package", "torch", "cores", "cpu"])
def test_a_kept_run_is_not_reused_on_other_versions_or_hardware(group, monkeypatch, what):
    """An upgrade or another machine between the attempts would mix two setups in one group."""
    from filledfirst.run import provenance

    cfg, jobs, state = group
    first_a = interrupted_at_b_then_cleaned(group, monkeypatch)
    if what in ("vllm_package", "torch"):
        real = provenance.versions
        monkeypatch.setattr(provenance, "versions", lambda: {**real(), what: "9.9.9-other"})
    else:
        real = provenance.hardware
        monkeypatch.setattr(provenance, "hardware", lambda: {**real(), what: "other"})
    assert run_experiments(as_study(cfg), jobs, progress=False) == ["ok", "ok", "ok"]
    assert meta(jobs[0])["run_id"] != first_a
    assert state["shared"].starts == ["a"]


@pytest.mark.parametrize("change", ["spec", "schedule"])
def test_a_kept_run_is_not_reused_when_its_experiment_changed(group, monkeypatch, change):
    cfg, jobs, state = group
    first_a = interrupted_at_b_then_cleaned(group, monkeypatch)
    if change == "spec":  # in a's spec, not in its server's identity: a stays in the group
        cfg["experiments"]["a"]["description"] = "changed"
    else:
        phases = [{**phase, "output_tokens": 9} for phase in cfg["workloads"]["light"]["phases"]]
        write_synthetic_schedule({**cfg["workloads"]["light"], "phases": phases}, jobs[0].schedule)
    run_experiments(as_study(cfg), jobs, progress=False)
    assert meta(jobs[0])["run_id"] != first_a
    assert state["shared"].starts[0] == "a"


@pytest.mark.parametrize("argv, env, key", [
    (["--api-key", "k-1"], {}, "k-1"),
    (["--api-key", "k-1", "k-2"], {}, "k-1"),  # it takes several: any one will do
    (["--api-key=k-3"], {}, "k-3"),
    ([], {"VLLM_API_KEY": "k-4"}, "k-4"),
    (["--api-key", "k-5"], {"VLLM_API_KEY": "k-4"}, "k-5"),  # vLLM: the flag wins
    ([], {}, None),
])
def test_the_key_a_server_is_started_with(argv, env, key, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert ServerCommand(["vllm", "serve", *argv], env=env).api_key() == key


def test_a_server_started_with_an_api_key_gets_it_on_every_request(group, monkeypatch):
    """vLLM guards /v1 with the key in `extra_args`: without it every request came back 401."""
    cfg, jobs, state = group
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    real = FakeShared._start

    def start(self, experiment):
        self.extra_args = ["--api-key", "sk-started-with"]
        real(self, experiment)

    monkeypatch.setattr(FakeShared, "_start", start)
    assert run_experiments(as_study(cfg), jobs, progress=False) == ["ok", "ok", "ok"]
    assert state["keys"] == ["sk-started-with"] * 3
    assert "sk-started-with" not in json.dumps(meta(jobs[0]))  # sent, never written
