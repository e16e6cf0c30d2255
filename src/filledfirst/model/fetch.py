"""A hub model fetched once into a local folder (`filledfirst model fetch`, the workflow's
rule `fetch_model`), so no server start downloads weights inside its start-up timeout, on
whichever node runs it: every server reads the folder.

The download goes to `<folder>.partial` beside it (resumed there after an interruption:
the hub client skips the files it has) and is renamed into place only when complete, so
the folder is there whole or not at all. A gated model needs a token in the environment
(`HF_TOKEN`, read by the hub client itself, never written anywhere); an air-gapped site
copies the weights into a folder and serves them with `source: path` instead."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from filledfirst.errors import UserError

log = logging.getLogger(__name__)

# Duplicates of the weights some repositories ship for other tools (consolidated PyTorch
# checkpoints under original/): vLLM reads the safetensors beside them.
SKIPPED = ["original/*", "*.pth"]


def fetch(repo: str, out: Path, revision: str | None = None) -> Path:
    """The hub model `repo` (at `revision`) in the folder `out`; nothing is downloaded when
    `out` already holds a model (its config.json)."""
    out = Path(out)
    if (out / "config.json").is_file():
        log.info("%s is already in %s", repo, out)
        return out
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    partial = out.with_name(out.name + ".partial")
    log.info("fetching %s%s into %s", repo, f" at {revision}" if revision else "", out)
    try:
        snapshot_download(repo_id=repo, revision=revision, local_dir=partial, ignore_patterns=SKIPPED)
    except GatedRepoError:
        raise UserError(f"{repo} is gated: accept its licence on the hub, then set HF_TOKEN to a token of that "
                        "account") from None
    except RepositoryNotFoundError:
        raise UserError(f"{repo} is not on the hub (or is private: set HF_TOKEN); model.path is the hub id, "
                        "e.g. Qwen/Qwen2.5-7B-Instruct") from None
    except RevisionNotFoundError:
        raise UserError(f"{repo} has no revision {revision!r} (model.revision)") from None
    except LocalEntryNotFoundError as exc:
        raise UserError(f"cannot fetch {repo}: the hub cannot be reached ({exc}); on a site without internet "
                        "copy the weights into a folder and serve them with model.source: path") from None
    except HfHubHTTPError as exc:
        raise UserError(f"cannot fetch {repo}: {exc}") from None
    if not (partial / "config.json").is_file():
        raise UserError(f"{repo} fetched into {partial} has no config.json: not a model vLLM can serve")
    if out.exists():  # an empty or broken folder in the way (Snakemake removes a stale output itself)
        shutil.rmtree(out)
    partial.rename(out)
    log.info("%s fetched into %s", repo, out)
    return out
