"""Mixture-of-experts feed-forward, one block for every MoE family, in fixed shapes
(docs/design.md, "Mixture of experts: the MoE block, GLM-4.5, the DeepSeek-style MTP head").

    block = moe_block(cfg, moe)       # DeepseekMoE ("sigmoid" router) or QwenMoE ("softmax")
    y = block(x)                      # x [..., H] -> [..., H], any leading shape, model dtype
    mlp = feed_forward(cfg, moe, i, first_dense=k)   # layer i: dense MLP below k, else moe_block

`Experts` holds the E routed SwiGLU experts stacked in transformers' fused layout, `gate_up_proj`
[E, 2I, H] (each expert's gate_proj rows, then its up_proj rows) and `down_proj` [E, H, I]; a
checkpoint's per-expert keys are stacked by the loader (`fdecode.models.loading.expert_weights`).
Cost follows the experts the tokens use, not E: one batched matmul per projection over the gathered
weights of the chosen (token, slot) pairs, in chunks under `GATHER_BUDGET` elements; no capacity, no
token dropped, no host sync, no data-dependent shape. Sums over the K slots are float32.

Under tensor parallelism (`fdecode.models.sharding`) each rank holds a 1/N slice of every expert's
intermediate width and of the shared experts', and `tp` is set: the block's output is then this rank's
partial sum, and one all-reduce (`summed`) ends the block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.layers.decoder_layer import MLP
from fdecode.models.layers.reduce import summed
from fdecode.models.layers.routing import SigmoidRouter, SoftmaxRouter
from fdecode.models.moe_config import MoEConfig

GATHER_BUDGET = 1 << 26  # elements of gathered expert weights one chunk of rows may hold (256 MiB in fp32)


class Experts(nn.Module):
    def __init__(self, hidden_size: int, moe: MoEConfig) -> None:
        super().__init__()
        e, i, h = moe.num_experts, moe.moe_intermediate_size, hidden_size
        self.num_experts, self.intermediate_size = e, i
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """x [N, H], weights [N, K] float32, experts [N, K] int64 -> sum_k weights[:, k] * expert_k(x), [N, H]."""
        n, k = experts.shape
        per_pair = self.gate_up_proj[0].numel() + self.down_proj[0].numel()
        rows = max(1, GATHER_BUDGET // (k * per_pair))  # static: shapes decide it, never values
        if n <= rows:
            return self._pairs(x, weights, experts)
        return torch.cat([self._pairs(*part) for part in zip(x.split(rows), weights.split(rows), experts.split(rows))])

    def _pairs(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj[experts]  # [N, K, 2I, H]: the chosen experts' weights, per pair
        h = torch.matmul(gate_up, x[:, None, :, None]).squeeze(-1)  # [N, K, 2I]
        gate, up = h.split(self.intermediate_size, dim=-1)
        act = F.silu(gate) * up  # [N, K, I]
        out = torch.matmul(self.down_proj[experts], act[..., None]).squeeze(-1)  # [N, K, H]
        return (out.float() * weights[..., None]).sum(dim=1).to(x.dtype)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, hidden={self.down_proj.shape[1]}, intermediate={self.intermediate_size}"


class DeepseekMoE(nn.Module):
    """DeepSeek-V3 / GLM-4.5: `SigmoidRouter` experts + the always-on `shared_experts` MLP
    (n_shared_experts * I wide): y = experts(x) + shared_experts(x)."""

    tp = None  # the `TPGroup` whose ranks hold slices of every expert (`fdecode.models.sharding`), None: whole

    def __init__(self, cfg: ModelConfig, moe: MoEConfig) -> None:
        super().__init__()
        self.gate = SigmoidRouter(cfg.hidden_size, moe)
        self.experts = Experts(cfg.hidden_size, moe)
        self.shared_experts = MLP(cfg, moe.moe_intermediate_size * moe.n_shared_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # [N, H]
        routed = self.experts(flat, *self.gate(flat))
        return summed(routed + self.shared_experts(flat), self.tp).view(x.shape)


class QwenMoE(nn.Module):
    """Qwen3-Next / Qwen3.5-MoE: `SoftmaxRouter` experts + one shared expert gated per token:
    y = experts(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)."""

    tp = None  # as `DeepseekMoE.tp`

    def __init__(self, cfg: ModelConfig, moe: MoEConfig) -> None:
        super().__init__()
        self.gate = SoftmaxRouter(cfg.hidden_size, moe)
        self.experts = Experts(cfg.hidden_size, moe)
        self.shared_expert = MLP(cfg, moe.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # [N, H]
        routed = self.experts(flat, *self.gate(flat))
        shared = torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return summed(routed + shared, self.tp).view(x.shape)


def moe_block(cfg: ModelConfig, moe: MoEConfig) -> nn.Module:
    """The MoE feed-forward `moe.router` names, for hidden size `cfg.hidden_size`."""
    return DeepseekMoE(cfg, moe) if moe.router == "sigmoid" else QwenMoE(cfg, moe)


def feed_forward(cfg: ModelConfig, moe: MoEConfig | None, layer: int, *, first_dense: int) -> nn.Module:
    """Decoder layer `layer`'s feed-forward: the dense SwiGLU `MLP` (intermediate_size) for the first
    `first_dense` layers (DeepSeek / GLM `first_k_dense_replace`) or without `moe`, else the MoE block."""
    return MLP(cfg) if moe is None or layer < first_dense else moe_block(cfg, moe)
