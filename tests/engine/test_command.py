"""The exact vLLM command lines the configs produce (the GPU config cannot run here)."""


import pytest
import yaml

from filledfirst.config import config_files, experiment_spec, load_config
from filledfirst.engine.command import build_command, server_command
from filledfirst.errors import UserError
from filledfirst.study import as_study

from conftest import REPO


def command_for(config: str, experiment: str, **engine):
    cfg = load_config([REPO / "config" / config])
    cfg["engine"].update(engine)
    return server_command(experiment_spec(as_study(cfg), experiment).server_spec, "127.0.0.1", 8123)


def test_a_wrapper_runs_the_launchers_command_inside_it():
    wrapper = ["apptainer", "exec", "--nv", "--bind", "/scratch", "vllm.sif"]
    cmd = command_for("config.yaml", "decode_low", wrapper=wrapper)
    assert cmd.argv[:9] == [*wrapper, "vllm", "serve", "data/models/Qwen2.5-7B-Instruct"]
    assert cmd.argv[len(wrapper):] == command_for("config.yaml", "decode_low").argv


def test_gpu_config_runs_vllm_serve_with_the_seed_settings():
    cmd = command_for("config.yaml", "decode_low")
    assert cmd.argv[:3] == ["vllm", "serve", "data/models/Qwen2.5-7B-Instruct"]  # fetched there first
    flags = " ".join(cmd.argv)
    assert "--dtype bfloat16" in flags
    assert "--max-model-len 32768" in flags
    assert "--max-num-seqs 256" in flags
    assert "--no-enable-prefix-caching" in cmd.argv
    assert "--host 127.0.0.1 --port 8123" in flags
    assert cmd.env["HF_HUB_OFFLINE"] == "1"  # no server start downloads anything


def test_experiment_overrides_the_engine_default():
    assert "--max-num-seqs 8" in " ".join(command_for("config.yaml", "seq_limit").argv)
    assert "--max-num-seqs 8" in " ".join(command_for("cpu.yaml", "seq_limit").argv)
    assert "--max-num-seqs 64" in " ".join(command_for("cpu.yaml", "decode_low").argv)


def test_cpu_config_uses_the_module_launcher_and_kv_space():
    cmd = command_for("cpu.yaml", "decode_low")
    assert cmd.argv[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert cmd.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert cmd.env["HF_HUB_OFFLINE"] == "1"
    assert "--dtype float32" in " ".join(cmd.argv)


def test_dummy_load_format_is_passed(tmp_path):
    # an overlay of the GPU study's own
    (tmp_path / "c.yaml").write_text(f"extends: {REPO / 'config' / 'config.yaml'}\nmodel: {{load_format: dummy}}\n")
    cfg = load_config([tmp_path / "c.yaml"])
    spec = experiment_spec(as_study(cfg), "decode_low")
    cmd = build_command(launcher="gpu", model=spec.model, settings=spec.server, host="h", port=1, seed=0,
                        extra_env={})
    assert cmd.argv[cmd.argv.index("--load-format") + 1] == "dummy"


def test_config_values_never_pass_through_a_shell():
    # argv elements are handed to exec as-is: a hostile value stays one argument.
    cmd = command_for("cpu.yaml", "decode_low")
    assert all(isinstance(a, str) for a in cmd.argv)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c["engine"]["server"].update(max_num_seq=3), "max_num_seq"),
        (lambda c: c["experiments"]["decode_low"].update(workload="nope"), "experiments.decode_low.workload"),
        (lambda c: c["engine"].update(launcher="tpu"), "tpu"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, mutate, message):
    cfg = config_files([REPO / "config" / "cpu.yaml"])
    mutate(cfg)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(UserError, match=message):
        load_config([tmp_path / "c.yaml"])


def test_gpu_study_has_every_original_experiment_with_its_server_setting():
    cfg = load_config([REPO / "config" / "config.yaml"])
    sections = {exp.get("section") for exp in cfg["experiments"].values()}
    assert sections == {"interference", "decode_load", "sequence_limit", "kv_capacity", "token_budget", "compute",
                     "azure", "concurrency_sweep", "prefix_cache"}
    argv = lambda exp: " ".join(command_for("config.yaml", exp).argv)  # noqa: E731
    assert "--gpu-memory-utilization 0.9 " in argv("decode_low") + " "
    # the reduced KV: a budget in tokens (49,152 in 16-token blocks), the same on any card
    assert all("--num-gpu-blocks-override 3072" in argv(e) for e in ("kv_reduced", "kv_heavy"))
    assert "--max-num-seqs 8" in argv("seq_limit") and "--max-num-seqs 256" in argv("decode_high")
    # the per-step token budget: stated for every run, the token-budget pair on either side of it
    assert "--max-num-batched-tokens 2048" in argv("decode_low")
    assert "--max-num-batched-tokens 256" in argv("budget_small")
    assert "--max-num-batched-tokens 16384" in argv("budget_large")
    sweep = sorted(exp["loadgen"]["concurrency"] for e, exp in cfg["experiments"].items() if e.startswith("sweep_"))
    assert sweep == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    # the prefix-cache part: the same Mooncake window with caching off and on, the eviction run on less KV
    assert "--no-enable-prefix-caching" in argv("mooncake_cache_off")
    assert "--enable-prefix-caching" in argv("mooncake_cache_on").replace("--no-enable-prefix-caching", "")
    evicted = argv("prefix_evicted")
    assert "--num-gpu-blocks-override 3072" in evicted and "--enable-prefix-caching" in evicted


