"""A trace's prefix structure, made sendable and measured against an ideal cache.

Sizes: a length scale (for small engines) multiplies prompts, outputs and the trace's
prefix block alike, so a block stays a block: Mooncake's 512-token blocks at 1/4 are
128 tokens, one block of the CPU engine's cache, and every hit the trace allows stays
possible (at 1/8, 64-token blocks, two of them make one engine block, and a prefix of an
odd number of them loses its last). A prompt keeps as many of its ids as its scaled
length covers.

The ideal: the prompt tokens an unbounded prefix cache would serve each request, in the
schedule's arrival order. Block i of a request hits when an earlier request sent the same
chain of ids up to and including block i (a block's KV depends on everything before
it), it is a whole block of the prompt, and it leaves at least the prompt's last token
to compute (vLLM never serves a whole prompt from the cache: the last token's logits
are what the first output token needs).
"""

from __future__ import annotations

import polars as pl

from filledfirst.errors import UserError
from filledfirst.trace.formats import PREFIX


def scaled_block_tokens(trace_block_tokens: int, length_scale: float) -> int:
    """The sent block size; a scale that does not make it a whole number of tokens is an
    error (rounding it would shift every block boundary away from the trace's)."""
    sent = trace_block_tokens * length_scale
    if abs(sent - round(sent)) > 1e-9 or round(sent) < 1:
        raise UserError(f"length_scale {length_scale:g} makes the trace's {trace_block_tokens}-token prefix block "
                        f"{sent:g} tokens: choose a scale that leaves a whole number >= 1")
    return round(sent)


def scale_lengths(df: pl.DataFrame, length_scale: float) -> pl.DataFrame:
    """prompt and output times the scale, rounded (a prompt at least 1 token, an output
    at least 0, as the trace's rows are)."""
    if length_scale == 1.0:
        return df
    return df.with_columns(
        (pl.col("prompt") * length_scale).round().cast(pl.Int64).clip(lower_bound=1).alias("prompt"),
        (pl.col("output") * length_scale).round().cast(pl.Int64).clip(lower_bound=0).alias("output"),
    )


def fit_blocks(df: pl.DataFrame, block_tokens: int) -> pl.DataFrame:
    """Each request's ids cut to the blocks its (scaled, clipped) prompt covers."""
    covered = (pl.col("prompt") + block_tokens - 1) // block_tokens
    return df.with_columns(pl.col(PREFIX).list.head(covered))


def ideal_cached_tokens(blocks: list[list[int]], prompts: list[int], block_tokens: int) -> list[int]:
    """Per request, in this order: the tokens an unbounded cache would serve (module
    docstring)."""
    seen: set[int] = set()
    out = []
    for ids, prompt in zip(blocks, prompts):
        reusable = (prompt - 1) // block_tokens  # whole blocks, the last token left to compute
        whole = prompt // block_tokens  # a partial last block is never cached
        chain, hits, missed = 0, 0, False
        for i, block in enumerate(ids[:whole]):
            chain = hash((chain, block))
            if not missed and i < reusable and chain in seen:
                hits += 1
            else:
                missed = True  # a block after a miss cannot hit: its chain was never computed
            seen.add(chain)
        out.append(hits * block_tokens)
    return out


def ideal_hit_share(ideal: pl.Series, prompt: pl.Series) -> float | None:
    """The ideal cache's share of all prompt tokens."""
    total = int(prompt.sum())
    return int(ideal.sum()) / total if total else None
