"""A bench script's measurement in a fresh Python process: run it, return the JSON its last line prints; and the
environment of a process whose caches lie in a folder of their own.

Imported by the scripts that time things a process pays once (cold_start.py, weights_memory.py,
step_vs_revision.py, default_path.py, background_stalls.py); not run on its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def cache_env(folder: str) -> dict[str, str]:
    """The variables that point the Inductor cache and fdecode's stored step graphs at `folder` (its "inductor"
    and "steps"): empty there, every graph is compiled; filled by a run before, they load."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor"),
        "FDECODE_CACHE_DIR": os.path.join(folder, "steps"),
    }


def run_json_child(args: list[str], env: dict[str, str], what: str, cwd: str | None = None) -> dict:
    """Run `python ARGS` with `env` (in `cwd`), and return the JSON object its stdout ends with. A child that
    fails shows the end of its stderr and raises, naming `what` it was."""
    proc = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-3000:])
        raise RuntimeError(f"child {what} failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])
