"""Gated DeltaNet mixer (Qwen3-Next / Qwen3.5 linear attention) over a caller-held recurrent state.

    x -> in_proj_qkv -> causal conv1d (kernel k, SiLU) over the q|k|v channels -> q, k, v heads
    beta = sigmoid(in_proj_b(x)),  g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias)   (float32)
    q, k L2-normalised, q scaled by dk**-0.5, key heads repeat_interleave'd to the value heads
    o = gated delta rule (`fdecode.ops.delta_rule`), then GatedRMSNorm(o, in_proj_z(x)) per value head
    -> out_proj

The module owns weights only; the conv window and the delta-rule state come in as arguments and the
states after the rows go out (see `fdecode.ops.delta_rule` for `valid` and `snapshots`), so the
caller decides what is committed. Parameter names mirror transformers' `Qwen3_5GatedDeltaNet`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fdecode.models.hybrid_config import HybridConfig
from fdecode.models.norms import GatedRMSNorm
from fdecode.ops.delta_rule import causal_conv_rows, gated_delta_rows, l2_normalise


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        key_dim, value_dim = self.hk * self.dk, self.hv * self.dv
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, cfg.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.hv, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.hv, bias=False)
        # Depthwise: weight [conv_dim, 1, kernel], the checkpoint's `conv1d.weight`.
        self.conv1d = nn.Conv1d(cfg.conv_dim, cfg.conv_dim, cfg.linear_conv_kernel, groups=cfg.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(value_dim, cfg.hidden_size, bias=False)
        self.split = (key_dim, key_dim, value_dim)

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, H]
        conv: torch.Tensor,  # [B, conv_dim, k-1] conv window before row 0
        rec: torch.Tensor,  # [B, Hv, dk, dv] float32 delta-rule state before row 0
        valid: torch.Tensor | None = None,  # [B, Q] bool: rows that advance the state, None: all
        *,
        snapshots: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Output [B, Q, H] and the (conv, rec) states after each row ([B, Q, ...], snapshots) or the last."""
        b, q_len, _ = x.shape
        mixed, conv_out = causal_conv_rows(
            self.in_proj_qkv(x), conv, self.conv1d.weight[:, 0], valid, snapshots=snapshots
        )  # [B, Q, conv_dim]
        q, k, v = mixed.split(self.split, dim=-1)
        repeat = self.hv // self.hk
        q = l2_normalise(q.reshape(b, q_len, self.hk, self.dk).float()).repeat_interleave(repeat, dim=2)
        k = l2_normalise(k.reshape(b, q_len, self.hk, self.dk).float()).repeat_interleave(repeat, dim=2)
        v = v.reshape(b, q_len, self.hv, self.dv).float()
        beta = self.in_proj_b(x).sigmoid().float()  # [B, Q, Hv]
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)  # [B, Q, Hv]
        o, rec_out = gated_delta_rows(q * self.dk**-0.5, k, v, g, beta, rec, valid, snapshots=snapshots)
        z = self.in_proj_z(x).reshape(b, q_len, self.hv, self.dv)
        o = self.norm(o.to(x.dtype), z)  # [B, Q, Hv, dv]
        return self.out_proj(o.reshape(b, q_len, self.hv * self.dv)), conv_out, rec_out
