"""Prefill, compiled step and before-loop iteration timed apart, for the DeepSeek-V3-shaped random model.

`fdecode bench` reports a whole run (prefill included) over its steps; this script separates them:
the median of 7 prefills, of 7 runs' mean step time, and of 7 before-loop runs with the prefill subtracted.

    OMP_NUM_THREADS=1 taskset -c 1 python bench/step_apart.py self   # the target as its own draft
    OMP_NUM_THREADS=1 taskset -c 1 python bench/step_apart.py mtp    # its random MTP head
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import fdecode
from fdecode.baseline import BeforeLoop
from fdecode.bench import deepseek_v3, fdecode_loop

NEW, K, PROMPT_LEN = 32, 2, 24


def median_of(fn, n: int = 7):
    times, result = [], None
    for _ in range(n):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main(kind: str) -> None:
    torch.manual_seed(0)
    target = deepseek_v3(4096, 256, 3, seed=1)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=K, max_batch=1, max_seq_len=PROMPT_LEN + NEW + 2 * (K + 1), backend="inductor"
    )
    step = fdecode.compile(target, target if kind == "self" else "mtp", cfg)
    prompt = [torch.randint(0, 4096, (PROMPT_LEN,), generator=torch.Generator().manual_seed(0)).tolist()]
    before = BeforeLoop(step, backend="inductor")
    fdecode_loop(step, prompt, NEW)  # compiles
    before.generate(prompt, max_new_tokens=NEW)

    def steps():
        state, n = step.prefill(prompt, max_new_tokens=NEW), 0
        start = time.perf_counter()
        while not bool(state.step_output.finished[:1].all()):
            state, _ = step(state)
            n += 1
        return (time.perf_counter() - start) / n, n

    with torch.no_grad():
        prefill, _ = median_of(lambda: step.prefill(prompt, max_new_tokens=NEW))
        runs = [steps() for _ in range(7)]
        total, (_, iterations) = median_of(lambda: before.generate(prompt, max_new_tokens=NEW))
    per_step = statistics.median(r[0] for r in runs)
    print(
        f"{kind}: prefill {prefill * 1e3:.1f} ms; fdecode step {per_step * 1e3:.2f} ms x {runs[0][1]}; "
        f"before iteration {(total - prefill) / iterations * 1e3:.2f} ms x {iterations}"
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "self")
