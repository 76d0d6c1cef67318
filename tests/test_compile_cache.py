"""`fdecode.save_compile_cache` / `load_compile_cache`: compiled code moves to a process with an empty cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Compiles a small function with Inductor in a fresh process whose cache directory is argv[1]; with argv[2]
# "save", writes the artifacts to argv[3], with "load", loads them first. Prints the FX cache counters.
CHILD = """
import json, sys, torch
import fdecode
from torch._dynamo.utils import counters
cache, action, path = sys.argv[1:4]
if action == "load":
    loaded = fdecode.load_compile_cache(path)
else:
    loaded = {}
f = torch.compile(lambda x: torch.sin(x) * 3 + x.cumsum(0), backend="inductor", fullgraph=True)
f(torch.arange(8.0))
saved = fdecode.save_compile_cache(path) if action == "save" else loaded
print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"], "misses": counters["inductor"]["fxgraph_cache_miss"],
                  "entries": saved}))
"""


def compile_in_a_fresh_process(cache, action: str, path) -> dict:
    # The CPU's vector ISA from its flags, as fdecode's own graphs take it (`fdecode.backends.cpu.vec_isa`): an empty
    # cache would otherwise build Inductor's six ISA probes in each process, most of this test's time.
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_VEC_ISA_OK": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(cache), action, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_saved_artifacts_load_into_an_empty_cache(tmp_path):
    path = tmp_path / "step.cache"
    first = compile_in_a_fresh_process(tmp_path / "cache-a", "save", path)
    assert (first["hits"], first["misses"]) == (0, 1) and first["entries"]["inductor"] == 1
    assert path.stat().st_size > 0
    # Another machine: an empty cache (so a hit can only come from the file), the file loaded first.
    second = compile_in_a_fresh_process(tmp_path / "cache-b", "load", path)
    assert (second["hits"], second["misses"]) == (1, 0)
    assert second["entries"] == first["entries"]
