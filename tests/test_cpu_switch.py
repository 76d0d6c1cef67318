"""The CPU backend's one switch (`fdecode.backends.cpu`): on by default for Inductor on the CPU, and
`FDECODE_CPU_TUNING=0` in the environment gives Inductor's defaults (no oneDNN pass, no trusted ISA,
nothing packed, plain prefill linears)."""

from __future__ import annotations

import os
import subprocess
import sys

import fdecode
from fdecode.backends import cpu

SCRIPT = """
import contextlib
import fdecode
from fdecode.backends import cpu
cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=1, max_seq_len=32, block_size=4, backend="inductor")
plain = [isinstance(c, contextlib.nullcontext) for c in (cpu.compiling(), cpu.loading(), cpu.eager_linears("cpu"))]
print(cpu.ENABLED, sorted(cpu.inductor_options(cfg, "inductor")), cpu.packs_weights(cfg, "inductor"), plain)
"""


def test_the_tuning_is_on_by_default_for_inductor_on_the_cpu_only():
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=1, max_seq_len=32, block_size=4)
    assert cpu.ENABLED and "post_grad_custom_pre_pass" in cpu.inductor_options(cfg, "inductor")
    assert cpu.inductor_options(cfg, "aot_eager") == {}


def test_the_switch_turns_every_part_of_the_cpu_tuning_off():
    env = {**os.environ, "FDECODE_CPU_TUNING": "0"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False [] False [True, True, True]"
