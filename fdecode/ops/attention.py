"""Paged attention over a lane's context window: one interface, a pure-torch reference, device kernels
(docs/design.md, "Backends and kernels").

Per forward, `paged_context` turns (block tables, query positions) into what every layer reads; per
layer, `paged_attention` attends the queries to the keys of positions 0 .. window-1 of their lane,
the window being the block table's width (the step passes only the first `context_blocks` columns).
Key j of lane b lives in slot `block_tables[b, j // bs] * bs + j % bs`; a query at position p sees
key j iff j <= p. The call's KV rows are written before attending, so a query sees the keys written
by earlier rows of the same call; unallocated blocks (-1) read the scratch block 0 and are masked by
position. Key 0 is always visible, so a padding row (negative position) stays finite.

Kernels (chosen by `fdecode.graphs.backends.choose_attention`, which states why one is not used):
"torch" (gather, then SDPA with a boolean mask: the reference, and the CPU kernel); "flash_attn"
(CUDA, `flash_attn_with_kvcache` through the registered op `fdecode::flash_attn_paged`) and
"npu_fused_infer_attention" (Ascend NPU) both read the paged cache in place via the block table.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from fdecode.ops.kv import kv_write_for

KERNELS = ("torch", "flash_attn", "npu_fused_infer_attention")


class PagedContext(NamedTuple):
    """What every layer of one forward reads (computed once per forward)."""

    block_tables: torch.Tensor  # [B, nb] int64: the window's blocks, -1 = unallocated
    positions: torch.Tensor  # [B, Q] int64: position of each query row
    key_slots: torch.Tensor  # [B, S] int64, S = nb * bs: slot of key position j
    mask: torch.Tensor  # [B, 1, Q, S] bool, True = visible
    block_size: int
    kernel: str  # one of KERNELS
    kv_write: str  # how layers write their keys and values (`fdecode.ops.kv.WAYS`)
    regions: bool = False  # layers run as compile regions, their KV index a tensor (`fdecode.models.regions`)


class TreeRows(NamedTuple):
    """A forward's rows as the nodes of draft trees (`fdecode.ops.tree`): each row sees the window's keys
    before its tree's root and the keys of its own ancestors, written this call to slots of their own."""

    slots: torch.Tensor  # [B, N] int64: the KV slot each node writes (a position of its own, never shared)
    ancestors: torch.Tensor  # [B, N, N] bool: node j is node i or an ancestor of it (`fdecode.ops.tree.ancestors`)
    root: torch.Tensor  # [B] int64: the root's position (the window's keys before it are the lane's context)


def paged_context(
    block_tables: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    *,
    kernel: str = "torch",
    regions: bool = False,
    tree: TreeRows | None = None,
) -> PagedContext:
    """block_tables: [B, nb] int64; positions: [B, Q] int64. regions: run layers as compile regions where
    the kernel and KV write can index the leaf with a tensor (the reference kernel, "index_put"). tree: the
    rows are tree nodes (Q = N): their keys follow the window's, visible along ancestry, read by the
    reference kernel whatever `kernel` the step's other forwards use (a device kernel reads keys by position
    through the block tables; a tree's nodes write to slots of their own)."""
    offsets = torch.arange(block_size, dtype=block_tables.dtype, device=block_tables.device)  # [bs]
    key_slots = (block_tables.clamp_min(0)[:, :, None] * block_size + offsets).flatten(1)  # [B, S]
    key_pos = torch.arange(key_slots.shape[1], dtype=positions.dtype, device=positions.device)  # [S]
    if tree is not None:  # the context before the root, then the nodes' own keys by ancestry
        kernel = "torch"
        context = (key_pos < tree.root[:, None, None]) | (key_pos == 0)  # [B, 1, S]
        visible = torch.cat([context.expand(-1, positions.shape[1], -1), tree.ancestors], dim=-1)
        key_slots = torch.cat([key_slots, tree.slots], dim=1)  # [B, S + N]
        regions = False  # the tree's keys are read through their slots, not the window's blocks
    else:
        visible = (key_pos <= positions[:, :, None]) | (key_pos == 0)  # [B, Q, S]
    kv_write = kv_write_for(block_tables.device.type)
    regions = regions and kernel == "torch" and kv_write == "index_put"
    return PagedContext(block_tables, positions, key_slots, visible[:, None], block_size, kernel, kv_write, regions)


