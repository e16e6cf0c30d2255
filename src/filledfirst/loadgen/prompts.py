"""Request bodies of exact size: prompts as token ids, so usage can be checked against what
was asked. For servers that refuse token ids (or the chat API), a text prompt of common
words stands in: about one token per word in the usual BPE vocabularies, not exactly,
which is why the received prompt size is stored and checked."""

from __future__ import annotations

import json
import random

from filledfirst.contracts.records import ScheduledRequest

# Frequent English words, each a single token (with its leading space) in the Llama, Qwen
# and GPT BPE vocabularies.
_WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education good new first last long great little own other old big high different small "
    "large next early young important few public bad same able make know take see come think "
    "look want give use find tell ask seem feel try leave call keep let begin show hear play "
    "run move live believe hold bring happen write provide sit stand lose pay meet include"
).split()

APIS = ("completions", "chat")
PROMPTS = ("token_ids", "text")


def endpoint(api: str) -> str:
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


def prompt_text(n: int, rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _pieces(req: ScheduledRequest, seed: int) -> list[tuple[random.Random, int]]:
    """(generator, tokens) of each piece of the prompt: one per prefix block, seeded by the
    block's id alone, so requests sharing leading ids share exactly those tokens; then the
    request's own tail, seeded by its id, so every prompt is the same whatever else the
    schedule holds."""
    pieces, left = [], req.prompt_tokens
    for block in req.prefix_blocks if req.block_tokens else ():
        if left <= 0:
            break
        n = min(req.block_tokens, left)
        pieces.append((random.Random(f"{seed}:block:{block}"), n))
        left -= n
    if left > 0:
        pieces.append((random.Random(f"{seed}:{req.request_id}"), left))
    return pieces


def completion_body(
    req: ScheduledRequest, *, model: str, low: int, high: int, seed: int,
    api: str = "completions", prompt: str = "token_ids", cache_salt: str | None = None,
) -> bytes:
    """`cache_salt`: sent with prompts made of prefix blocks (vLLM keeps salted blocks
    apart), so one run cannot hit the blocks an earlier run on the same server left."""
    if api not in APIS or prompt not in PROMPTS:
        raise ValueError(f"api {api!r} (one of {APIS}), prompt {prompt!r} (one of {PROMPTS})")
    if api == "chat" and prompt != "text":
        raise ValueError("the chat API takes text prompts only (prompt: text)")
    pieces = _pieces(req, seed)
    if prompt == "token_ids":
        content: object = [rng.randrange(low, high) for rng, n in pieces for _ in range(n)]
    else:
        content = " ".join(prompt_text(n, rng) for rng, n in pieces)
    body: dict = {"model": model}
    if cache_salt and req.prefix_blocks:
        body["cache_salt"] = cache_salt
    if api == "chat":
        body["messages"] = [{"role": "user", "content": content}]
    else:
        body["prompt"] = content
    body |= {
        "max_tokens": req.output_tokens,
        "min_tokens": req.output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        # Usage on every chunk: vLLM merges several tokens into one chunk when the client
        # lags, and the running completion count says how many each chunk carried.
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    return json.dumps(body, separators=(",", ":")).encode()
