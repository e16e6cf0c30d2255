"""A fixed KV budget checked against the card before a server starts
(filledfirst.model.fit), on stand-ins for what this machine lacks: nvidia-smi reporting
24, 40, 80 and 141 GB cards, and a model folder of Qwen2.5-7B-Instruct's shape (its
config.json, and a sparse file the size of its weights)."""

from __future__ import annotations

import json

import pytest

from filledfirst.engine import devices, shared
from filledfirst.engine.server import ServerStartError
from filledfirst.model.fit import kv_fit_problem

from conftest import REPO
from helpers.gpus import install

GIB = 2**30
# Qwen2.5-7B-Instruct's config.json, as far as the KV ledger reads it: 28 layers x 4 KV
# heads x 128 dimensions x K and V = 28,672 elements a token, 56 KiB in bfloat16
QWEN_7B = {"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
           "hidden_size": 3584, "torch_dtype": "bfloat16"}
WEIGHTS = 15_231_233_024  # its four safetensors files
CARDS_MIB = {"24 GB": 24_564, "40 GB": 40_960, "80 GB": 81_920, "141 GB": 143_771}


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "Qwen2.5-7B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN_7B))
    with open(folder / "model.safetensors", "wb") as f:
        f.truncate(WEIGHTS)  # sparse: takes no disk
    return folder


@pytest.fixture
def card(tmp_path, monkeypatch):
    """One GPU of `mib` MiB (helpers.gpus)."""
    return lambda mib: install(tmp_path, monkeypatch, [mib])


@pytest.mark.parametrize("name", CARDS_MIB)
def test_a_budget_fits_the_cards_that_hold_it_and_is_refused_on_the_others(model, card, name):
    card(CARDS_MIB[name])
    size = devices.memory(["0"])
    assert size == ("GPU 0 (NVIDIA Stand-in)", CARDS_MIB[name] * 2**20)
    # 200,000 tokens x 56 KiB = 10.7 GiB of KV beside 14.2 GiB of weights: 24.9 GiB
    problem = kv_fit_problem(model, "bfloat16", {"kv_tokens": 200_000}, size[1], size[0])
    if name == "24 GB":
        assert problem == (
            "the KV budget does not fit GPU 0 (NVIDIA Stand-in): 200,000 tokens x 56 KiB = 10.7 GiB of KV + 14.2 GiB "
            "of weights = 24.9 GiB, above gpu_memory_utilization 0.9 x 24.0 GiB = 21.6 GiB; at most 138,641 tokens "
            "fit beside the weights (kv_tokens), or use a larger card or more of them (tensor_parallel_size)")
    else:
        assert problem is None
    # left to vLLM (a share of the memory, no fixed budget), there is nothing to check
    assert kv_fit_problem(model, "bfloat16", {"gpu_memory_utilization": 0.45}, size[1]) is None


def test_two_gpus_of_a_tensor_parallel_server_each_hold_half(model):
    settings = {"kv_tokens": 200_000, "tensor_parallel_size": 2}
    assert kv_fit_problem(model, "bfloat16", settings, CARDS_MIB["24 GB"] * 2**20) is None
    refused = kv_fit_problem(model, "bfloat16", {**settings, "kv_tokens": 600_000}, CARDS_MIB["24 GB"] * 2**20)
    assert refused is not None and "per GPU of 2" in refused


def test_a_server_whose_budget_cannot_fit_never_starts(model, card, monkeypatch):
    """Before the minutes a start takes: the start is refused, its GPU given back."""
    from filledfirst.study import EngineStart, Model, ServerSpec, TokenIds

    card(CARDS_MIB["24 GB"])

    def no_start(*args, **kwargs):
        raise AssertionError("the server must not be started")

    monkeypatch.setattr(shared, "VllmServer", no_start)
    spec = ServerSpec(model=Model(name="q", source="path", path=str(model), dtype="bfloat16", max_model_len=4096,
                                  prompt_token_ids=TokenIds(low=1000, high=2000)),
                      engine=EngineStart(launcher="gpu"), server={"kv_tokens": 200_000})
    server = shared.SharedServer(spec, model.parent / "server.log")
    with pytest.raises(ServerStartError, match="the KV budget does not fit GPU 0"):
        server._start_on("kv", "127.0.0.1", 1)
    assert server.lease is None and devices.lease(1).devices == ["0"]


@pytest.mark.parametrize("name", CARDS_MIB)
def test_every_kv_budget_of_the_gpu_study_fits_each_card(model, name):
    """The GPU study's reduced KV (its experiments', its searches' and their interventions':
    twice the budget) is set in tokens, so it is the same on any card from 24 GB up, and
    each fits beside Qwen2.5-7B's weights there."""
    from filledfirst.config import experiment_spec, load_study
    from filledfirst.frontier.plan import frontier_plan
    from filledfirst.model.kv import kv_blocks

    study = load_study([REPO / "config" / "config.yaml"])
    settings = [experiment_spec(study, e).server for e in study.experiments]
    settings += [s for f in study.frontiers for s in frontier_plan(study, f).settings.values()]
    budgets = {kv_blocks("gpu", s) * 16: s for s in settings if kv_blocks("gpu", s) is not None}
    # the reduced KV, twice it (the KV intervention) and the long-prompt-at-the-head run's
    assert sorted(budgets) == [40_960, 49_152, 98_304]
    assert not any("gpu_memory_utilization" in s and s["gpu_memory_utilization"] != 0.9 for s in settings)
    for tokens, s in budgets.items():
        assert kv_fit_problem(model, "bfloat16", s, CARDS_MIB[name] * 2**20) is None, tokens
