"""Triton kernel of `fdecode::prepare_next_draft`, registered as the op's CUDA kernel where triton imports
(docs/backends.md, "The fused op on each backend").

One program per lane b computes exactly what `prepare_next_draft_reference` does (the spec, see
`fdecode.ops.prepare`): rows 2b (repair) and 2b+1 (current), slots by
`fdecode.ops.paging.slot_of`, 0 for an inactive lane (L == 0), hidden rows copied bit for bit.
Inputs the kernel does not cover (integer tensors other than int64, a placeholder of another
dtype than hidden) run the reference on the device instead. Tested against the reference on CPU
with the Triton interpreter (TRITON_INTERPRET=1) and on CUDA in tests/test_cuda.py.
"""

from __future__ import annotations

import torch

from fdecode.ops.prepare import prepare_next_draft, prepare_next_draft_reference

try:
    import triton
    import triton.language as tl
except ImportError:  # no triton (CPU-only installs): the op keeps its reference implementation
    triton = None

BLOCK_H = 128  # hidden columns copied per inner iteration

if triton is not None:

    @triton.jit
    def _slot(tables_row, p, live, max_blocks, block_size):
        in_range = (p >= 0) & (p < max_blocks * block_size)
        column = tl.where(in_range, p // block_size, 0)  # truncating division is floor for p >= 0
        block = tl.load(tables_row + column)
        ok = in_range & (block >= 0) & live
        return tl.where(ok, block * block_size + p % block_size, 0)

    @triton.jit
    def _prepare_kernel(
        accepted,
        hidden,
        placeholder,
        base_pos,
        base_kv,
        tables,  # inputs
        out_tokens,
        out_hidden,
        out_positions,
        out_kv_lens,
        out_slots,  # outputs
        width,
        max_blocks,
        block_size,
        stride_ab,
        stride_aw,
        stride_hb,
        stride_hw,
        stride_hh,
        stride_tb,
        W: tl.constexpr,
        W_P2: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, W_P2)
        row = tl.load(accepted + b * stride_ab + j * stride_aw, mask=j < W, other=-1)  # [W_P2] int64
        length = tl.sum((row >= 0).to(tl.int64), axis=0)
        live = length > 0
        last = tl.sum(tl.where(j == length - 1, row, 0), axis=0)  # 0 for an inactive lane
        prev = tl.where(length > 1, tl.sum(tl.where(j == length - 2, row, 0), axis=0), last)

        pos = tl.load(base_pos + b) + length
        repair_target = tl.where(length == W, pos - 1, pos + 1)
        tables_row = tables + b * stride_tb
        repair_slot = _slot(tables_row, repair_target, live, max_blocks, block_size)
        current_slot = _slot(tables_row, pos, live, max_blocks, block_size)

        tl.store(out_tokens + 2 * b, prev)
        tl.store(out_tokens + 2 * b + 1, last)
        tl.store(out_positions + 2 * b, pos - 1)
        tl.store(out_positions + 2 * b + 1, pos)
        tl.store(out_slots + 2 * b, repair_slot)
        tl.store(out_slots + 2 * b + 1, current_slot)
        tl.store(out_kv_lens + b, tl.load(base_kv + b) + length)

        i_current = tl.maximum(length - 1, 0)
        i_repair = tl.maximum(length - 2, 0)
        for h0 in range(0, width, BLOCK):
            cols = h0 + tl.arange(0, BLOCK)
            m = cols < width
            filler = tl.load(placeholder + cols, mask=m)
            h_current = tl.load(hidden + b * stride_hb + i_current * stride_hw + cols * stride_hh, mask=m)
            h_repair = tl.load(hidden + b * stride_hb + i_repair * stride_hw + cols * stride_hh, mask=m)
            tl.store(out_hidden + (2 * b) * width + cols, tl.where(length > 1, h_repair, filler), mask=m)
            tl.store(out_hidden + (2 * b + 1) * width + cols, tl.where(live, h_current, filler), mask=m)


def unsupported_reason(accepted, hidden, placeholder, base_pos, base_kv, block_tables) -> str | None:
    """Why the kernel does not take these inputs (the reference runs instead), or None."""
    if triton is None:
        return "triton is not importable"
    for name, t in (
        ("accepted", accepted),
        ("base_pos", base_pos),
        ("base_kv", base_kv),
        ("block_tables", block_tables),
    ):
        if t.dtype != torch.int64:
            return f"{name} is {t.dtype}, the kernel reads int64"
    if placeholder.dtype != hidden.dtype:
        return f"placeholder is {placeholder.dtype}, hidden is {hidden.dtype}"
    if hidden.shape[-1] == 0 or accepted.shape[1] == 0:
        return "empty hidden or window"
    return None


def prepare_next_draft_triton(
    accepted: torch.Tensor,  # [B, W] int64
    hidden: torch.Tensor,  # [B, W, H]
    placeholder: torch.Tensor,  # [H]
    base_pos: torch.Tensor,  # [B] int64
    base_kv: torch.Tensor,  # [B] int64
    block_tables: torch.Tensor,  # [B, max_blocks] int64
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel launch (any device Triton runs on, the interpreter's CPU included). Same results as the reference."""
    reason = unsupported_reason(accepted, hidden, placeholder, base_pos, base_kv, block_tables)
    if reason is not None:
        raise ValueError(f"prepare_next_draft_triton: {reason}")
    batch, window = accepted.shape
    width = hidden.shape[-1]
    tables = block_tables.contiguous()
    base_pos, base_kv, placeholder = base_pos.contiguous(), base_kv.contiguous(), placeholder.contiguous()
    tokens = accepted.new_empty(2 * batch)
    rows = hidden.new_empty(2 * batch, width)
    positions = base_pos.new_empty(2 * batch)
    kv_lens = base_kv.new_empty(batch)
    slots = base_pos.new_empty(2 * batch)
    if batch:
        _prepare_kernel[(batch,)](
            accepted,
            hidden,
            placeholder,
            base_pos,
            base_kv,
            tables,
            tokens,
            rows,
            positions,
            kv_lens,
            slots,
            width,
            tables.shape[1],
            block_size,
            accepted.stride(0),
            accepted.stride(1),
            hidden.stride(0),
            hidden.stride(1),
            hidden.stride(2),
            tables.stride(0),  # contiguous: column stride 1
            W=window,
            W_P2=triton.next_power_of_2(window),
            BLOCK=min(BLOCK_H, triton.next_power_of_2(width)),
        )
    return tokens, rows, positions, kv_lens, slots


def _cuda_kernel(accepted, hidden, placeholder, base_pos, base_kv, block_tables, block_size):
    if unsupported_reason(accepted, hidden, placeholder, base_pos, base_kv, block_tables) is not None:
        return prepare_next_draft_reference(accepted, hidden, placeholder, base_pos, base_kv, block_tables, block_size)
    with torch.cuda.device(accepted.device):
        return prepare_next_draft_triton(accepted, hidden, placeholder, base_pos, base_kv, block_tables, block_size)


if triton is not None:
    prepare_next_draft.register_kernel("cuda")(_cuda_kernel)
