"""Interventions: a search's setting with one limit relaxed, to test what filled first.

For each setting a frontier verifies (its `verify`), two more searches of the same shape:
the sequence cap (max_num_seqs) times FACTOR and the KV budget (in tokens) times FACTOR.
Which one relaxes the limit that filled first at the knee and which is the control is
known only once the knee's probe is diagnosed, so table `frontiers` assigns the roles
(filledfirst.analysis.frontiers). The workflow can then name every search before any of
them has run. Each intervention starts from its parent's knee (filledfirst.run.search).

The KV budget is relaxed in the unit the setting states it in: `kv_tokens` doubles, or
`num_gpu_blocks_override` doubles (blocks of block_size tokens: the same tokens). A
setting with neither has no KV budget to double (a share of GPU memory is not one), and
`relaxations` says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from filledfirst.contracts.search import Intervention, Knob
from filledfirst.model.kv import block_size

FACTOR = 2
_SUFFIX = {Knob.SEQS: f"seqs_x{FACTOR}", Knob.KV: f"kv_x{FACTOR}"}


def intervention_name(parent: str, knob: Knob) -> str:
    """The setting name of `parent` with `knob` relaxed (its folder: results/frontiers/<frontier>/<name>)."""
    return f"{parent}_{_SUFFIX[knob]}"


def relaxations(parent: str, server: Mapping[str, Any], launcher: str,
                min_shift: float) -> tuple[list[Intervention], list[str]]:
    """The interventions of `parent`, whose vLLM settings (the engine's under the setting's)
    are `server`, and why any cannot be made; `min_shift`: the frontier's verify_min_shift."""
    out, problems = [], []
    cap = server.get("max_num_seqs")
    if cap is None:
        problems.append(f"setting {parent!r}: state max_num_seqs (in engine.server or the setting) to relax it")
    else:
        out.append(Intervention(parent=parent, knob=Knob.SEQS, before=int(cap), after=int(cap) * FACTOR,
                                changes={"max_num_seqs": int(cap) * FACTOR}, min_shift=min_shift))
    if server.get("kv_tokens") is not None:
        tokens = int(server["kv_tokens"])
        changes: dict[str, Any] = {"kv_tokens": tokens * FACTOR}
    elif server.get("num_gpu_blocks_override") is not None:
        blocks = int(server["num_gpu_blocks_override"])
        tokens, changes = blocks * block_size(launcher, server), {"num_gpu_blocks_override": blocks * FACTOR}
    else:
        tokens = None
        problems.append(f"setting {parent!r}: state its KV budget (kv_tokens) to relax it; a share of memory "
                        "(gpu_memory_utilization) means other tokens on other GPUs")
    if tokens is not None:
        out.append(Intervention(parent=parent, knob=Knob.KV, before=tokens, after=tokens * FACTOR, changes=changes,
                                min_shift=min_shift))
    return out, problems
