"""The paged latent cache of multi-head latent attention (MLA, DeepSeek-V2/V3), and attention over it
(docs/design.md, "Multi-head latent attention: DeepSeek-V3 and the latent cache").

An MLA layer caches, per token, one vector shared by every head: the compressed kv `c` (after
`kv_a_layernorm`, `kv_lora_rank` = R values) followed by the rotated shared rope key `k_pe`
(`qk_rope_head_dim` = Dr values), in the paged layout of every fdecode cache with one kind and one
head instead of keys and values of Hkv heads:

    kv: Tensor  # [num_layers, 1, num_slots, 1, R + Dr]   kv[l, 0, s, 0] = [c | k_pe] of slot s

Attention reads the latent directly: with `kv_b_proj = [W_uk; W_uv]` per head, each head's query
becomes `[W_uk^T q_nope | q_pe]` (R + Dr values), the keys are the cached latents (one "head" shared
by all H query heads) and the values their first R values; the caller applies W_uv to the
R-dimensional output. The window, its key slots and the visibility mask are the `PagedContext`
every layer reads (`fdecode.ops.attention`).
"""

from __future__ import annotations

import torch

from fdecode.ops.attention import PagedContext
from fdecode.ops.kv import write_rows


def latent_kv_shape(num_layers: int, num_slots: int, width: int) -> tuple[int, ...]:
    """Shape of a latent cache of `num_layers` layers, `num_slots` tokens, `width` = R + Dr per token."""
    return (num_layers, 1, num_slots, 1, width)


def write_latent(
    kv: torch.Tensor,  # [num_layers, 1, num_slots, 1, R + Dr], written in place
    layer: int,
    slots: torch.Tensor,  # [B, Q] int64
    latent: torch.Tensor,  # [B, Q, R + Dr]: [c | k_pe] of each row
    *,
    way: str = "index_put",
) -> None:
    write_rows(kv, layer, slots, latent[None, :, :, None, :], way=way)


def latent_attention(
    q: torch.Tensor,  # [B, Q, H, R + Dr]: absorbed queries [W_uk^T q_nope | q_pe]
    kv: torch.Tensor,  # [num_layers, 1, num_slots, 1, R + Dr], this call's rows already written
    layer: int,
    ctx: PagedContext,
    *,
    rank: int,  # R: the values are the first R entries of each latent
    scale: float,  # softmax scale (1 / sqrt(Dn + Dr), times DeepSeek's YaRN mscale^2)
) -> torch.Tensor:
    """Attention output in latent space [B, Q, H, R] (q's dtype), before W_uv.

    The H heads of a query row are H rows of one multi-query attention over the lane's latents:
    one `[B, Q*H, R+Dr] @ [B, R+Dr, S]` score product and one `[B, Q*H, S] @ [B, S, R]` value product."""
    b, q_len, heads, width = q.shape
    latents = kv[layer, 0, ctx.key_slots.reshape(-1), 0].view(b, -1, width).to(q.dtype)  # [B, S, R + Dr]
    scores = torch.bmm(q.reshape(b, q_len * heads, width), latents.transpose(1, 2)) * scale  # [B, Q*H, S]
    visible = ctx.mask[:, 0, :, None, :].expand(-1, -1, heads, -1).reshape(b, q_len * heads, -1)  # [B, Q*H, S]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.bmm(probs, latents[..., :rank])  # [B, Q*H, R]
    return out.view(b, q_len, heads, rank)
