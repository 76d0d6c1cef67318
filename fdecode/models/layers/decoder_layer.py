"""Building blocks shared by the target LM and the MTP head: RMSNorm, paged attention, SwiGLU MLP
(docs/design.md, "Model families and the registry").

Paged attention, per layer and per call (all shapes fixed, no host sync):
1. project the B*Q query tokens to q, k, v; (Qwen3) RMSNorm each head of q and k; RoPE at `positions`;
2. write k, v into the cache at `slots` *before* attending, so a query sees the keys of
   earlier tokens of the same call; causality inside the window comes from the mask;
3. attend over the lane's context window through its block table (`fdecode.ops.attention`:
   key j is visible to a query at position p iff j <= p).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.layers.rope import RotaryEmbedding
from fdecode.ops.attention import PagedContext, paged_attention
from fdecode.ops.kv import write_kv


class RMSNorm(nn.Module):
    """HF-compatible RMSNorm: normalise in float32, cast back, then scale (in the input dtype)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)  # [..., dim]
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        # HF Llama/Qwen3 put `attention_bias` on o_proj too; Qwen2 biases only q/k/v.
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=cfg.attention_bias and cfg.model_type != "qwen2")
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, H]
        positions: torch.Tensor,  # [B, Q] int64
        slots: torch.Tensor,  # [B, Q] int64, where each token's k/v is written
        kv: torch.Tensor,  # [num_layers, 2, num_slots, Hkv, D] the whole cache leaf, written in place
        layer: int,  # which layer of `kv` this is
        ctx: PagedContext,  # the lanes' context windows (keys and visibility)
        rotary: RotaryEmbedding,
    ) -> torch.Tensor:
        b, q_len, _ = x.shape
        q = self.q_proj(x).view(b, q_len, self.num_heads, self.head_dim)  # [B, Q, Hq, D]
        if self.q_norm is not None:
            q = self.q_norm(q)
        self.write(x, positions, slots, kv, layer, ctx, rotary)  # before attending: see the module docstring
        out = paged_attention(rotary(q, positions), kv, layer, ctx)  # [B, Q, Hq, D]
        return self.o_proj(out.reshape(b, q_len, self.num_heads * self.head_dim))

    def write(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: torch.Tensor,
        layer: int,
        ctx: PagedContext,
        rotary: RotaryEmbedding,
    ) -> None:
        """Write the rows' keys (normed, rotated) and values [B, Q, Hkv, D] at `slots`, and nothing else."""
        b, q_len, _ = x.shape
        k = self.k_proj(x).view(b, q_len, self.num_kv_heads, self.head_dim)  # [B, Q, Hkv, D]
        v = self.v_proj(x).view(b, q_len, self.num_kv_heads, self.head_dim)  # [B, Q, Hkv, D]
        if self.k_norm is not None:
            k = self.k_norm(k)
        write_kv(kv, layer, slots, rotary(k, positions), v, way=ctx.kv_write)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); `intermediate_size` defaults to the config's (an MoE's shared
    expert passes its own)."""

    def __init__(self, cfg: ModelConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        inner = cfg.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(cfg.hidden_size, inner, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, inner, bias=False)
        self.down_proj = nn.Linear(inner, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(.)).

    `attention` / `mlp`: the mixer and feed-forward a family uses instead of the Llama `Attention` and
    SwiGLU `MLP` (DeepSeek-V3: `MLAttention` and the MoE); any module with the same call signature.
    """

    def __init__(self, cfg: ModelConfig, *, attention: nn.Module | None = None, mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.self_attn = Attention(cfg) if attention is None else attention
        self.mlp = MLP(cfg) if mlp is None else mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, H]
        positions: torch.Tensor,  # [B, Q] int64
        slots: torch.Tensor,  # [B, Q] int64
        kv: torch.Tensor,  # [num_layers, 2, num_slots, Hkv, D]
        layer: int,
        ctx: PagedContext,
        rotary: RotaryEmbedding,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, slots, kv, layer, ctx, rotary)
        return x + self.mlp(self.post_attention_layernorm(x))

    def write_kv(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: torch.Tensor,
        layer: int,
        ctx: PagedContext,
        rotary: RotaryEmbedding,
    ) -> None:
        """Write the keys and values `forward` would write, and nothing else (an MTP module that does not
        run at these rows, `mtp.run_one_layer_writing_all`); the attention needs a `write` of that call."""
        self.self_attn.write(self.input_layernorm(x), positions, slots, kv, layer, ctx, rotary)


def init_random_(module: nn.Module, *, seed: int, std: float) -> None:
    """Deterministic init from a local generator: weights and biases ~ N(0, std), norm weights ~ 1 + N(0, std).

    Norm weights are not exactly 1 so that a test notices a norm weight that is dropped or swapped.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
            if name.endswith("norm.weight"):
                noise += 1.0
            param.copy_(noise.to(param.dtype))
