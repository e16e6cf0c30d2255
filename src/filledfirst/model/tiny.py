"""A tiny random-weight Qwen2 model, built offline and byte-for-byte reproducibly.

It exists so the real vLLM engine can run anywhere (CPU, CI) without downloading weights.
The architecture is Qwen2's, so vLLM takes its ordinary code path; only the sizes are small.

Vocabulary (2,050 ids):
  0..3    `<pad>` `<s>` `</s>` (eos) `<unk>`: special, decoded to "" by default;
  4..9    the alphabet BPE builds words from: a space and the letters a-e;
  10..2049 words of one to five letters a-e, each with a leading space (" a", " cab").
Prompts should use ids in [10, 2050) (`model.prompt_token_ids: {low: 10, high: 2050}`):
every such id decodes to visible text and re-encodes to itself, alone or in a sequence.

The weights are random except for one channel, set so the model never samples an id
below 10: a random model otherwise emits `</s>` or `<pad>` now and then, whose streamed
chunk carries no text, and without `ignore_eos` an early `</s>` cuts the output short.

Why byte-level BPE and not a simpler WordLevel vocabulary: transformers 5 loads any
tokenizer of a `qwen2` model as its Qwen2Tokenizer, which rebuilds a byte-level BPE from
the saved vocabulary and merges (with Qwen's pre-tokenizer and decoder) and ignores the
rest of tokenizer.json. A WordLevel vocabulary then encodes text to nothing and decodes
without spaces. So the tokenizer is built by that same class and means the same on load.
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path

from filledfirst.atomic import atomic_dir

log = logging.getLogger(__name__)

VOCAB_SIZE = 2050
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))
LETTERS = "abcde"
SPACE = "\u0120"  # byte-level BPE's stand-in for " " ("Ġ")
PROMPT_TOKEN_LOW = len(SPECIAL_TOKENS) + 1 + len(LETTERS)  # 10: the first word
PROMPT_TOKEN_HIGH = VOCAB_SIZE
SEED = 0

# The bias channel: every word's embedding carries +1 there and no layer writes to it, so
# the final normalised hidden state is large and positive in it whatever the input; ids
# below PROMPT_TOKEN_LOW carry -1, which puts their logits about 20 below every word's.
_BIAS_DIM = 0


# The default shape, and the width of one attention head whatever the hidden size, so a
# larger variant (a slower model for checking that a study does not depend on the
# machine's speed) keeps Qwen2's grouped-query layout: two query heads per KV head.
DEFAULT_LAYERS = 2
DEFAULT_HIDDEN = 128
HEAD_DIM = 32


def qwen2_config(layers: int = DEFAULT_LAYERS, hidden_size: int = DEFAULT_HIDDEN):
    from transformers import Qwen2Config

    if layers < 1 or hidden_size < 2 * HEAD_DIM or hidden_size % (2 * HEAD_DIM):
        raise ValueError(f"tiny model: layers >= 1 and hidden_size a multiple of {2 * HEAD_DIM} "
                         f"(got {layers} layers, hidden size {hidden_size})")
    heads = hidden_size // HEAD_DIM
    return Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )


def _words() -> list[str]:
    """Shortest first, so every word's prefix is itself a word (BPE builds it by merges)."""
    need = VOCAB_SIZE - PROMPT_TOKEN_LOW
    words: list[str] = []
    for length in itertools.count(1):
        words += ("".join(p) for p in itertools.product(LETTERS, repeat=length))
        if len(words) >= need:
            return words[:need]


def vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Token -> id, and the merges that grow each word one letter at a time."""
    tokens = [*SPECIAL_TOKENS, SPACE, *LETTERS, *(SPACE + w for w in _words())]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = [(tok[:-1], tok[-1]) for tok in tokens[PROMPT_TOKEN_LOW:]]
    return vocab, merges


CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def build_tokenizer():
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    vocab, merges = vocabulary()
    return Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=32768,
        # Plain concatenation: enough for the chat API to accept text prompts.
        chat_template=CHAT_TEMPLATE,
    )


def build_model(layers: int = DEFAULT_LAYERS, hidden_size: int = DEFAULT_HIDDEN):
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(qwen2_config(layers, hidden_size)).to(torch.float32).eval()
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[:, _BIAS_DIM] = 1.0
        emb[:PROMPT_TOKEN_LOW, _BIAS_DIM] = -1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[_BIAS_DIM, :] = 0.0
            layer.mlp.down_proj.weight[_BIAS_DIM, :] = 0.0
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID
    )
    return model


def build_tiny_model(out_dir: Path, layers: int = DEFAULT_LAYERS, hidden_size: int = DEFAULT_HIDDEN) -> None:
    """Write config, safetensors weights and tokenizer into `out_dir`, replacing it whole.
    Every shape has the same tokenizer, so one study config serves any of them."""
    out_dir = Path(out_dir)
    model = build_model(layers, hidden_size)
    tokenizer = build_tokenizer()
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _make_readable(tmp)
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    log.info("tiny model written to %s (%.1f MB)", out_dir, size / 1e6)


def _make_readable(folder: Path) -> None:
    # mkdtemp and the safetensors writer create owner-only modes; a model folder is shared
    # data (another user's job or a container may serve it), so give it the usual modes.
    os.chmod(folder, 0o755)
    for path in folder.iterdir():
        os.chmod(path, 0o644)
