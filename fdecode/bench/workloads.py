"""The named workloads of `fdecode bench --workloads`: which target, draft and prompts each runs
(docs/design.md, "Benchmarks, assets and tools").

random-draft / draft=target: random Llamas of the `--target` / `--draft` sizes (the target as its own
draft accepts every token). bundled-mtp / bundled-draft: the bundled model with its MTP head / its
draft LM on held-out prompts (real acceptance). qwen3_5-* and deepseek_v3-*: random Qwen3.5- and
DeepSeek-V3-shaped models with their random MTP heads, or as their own draft. smollm2-grounded /
smollm2-free: the real SmolLM2 with prompt-lookup drafts (`REAL_WORKLOADS`, loaded by the CLI). The
real-vocab and qwen-coder workloads have modules of their own (`fdecode.bench.sampling`,
`fdecode.bench.pair`). `target_of` names the target a workload runs, so that workloads over one
target share its target-only figures.
"""

from __future__ import annotations

import torch

from fdecode.bench.models import deepseek_v3, llama, qwen3_5

WORKLOADS = ("random-draft", "draft=target", "bundled-mtp", "bundled-draft")
HYBRID_WORKLOADS = ("qwen3_5-mtp", "qwen3_5-self")
# The real model with prompt lookup: workload -> its prompts in `fdecode.assets.smollm2`, each run at batch 1.
REAL_WORKLOADS = {"smollm2-grounded": "PROMPTS", "smollm2-free": "FREE_PROMPTS"}
REAL_SEQ_LEN = 512  # one lane capacity for every SmolLM2 prompt: one set of graph shapes
MLA_WORKLOADS = ("deepseek_v3-mtp", "deepseek_v3-self")


def load_workload(name: str, vocab: int, target_size: tuple[int, int], draft_size: tuple[int, int]):
    """(target, draft, prompts or None) of a workload."""
    if name.startswith("bundled"):
        from fdecode.assets import TINY, TINY_DRAFT, heldout_windows
        from fdecode.models import from_hf

        target = from_hf(TINY, dtype=torch.float32)
        draft = "mtp" if name == "bundled-mtp" else from_hf(TINY_DRAFT, dtype=torch.float32)
        windows = heldout_windows()
        return target, draft, [windows[i * 3, :48].tolist() for i in range(len(windows) // 3)]
    if name in HYBRID_WORKLOADS:
        target = qwen3_5(vocab, *target_size, seed=1)
        return target, ("mtp" if name == "qwen3_5-mtp" else target), None
    if name in MLA_WORKLOADS:
        target = deepseek_v3(vocab, *target_size, seed=1)
        return target, ("mtp" if name == "deepseek_v3-mtp" else target), None
    target = llama(vocab, *target_size, seed=1)
    return target, (target if name == "draft=target" else llama(vocab, *draft_size, seed=2)), None


def target_of(name: str) -> str:
    """Which target a workload runs (workloads with the same one share its target-only figures)."""
    if name in MLA_WORKLOADS:
        return "deepseek_v3"
    return "bundled" if name.startswith("bundled") else "qwen3_5" if name in HYBRID_WORKLOADS else "llama"
