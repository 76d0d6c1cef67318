"""MoE routers: token -> (K expert ids, K weights), fixed shapes, no host sync, no token ever dropped
(docs/design.md, "Mixture of experts: the MoE block, GLM-4.5, the DeepSeek-style MTP head").

Both routers take `x` [N, H] and return `(weights [N, K] float32, experts [N, K] int64)`; the order of
the K slots carries no meaning (the experts' outputs are summed). Names mirror transformers
(`mlp.gate.weight`, `mlp.gate.e_score_correction_bias`), so checkpoints map 1:1.

- `SigmoidRouter` (DeepSeek-V3 / GLM-4.5, `DeepseekV3TopkRouter`): float32 logits and parameters
  (`Float32Module`), s = sigmoid(logits); topk_method "noaux_tc" (grouped, on s +
  e_score_correction_bias) or "greedy" (the top K of s); weights: the chosen s, renormalised when
  `norm_topk_prob`, times `routed_scaling_factor`.
- `SoftmaxRouter` (Qwen3-Next / Qwen3.5-MoE, `Qwen3NextTopKRouter`): logits in the model dtype,
  p = softmax(logits) in float32, the top K of p, divided by their sum when `norm_topk_prob`,
  rounded to the model dtype as transformers does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fdecode.models.layers.float32 import Float32Module
from fdecode.models.moe_config import MoEConfig


class SigmoidRouter(Float32Module):
    def __init__(self, hidden_size: int, moe: MoEConfig) -> None:
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(torch.zeros(moe.num_experts, hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(moe.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (weights [N, K] float32, experts [N, K] int64)."""
        moe = self.moe
        scores = F.linear(x.float(), self.weight.float()).sigmoid()  # [N, E]
        if moe.topk_method == "greedy":
            chosen = scores
        else:
            chosen = scores + self.e_score_correction_bias.float()  # [N, E], used only to choose
            if moe.n_group > 1:
                chosen = _keep_best_groups(chosen, moe.n_group, moe.topk_group)
        experts = chosen.topk(moe.top_k, dim=-1, sorted=False).indices  # [N, K]
        weights = scores.gather(-1, experts)  # [N, K]
        if moe.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * moe.routed_scaling_factor, experts

    def extra_repr(self) -> str:
        moe = self.moe
        return (
            f"experts={moe.num_experts}, top_k={moe.top_k}, topk_method={moe.topk_method}, "
            f"groups={moe.topk_group}/{moe.n_group}, scale={moe.routed_scaling_factor}"
        )


def _keep_best_groups(chosen: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """chosen [N, E] with -inf outside each row's `topk_group` best groups (a group's score: the sum
    of its two best experts)."""
    n, e = chosen.shape
    grouped = chosen.view(n, n_group, e // n_group)  # [N, G, E/G]
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [N, G]
    best = group_scores.topk(topk_group, dim=-1, sorted=False).indices  # [N, topk_group]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, best, True)  # [N, G]
    return grouped.masked_fill(~keep[..., None], float("-inf")).view(n, e)


class SoftmaxRouter(nn.Module):
    def __init__(self, hidden_size: int, moe: MoEConfig) -> None:
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(torch.zeros(moe.num_experts, hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (weights [N, K] float32, experts [N, K] int64)."""
        logits = F.linear(x, self.weight)  # [N, E] model dtype
        top = torch.softmax(logits, dim=-1, dtype=torch.float32).topk(self.moe.top_k, dim=-1)
        weights = top.values
        if self.moe.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(logits.dtype).float(), top.indices

    def extra_repr(self) -> str:
        return f"experts={self.moe.num_experts}, top_k={self.moe.top_k}, norm_topk_prob={self.moe.norm_topk_prob}"
