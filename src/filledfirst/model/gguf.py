"""A Hugging Face model folder written as one GGUF file, the form llama.cpp's server reads,
by the converter of the llama.cpp tree `make install` built the server from (so the file
and the server agree on the format).

The converter names a byte-level BPE tokenizer's pre-tokenizer by hashing how it splits a
test string, and refuses one it has no hash for: the tiny model's tokenizer is Qwen2's
class over a five-letter vocabulary, so no hash matches. `pre_tokenizer` then says which
it is (the tiny model's rule passes `qwen2`); for any other model it is left to the hash.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from filledfirst.atomic import atomic_path
from filledfirst.errors import UserError
from filledfirst.installed import LLAMA_CPP_SHARE

# Run in a child: the converter's modules (torch, its own gguf) stay out of this process.
_RUN = """
import sys
from conversion import base
pre = sys.argv.pop(1)
if pre:
    found = base.TextModel.get_vocab_base_pre
    def get_vocab_base_pre(self, tokenizer):
        try:
            return found(self, tokenizer)
        except NotImplementedError:
            return pre
    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


# The model's dtype (model.dtype) as the converter's --outtype: the weights as served.
OUTTYPES = {"float32": "f32", "float": "f32", "float16": "f16", "half": "f16", "bfloat16": "bf16"}


def outtype(dtype: str) -> str:
    """The GGUF type that keeps a model's weights as its dtype has them (f32 when unsaid)."""
    return OUTTYPES.get(dtype, "f32")


class ConverterMissing(UserError):
    pass


def write_gguf(folder: Path, out: Path, *, outtype: str = "f32", pre_tokenizer: str | None = None,
               converter_dir: Path = LLAMA_CPP_SHARE) -> Path:
    """Write the model in `folder` to `out` (atomically) in `outtype` (f32 keeps the tiny
    model's weights exactly as vLLM serves them)."""
    script = converter_dir / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise ConverterMissing(f"{script} is missing: `make install` builds llama.cpp's server and puts its "
                               "converter there (tools/build_llama_server.py)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(converter_dir), str(converter_dir / "gguf-py"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    with atomic_path(out) as tmp:
        proc = subprocess.run(
            [sys.executable, "-c", _RUN, pre_tokenizer or "", str(folder), "--outfile", str(tmp),
             "--outtype", outtype],
            env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise UserError(f"converting {folder} to GGUF failed:\n{proc.stderr[-3000:]}")
    return out
