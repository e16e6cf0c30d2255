"""llama-server's command lines from the study's settings (the engine itself runs in
tests/workflow/test_llamacpp_e2e.py)."""

import pytest

from filledfirst.engine.command import build_command
from filledfirst.engines import llamacpp
from filledfirst.study import Model


def model(path="data/models/tiny-qwen2"):
    return Model(name="tiny-qwen2", source="tiny", dtype="float32", max_model_len=4096,
                 prompt_token_ids={"low": 10, "high": 2050}, path=path)


def command(settings, **kw):
    return build_command(launcher="llamacpp", model=kw.pop("m", model()), settings=settings, host="127.0.0.1",
                         port=8123, seed=7, extra_env={}, **kw)


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_the_limits_are_its_slots_context_and_batch():
    cmd = command({"max_num_seqs": 4, "kv_tokens": 8192, "max_num_batched_tokens": 256,
                   "enable_prefix_caching": False})
    argv = cmd.argv
    assert argv[0].endswith("llama-server")
    assert flag(argv, "--model") == "data/models/tiny-qwen2.gguf"  # written beside the folder
    assert flag(argv, "--alias") == "tiny-qwen2" == cmd.served_name  # /v1/models names it: the identity check
    assert (flag(argv, "--parallel"), flag(argv, "--ctx-size")) == ("4", "8192")
    assert (flag(argv, "--batch-size"), flag(argv, "--ubatch-size")) == ("256", "256")
    assert "--metrics" in argv and "--no-cache-prompt" in argv
    assert (flag(argv, "--host"), flag(argv, "--port"), flag(argv, "--seed")) == ("127.0.0.1", "8123", "7")
    assert cmd.engine == "llama-server"
    # a physical batch never above llama.cpp's default, whatever the logical one
    assert flag(command({"max_num_seqs": 1, "max_num_batched_tokens": 2048}).argv, "--ubatch-size") == "512"


def test_without_a_kv_budget_each_slot_holds_one_request_of_max_model_len():
    assert flag(command({"max_num_seqs": 3}).argv, "--ctx-size") == str(3 * 4096)


def test_a_relaxed_kv_budget_in_blocks_is_tokens():
    # an intervention relaxes KV as num_gpu_blocks_override; llama.cpp's cells are tokens
    assert flag(command({"max_num_seqs": 2, "num_gpu_blocks_override": 10000}).argv, "--ctx-size") == "10000"


def test_a_gguf_file_of_ones_own_is_served_as_it_is():
    assert flag(command({"max_num_seqs": 1}, m=model("/m/q4.gguf")).argv, "--model") == "/m/q4.gguf"


def test_vllm_settings_it_has_nothing_for_are_refused():
    with pytest.raises(ValueError, match="enforce_eager, kv_cache_space_gib"):
        command({"max_num_seqs": 4, "enforce_eager": True, "kv_cache_space_gib": 1})
    with pytest.raises(ValueError, match="state max_num_seqs"):
        command({})


def test_extra_args_come_last_and_a_wrapper_first():
    argv = command({"max_num_seqs": 1, "extra_args": ["--threads", "2"]}, wrapper=["nice"]).argv
    # inside a wrapper (a container) the server is found on the container's PATH
    assert argv[:2] == ["nice", "llama-server"] and argv[-2:] == ["--threads", "2"]
    assert llamacpp.gguf_file("data/models/tiny-qwen2/") == "data/models/tiny-qwen2.gguf"


def test_a_config_with_settings_it_cannot_take_is_refused_when_read(tmp_path):
    from filledfirst.config import load_config
    from filledfirst.errors import UserError

    from conftest import REPO

    (tmp_path / "c.yaml").write_text(f"extends: {REPO / 'tests' / 'configs' / 'llamacpp.yaml'}\n"
                                     "engine: {server: {enforce_eager: true}}\n")
    with pytest.raises(UserError) as err:
        load_config([tmp_path / "c.yaml"])
    assert "experiments.one_slot_c4.server: llama.cpp's server has no setting for enforce_eager" in str(err.value)
    assert "frontiers.slots.settings.one: llama.cpp's server has no setting for enforce_eager" in str(err.value)
