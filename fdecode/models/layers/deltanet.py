"""Gated DeltaNet mixer (Qwen3-Next / Qwen3.5 linear attention) over a caller-held recurrent state
(docs/design.md, "Hybrid models: Qwen3.5, Qwen3-Next, Qwen3.5-MoE and the recurrent state").

    x -> in_proj_qkv (q | k | v), in_proj_z, in_proj_b, in_proj_a      (Qwen3.5, `GatedDeltaNet`)
      or in_proj_qkvz, in_proj_ba laid out per key head                 (Qwen3-Next, `FusedGatedDeltaNet`)
    q|k|v -> causal conv1d (kernel k, SiLU) over the q|k|v channels -> q, k, v heads
    beta = sigmoid(in_proj_b(x)),  g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias)   (float32)
    q, k L2-normalised, q scaled by dk**-0.5, key heads repeat_interleave'd to the value heads
    o = gated delta rule (`fdecode.ops.delta_rule`), then GatedRMSNorm(o, in_proj_z(x)) per value head
    -> out_proj

The module owns weights only; the conv window and the delta-rule state come in as arguments and the
states after the rows go out (see `fdecode.ops.delta_rule` for `valid` and `snapshots`), so the
caller decides what is committed. Parameter names mirror transformers' `Qwen3_5GatedDeltaNet` and
`Qwen3NextGatedDeltaNet`; the two differ only in `project`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fdecode.models.hybrid_config import HybridConfig
from fdecode.models.layers.norms import GatedRMSNorm
from fdecode.ops.delta_rule import causal_conv_rows, gated_delta_rows, l2_normalise


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        key_dim, value_dim = self.hk * self.dk, self.hv * self.dv
        self.make_projections(cfg)
        # Depthwise: weight [conv_dim, 1, kernel], the checkpoint's `conv1d.weight`.
        self.conv1d = nn.Conv1d(cfg.conv_dim, cfg.conv_dim, cfg.linear_conv_kernel, groups=cfg.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(value_dim, cfg.hidden_size, bias=False)
        self.split = (key_dim, key_dim, value_dim)

    def make_projections(self, cfg: HybridConfig) -> None:
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, cfg.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, self.hv * self.dv, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, self.hv, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, self.hv, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, Q, H] -> q|k|v [B, Q, conv_dim] (all q heads, all k heads, all v heads), z [B, Q, Hv * dv],
        b and a [B, Q, Hv]."""
        return self.in_proj_qkv(x), self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)

    def forward(
        self,
        x: torch.Tensor,  # [B, Q, H]
        conv: torch.Tensor,  # [B, conv_dim, k-1] conv window before row 0
        rec: torch.Tensor,  # [B, Hv, dk, dv] float32 delta-rule state before row 0
        valid: torch.Tensor | None = None,  # [B, Q] bool: rows that advance the state, None: all
        *,
        snapshots: bool = False,
        parents: torch.Tensor | None = None,  # [B, Q] int64: tree nodes, each from its parent row's state
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Output [B, Q, H] and the (conv, rec) states after each row ([B, Q, ...], snapshots) or the last."""
        b, q_len, _ = x.shape
        qkv, z, beta_in, a = self.project(x)
        mixed, conv_out = causal_conv_rows(
            qkv, conv, self.conv1d.weight[:, 0], valid, snapshots=snapshots, parents=parents
        )  # [B, Q, conv_dim]
        q, k, v = mixed.split(self.split, dim=-1)
        repeat = self.hv // self.hk
        q = l2_normalise(q.reshape(b, q_len, self.hk, self.dk).float()).repeat_interleave(repeat, dim=2)
        k = l2_normalise(k.reshape(b, q_len, self.hk, self.dk).float()).repeat_interleave(repeat, dim=2)
        v = v.reshape(b, q_len, self.hv, self.dv).float()
        beta = beta_in.sigmoid().float()  # [B, Q, Hv]
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)  # [B, Q, Hv]
        o, rec_out = gated_delta_rows(
            q * self.dk**-0.5, k, v, g, beta, rec, valid, snapshots=snapshots, parents=parents
        )
        z = z.reshape(b, q_len, self.hv, self.dv)
        o = self.norm(o.to(x.dtype), z)  # [B, Q, Hv, dv]
        return self.out_proj(o.reshape(b, q_len, self.hv * self.dv)), conv_out, rec_out


class FusedGatedDeltaNet(GatedDeltaNet):
    """Qwen3-Next's projections: `in_proj_qkvz` and `in_proj_ba`, their outputs grouped per key head.

    Key head h owns a contiguous group [q_h (dk) | k_h (dk) | v (r * dv) | z (r * dv)] of `in_proj_qkvz`
    and [b (r) | a (r)] of `in_proj_ba`, r = Hv / Hk value heads per key head (transformers'
    `fix_query_key_value_ordering`); value head h * r + i is the i-th of group h. `project` regroups
    them into the Qwen3.5 layout (all q heads, all k heads, all v heads), which the conv weight follows.
    """

    def make_projections(self, cfg: HybridConfig) -> None:
        self.in_proj_qkvz = nn.Linear(cfg.hidden_size, 2 * self.hk * self.dk + 2 * self.hv * self.dv, bias=False)
        self.in_proj_ba = nn.Linear(cfg.hidden_size, 2 * self.hv, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        b, q_len, _ = x.shape
        r = self.hv // self.hk
        groups = self.in_proj_qkvz(x).view(b, q_len, self.hk, 2 * self.dk + 2 * r * self.dv)
        q, k, v, z = groups.split((self.dk, self.dk, r * self.dv, r * self.dv), dim=-1)
        beta_in, a = self.in_proj_ba(x).view(b, q_len, self.hk, 2 * r).split((r, r), dim=-1)
        qkv = torch.cat([t.reshape(b, q_len, -1) for t in (q, k, v)], dim=-1)  # [B, Q, conv_dim]
        return qkv, z.reshape(b, q_len, -1), beta_in.reshape(b, q_len, self.hv), a.reshape(b, q_len, self.hv)
