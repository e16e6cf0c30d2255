"""The tiny model: reproducible bytes, a tokenizer that round-trips, no special ids sampled."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from filledfirst.model.tiny import (
    EOS_ID,
    PROMPT_TOKEN_HIGH,
    PROMPT_TOKEN_LOW,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    build_tiny_model,
)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    build_tiny_model(out)
    return out


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    # AutoTokenizer is what vLLM uses; for a qwen2 model it picks Qwen2Tokenizer.
    return transformers.AutoTokenizer.from_pretrained(model_dir)


def test_two_builds_are_byte_identical(model_dir, tmp_path):
    again = tmp_path / "again"
    build_tiny_model(again)
    first = _hashes(model_dir)
    assert first == _hashes(again)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(first)


def test_rebuild_replaces_folder_and_leaves_no_temp(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    build_tiny_model(out)
    assert not (out / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_size_is_small(model_dir):
    assert sum(p.stat().st_size for p in model_dir.iterdir()) < 3_000_000


def test_config_values(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["model_type"] == "qwen2"
    expected = {
        "vocab_size": 2050,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "eos_token_id": EOS_ID,
    }
    assert {k: cfg[k] for k in expected} == expected
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == EOS_ID


def test_special_tokens(tokenizer):
    assert len(tokenizer) == VOCAB_SIZE
    assert tokenizer.eos_token == "</s>" and tokenizer.eos_token_id == EOS_ID
    assert sorted(tokenizer.all_special_ids) == list(range(len(SPECIAL_TOKENS)))
    assert (PROMPT_TOKEN_LOW, PROMPT_TOKEN_HIGH) == (10, 2050)


def test_every_prompt_id_decodes_to_visible_text(tokenizer):
    blank = [i for i in range(PROMPT_TOKEN_LOW, VOCAB_SIZE) if not tokenizer.decode([i]).strip()]
    assert blank == []


def test_non_special_ids_decode_non_empty(tokenizer):
    specials = set(tokenizer.all_special_ids)
    texts = {i: tokenizer.decode([i], skip_special_tokens=True) for i in range(VOCAB_SIZE) if i not in specials}
    assert all(texts.values())


def test_prompt_ids_round_trip_through_text(tokenizer, model_dir):
    rng = random.Random(7)
    ids = [rng.randrange(PROMPT_TOKEN_LOW, PROMPT_TOKEN_HIGH) for _ in range(3000)]
    assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids
    # The same from the raw tokenizer.json, as other tokenizer loaders would read it.
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert raw.encode(raw.decode(ids), add_special_tokens=False).ids == ids


def test_model_never_favours_ids_below_prompt_range(model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(PROMPT_TOKEN_LOW, PROMPT_TOKEN_HIGH, (3, 200), generator=gen)
    with torch.no_grad():
        probs = model(ids).logits.softmax(-1)
    assert probs[..., :PROMPT_TOKEN_LOW].max().item() < 1e-6
    # ...while the words stay close to uniform (a random model, nothing learned).
    assert probs[..., PROMPT_TOKEN_LOW:].max().item() < 0.01