def paged_attention(
    q: torch.Tensor,  # [B, Q, Hq, D], RoPE applied
    kv: torch.Tensor,  # [num_layers, 2, num_slots, Hkv, D], this call's rows already written
    layer: int,
    ctx: PagedContext,
) -> torch.Tensor:
    """Attention output [B, Q, Hq, D] (in q's dtype) of each query over its lane's window."""
    if ctx.kernel == "flash_attn":
        return _flash_attn(q, kv, layer, ctx)
    if ctx.kernel == "npu_fused_infer_attention":
        return _npu_fused_infer_attention(q, kv, layer, ctx)
    return paged_attention_reference(q, kv, layer, ctx)


def paged_attention_reference(
    q: torch.Tensor, kv: torch.Tensor, layer: int | torch.Tensor, ctx: PagedContext
) -> torch.Tensor:
    """layer: an int, or a [1] int64 tensor (`fdecode.models.regions.layer_indices`); either gathers only
    the window's keys and values."""
    b, _, _, d = q.shape
    flat = ctx.key_slots.reshape(-1)
    num_keys, kv_heads = ctx.key_slots.shape[1], kv.shape[-2]
    keys = kv[layer, 0, flat].view(b, num_keys, kv_heads, d)  # [B, S, Hkv, D]
    values = kv[layer, 1, flat].view(b, num_keys, kv_heads, d)  # [B, S, Hkv, D]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),  # [B, Hq, Q, D]
        keys.transpose(1, 2).to(q.dtype),  # [B, Hkv, S, D]
        values.transpose(1, 2).to(q.dtype),
        attn_mask=ctx.mask,
        scale=1.0 / math.sqrt(d),
        enable_gqa=True,
    )  # [B, Hq, Q, D]
    return out.transpose(1, 2)


@torch.library.custom_op("fdecode::flash_attn_paged", mutates_args=())
def flash_attn_paged(
    q: torch.Tensor,  # [B, Q, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, bs, Hkv, D]: the paged layout flash-attn reads
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,  # [B] int32: keys per lane, <= block_table columns * bs
    block_table: torch.Tensor,  # [B, nb] int32, every entry a valid block
    softmax_scale: float,
) -> torch.Tensor:
    """flash-attn's `flash_attn_with_kvcache` (causal, paged, no new keys) as a registered op, so a
    captured graph holds it as one node. Returns [B, Q, Hq, D] in q's dtype, contiguous."""
    from flash_attn import flash_attn_with_kvcache  # whatever is importable (tests install a CPU stand-in)

    out = flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        cache_seqlens=cache_seqlens,
        block_table=block_table,
        softmax_scale=softmax_scale,
        causal=True,
    )
    return out.to(q.dtype).contiguous()


@flash_attn_paged.register_fake
def _(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def _flash_attn(q: torch.Tensor, kv: torch.Tensor, layer: int, ctx: PagedContext) -> torch.Tensor:
    _, _, num_slots, kv_heads, d = kv.shape
    bs = ctx.block_size
    pages = (num_slots // bs, bs, kv_heads, d)  # the paged layout flash-attn reads
    window = ctx.block_tables.shape[1] * bs  # keys the table holds
    # Rows of a lane end at its last position; lengths count keys 0 .. that position. Lanes whose rows
    # are all padding (negative positions) get one key (slot 0 of their table), like the reference. A
    # lane past the window (an inactive lane's stale base_pos) reads the whole window, never past it.
    lengths = (ctx.positions[:, -1] + 1).clamp(min=q.shape[1], max=window).to(torch.int32)
    return flash_attn_paged(
        q.contiguous(),
        kv[layer, 0].view(pages),
        kv[layer, 1].view(pages),
        lengths,
        ctx.block_tables.clamp_min(0).to(torch.int32),
        1.0 / math.sqrt(d),
    )


def _npu_fused_infer_attention(q: torch.Tensor, kv: torch.Tensor, layer: int, ctx: PagedContext) -> torch.Tensor:
    import torch_npu

    b, q_len, heads, d = q.shape
    _, _, num_slots, kv_heads, _ = kv.shape
    bs = ctx.block_size
    pages = (num_slots // bs, bs, kv_heads * d)  # BnBsH: the paged layout the kernel reads
    window = ctx.block_tables.shape[1] * bs  # keys per lane: the whole window, the mask says which are visible
    out, _ = torch_npu.npu_fused_infer_attention_score(
        q,
        kv[layer, 0].view(pages),
        kv[layer, 1].view(pages),
        atten_mask=~ctx.mask,  # [B, 1, Q, window], True = masked
        actual_seq_lengths=[q_len] * b,
        actual_seq_lengths_kv=[window] * b,
        block_table=ctx.block_tables.clamp_min(0).to(torch.int32),
        block_size=bs,
        num_heads=heads,
        num_key_value_heads=kv_heads,
        scale=1.0 / math.sqrt(d),
        input_layout="BSND",
        sparse_mode=0,
    )  # [B, Q, Hq, D]
    return out.to(q.dtype)
