"""SGLang's command lines from the study's settings, as dry runs: SGLang cannot run on these
machines (a GPU, or Intel AMX with a CPU build of its kernels that PyPI does not ship). The
flag names are the ones its server_args.py declares (read with the search tools, written
here), not checked by starting it."""

import pytest

from filledfirst.config import load_config
from filledfirst.engine import devices
from filledfirst.engine.command import build_command
from filledfirst.study import Model, as_study

from conftest import REPO


def model():
    return Model(name="qwen", source="path", dtype="bfloat16", max_model_len=32768,
                 prompt_token_ids={"low": 10, "high": 2050}, path="/models/qwen")


def command(settings, **kw):
    return build_command(launcher="sglang", model=model(), settings=settings, host="127.0.0.1", port=30000,
                         seed=3, extra_env={}, **kw)


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_the_limits_are_its_running_requests_token_pool_and_prefill_chunk():
    cmd = command({"max_num_seqs": 8, "kv_tokens": 49152, "max_num_batched_tokens": 4096,
                   "enable_prefix_caching": False, "gpu_memory_utilization": 0.9, "tensor_parallel_size": 2,
                   "enforce_eager": True})
    argv = cmd.argv
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert (flag(argv, "--model-path"), flag(argv, "--served-model-name")) == ("/models/qwen", "qwen")
    assert flag(argv, "--max-running-requests") == "8"
    assert flag(argv, "--max-total-tokens") == "49152"  # a page is one token: the budget as written
    assert flag(argv, "--chunked-prefill-size") == "4096"
    assert (flag(argv, "--mem-fraction-static"), flag(argv, "--tp-size")) == ("0.9", "2")
    assert (flag(argv, "--context-length"), flag(argv, "--random-seed")) == ("32768", "3")
    assert {"--enable-metrics", "--disable-radix-cache", "--disable-cuda-graph"} <= set(argv)
    assert cmd.engine == "SGLang" and cmd.env["HF_HUB_OFFLINE"] == "1"


def test_its_own_defaults_where_the_study_sets_nothing():
    argv = command({}).argv
    assert not {"--max-running-requests", "--max-total-tokens", "--chunked-prefill-size",
                "--disable-radix-cache"} & set(argv)


def test_vllm_settings_it_has_nothing_for_are_refused():
    with pytest.raises(ValueError, match="block_size, max_num_active_seqs"):
        command({"block_size": 16, "max_num_active_seqs": 4})


def test_a_relaxed_kv_budget_and_a_wrapper():
    argv = command({"num_gpu_blocks_override": 98304}, wrapper=["srun", "--container-image=sglang"]).argv
    # inside a wrapper (a container) its own Python, not this environment's
    assert argv[:5] == ["srun", "--container-image=sglang", "python3", "-m", "sglang.launch_server"]
    assert flag(argv, "--max-total-tokens") == "98304"


def test_the_gpu_study_runs_on_sglang_as_written(tmp_path):
    # the GPU study with its launcher swapped: every setting it uses has an SGLang flag, its
    # servers lease GPUs like vLLM's, and a cluster job asks for them
    from filledfirst.cluster import gpus_per_job
    from filledfirst.config import experiment_spec
    from filledfirst.engine.command import server_command

    (tmp_path / "s.yaml").write_text(f"extends: {REPO / 'config' / 'config.yaml'}\nengine: {{launcher: sglang}}\n")
    study = as_study(load_config([tmp_path / "s.yaml"]))
    for name in study.experiments:
        if study.experiments[name].external is None:
            argv = server_command(experiment_spec(study, name).server_spec, "127.0.0.1", 30000).argv
            assert "--enable-metrics" in argv
    assert devices.leased("sglang", {}) and gpus_per_job(study) >= 1
