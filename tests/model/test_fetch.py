"""A hub model fetched once into a local folder (filledfirst.model.fetch), with a stand-in
for the hub client's download (this machine fetches nothing from the hub): whole or not
at all, resumed after an interruption, never twice, and a clear error for each way the
hub says no. Then the GPU study's plan: one fetch where Snakemake runs, before every
server."""

from __future__ import annotations

import subprocess

import httpx
import pytest
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

from filledfirst.cli import main
from filledfirst.errors import UserError
from filledfirst.model import fetch as fetch_module
from filledfirst.model.fetch import fetch

from conftest import REPO, snakemake_argv

REPO_ID = "Qwen/Qwen2.5-7B-Instruct"


class Hub:
    """The hub client's snapshot_download: writes a model's files into local_dir, or fails
    as told after writing the first (an interrupted download leaves what it had)."""

    def __init__(self, fail: BaseException | None = None):
        self.calls: list[dict] = []
        self.fail = fail

    def __call__(self, *, repo_id, revision, local_dir, ignore_patterns):
        self.calls.append({"repo_id": repo_id, "revision": revision, "local_dir": local_dir,
                           "ignore_patterns": ignore_patterns})
        local_dir.mkdir(parents=True, exist_ok=True)
        (local_dir / "model-00001.safetensors").write_bytes(b"w" * 64)
        if self.fail is not None:
            raise self.fail
        (local_dir / "config.json").write_text('{"model_type": "qwen2"}')
        return str(local_dir)


@pytest.fixture
def hub(monkeypatch):
    def use(fail: BaseException | None = None) -> Hub:
        stand_in = Hub(fail)
        monkeypatch.setattr("huggingface_hub.snapshot_download", stand_in)
        return stand_in
    return use


def http_error(cls):
    return cls("no", response=httpx.Response(404, request=httpx.Request("GET", "https://huggingface.co")))


def test_fetched_once_into_the_folder_whole(hub, tmp_path):
    stand_in = hub()
    out = tmp_path / "models" / "Qwen2.5-7B-Instruct"
    assert fetch(REPO_ID, out, "main") == out
    assert (out / "config.json").is_file() and not out.with_name(out.name + ".partial").exists()
    partial = out.with_name(out.name + ".partial")
    assert stand_in.calls == [{"repo_id": REPO_ID, "revision": "main", "local_dir": partial,
                               "ignore_patterns": fetch_module.SKIPPED}]
    fetch(REPO_ID, out, "main")  # there already: nothing fetched
    main(["model", "fetch", REPO_ID, str(out)])
    assert len(stand_in.calls) == 1


def test_an_interrupted_fetch_leaves_no_model_and_resumes(hub, tmp_path):
    out = tmp_path / "m"
    hub(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        fetch(REPO_ID, out)
    assert not out.exists() and (tmp_path / "m.partial" / "model-00001.safetensors").is_file()
    again = hub()
    fetch(REPO_ID, out)
    assert again.calls[0]["local_dir"] == tmp_path / "m.partial"  # where the first one stopped
    assert (out / "model-00001.safetensors").is_file() and (out / "config.json").is_file()


@pytest.mark.parametrize(("error", "said"), [
    (lambda: http_error(GatedRepoError), "is gated: accept its licence on the hub, then set HF_TOKEN"),
    (lambda: http_error(RepositoryNotFoundError), "is not on the hub (or is private: set HF_TOKEN)"),
    (lambda: LocalEntryNotFoundError("offline"), "the hub cannot be reached"),
])
def test_each_way_the_hub_says_no_is_one_clear_error(hub, tmp_path, error, said):
    hub(error())
    with pytest.raises(UserError, match=None) as raised:
        fetch(REPO_ID, tmp_path / "m")
    assert said in str(raised.value) and not (tmp_path / "m").exists()


def test_a_repository_without_a_model_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda **kw: kw["local_dir"].mkdir(parents=True))
    with pytest.raises(UserError, match="has no config.json"):
        fetch("someone/not-a-model", tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_the_gpu_study_fetches_once_where_snakemake_runs_before_any_server(tmp_path):
    from filledfirst.config import load_study
    from filledfirst.plan import build_plan

    config = REPO / "config" / "config.yaml"
    folder = load_study([config]).model.folder
    assert folder == "data/models/Qwen2.5-7B-Instruct"
    assert all(folder in job.inputs.model for job in build_plan(load_study([config])).jobs)
    dry = subprocess.run([*snakemake_argv(tmp_path, config, "all"), "-n", "-p"], capture_output=True, text=True,
                         timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    out = dry.stdout + dry.stderr
    # (a local rule: on a cluster never submitted, tests/cluster/test_slurm.py)
    assert out.count("rule fetch_model:") == 1 and f"model fetch {REPO_ID} {folder}" in out