@pytest.mark.parametrize("config", ["config.yaml", "cpu.yaml"])
def test_every_synthetic_request_fits_the_model_length(config):
    cfg = load_config([REPO / "config" / config])
    limit = cfg["model"]["max_model_len"]
    for name, wl in cfg["workloads"].items():
        for phase in wl.get("phases", []):
            assert phase["prompt_tokens"] + phase["output_tokens"] <= limit, name


def test_first_error_finds_the_root_cause_not_the_last_line(tmp_path):
    from filledfirst.engine.server import first_error, log_excerpt

    log = tmp_path / "server.log"
    log.write_text(
        "(APIServer pid=1) WARNING 11-29 [x.py:1] failed with error `OSError: [Errno 24] Too many open files`\n"
        "(EngineCore pid=2) ERROR 11-29 [core.py:1510] ValueError: KV cache too small for max_model_len\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert first_error(log) == "ValueError: KV cache too small for max_model_len"
    assert log_excerpt(log).startswith("First error: ValueError") and "See root cause above" in log_excerpt(log)
    log.write_text("usage: api_server.py [-h]\napi_server.py: error: unrecognized arguments: --no-such-flag\n")
    assert first_error(log) == "error: unrecognized arguments: --no-such-flag"


def _argv(per_request_metrics=None, extra_args=()):
    cfg = load_config([REPO / "config" / "cpu.yaml"])
    spec = experiment_spec(as_study(cfg), "decode_low")
    settings = spec.server | {"extra_args": list(extra_args)}
    return build_command(launcher="cpu", model=spec.model, settings=settings, host="h", port=1, seed=0,
                         extra_env={}, per_request_metrics=per_request_metrics).argv


def test_per_request_metrics_are_asked_for_when_vllm_has_them():
    from filledfirst.engine.command import PER_REQUEST_METRICS_FLAG, vllm_has_per_request_metrics

    assert vllm_has_per_request_metrics()  # the installed vLLM (0.32) has the flag
    assert PER_REQUEST_METRICS_FLAG in _argv()  # detected
    assert _argv(per_request_metrics=True).count(PER_REQUEST_METRICS_FLAG) == 1
    assert PER_REQUEST_METRICS_FLAG not in _argv(per_request_metrics=False)
    # vLLM refuses it with --disable-log-stats; written by the user, it is not doubled
    assert PER_REQUEST_METRICS_FLAG not in _argv(True, ["--disable-log-stats"])
    assert PER_REQUEST_METRICS_FLAG not in _argv(True, ["--disable-log-stats=true"])
    assert _argv(True, [PER_REQUEST_METRICS_FLAG]).count(PER_REQUEST_METRICS_FLAG) == 1
    assert _argv(True, ["--max-log-len", "3"])[-2:] == ["--max-log-len", "3"]  # extra_args stay last


def test_detection_reads_vllms_own_arguments(tmp_path, monkeypatch):
    import importlib.machinery
    import importlib.util

    from filledfirst.engine import command

    def fake_vllm(source: str | None):
        pkg = tmp_path / source.split()[0] if source else tmp_path / "none"
        (pkg / "entrypoints" / "launchers").mkdir(parents=True, exist_ok=True)
        if source:
            (pkg / "entrypoints" / "launchers" / "cli_args.py").write_text(source)
        spec = importlib.machinery.ModuleSpec("vllm", None, is_package=True)
        spec.submodule_search_locations = [str(pkg)]
        monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "vllm" else None)
        command.vllm_has_per_request_metrics.cache_clear()
        return command.vllm_has_per_request_metrics()

    try:
        assert fake_vllm("new\n    enable_per_request_metrics: bool = False\n")
        assert not fake_vllm("old\n    enable_prompt_tokens_details: bool = False\n")
        assert not fake_vllm(None)  # no front-end arguments where vLLM keeps them
        monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
        command.vllm_has_per_request_metrics.cache_clear()
        assert not command.vllm_has_per_request_metrics()  # no vLLM here at all
    finally:
        monkeypatch.undo()
        command.vllm_has_per_request_metrics.cache_clear()


def test_the_gpu_smoke_test_serves_its_small_model_from_the_fetched_folder():
    cmd = command_for("gpu-smoke.yaml", "seq_limit")
    assert cmd.argv[:3] == ["vllm", "serve", "data/models/Qwen2.5-0.5B-Instruct"]
    flags = " ".join(cmd.argv)
    assert "--max-num-seqs 8" in flags and "--gpu-memory-utilization 0.5" in flags and "--dtype bfloat16" in flags
