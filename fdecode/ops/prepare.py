"""`fdecode::prepare_next_draft`: turn a step's accepted tokens into the next draft's first input
(docs/design.md, "The iteration").

Per lane b (W = K + 1, L = count(accepted[b] >= 0), L == 0 means inactive), two rows, interleaved
[repair_0, current_0, repair_1, current_1, ...]:

    last = accepted[b, L-1];  prev = accepted[b, L-2] if L > 1 else last;  P = base_pos[b] + L
    repair : token prev, position P-1, hidden[b, L-2] (placeholder if L == 1),
             slot(b, P-1) if L == W else slot(b, P+1)
    current: token last, position P,   hidden[b, L-1], slot(b, P)
    kv_lens[b] = base_kv[b] + L

Inactive lanes emit token 0 at their base position with the placeholder hidden and write only the
scratch slot. `prepare_next_draft_reference` is the spec; the registered op dispatches to it on
CPU, and per-device kernels are tested against it.
"""

from __future__ import annotations

import torch

from fdecode.ops.paging import slot_of


def prepare_next_draft_reference(
    accepted: torch.Tensor,  # [B, W] int64, L accepted tokens then -1
    hidden: torch.Tensor,  # [B, W, H] target hidden state of each window row
    placeholder: torch.Tensor,  # [H] hidden used where no previous row exists
    base_pos: torch.Tensor,  # [B] int64, position of the window's first token
    base_kv: torch.Tensor,  # [B] int64, KV length before the window (= base_pos + 1)
    block_tables: torch.Tensor,  # [B, max_blocks] int64
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns tokens [2B], hidden [2B, H], positions [2B], kv_lens [B], slots [2B]."""
    batch, window = accepted.shape
    length = (accepted >= 0).sum(dim=1)  # [B]
    live = length > 0
    i_last = (length - 1).clamp_min(0)
    i_prev = (length - 2).clamp_min(0)
    zero = torch.zeros_like(length)

    last = torch.where(live, accepted.gather(1, i_last[:, None])[:, 0], zero)
    prev = torch.where(length > 1, accepted.gather(1, i_prev[:, None])[:, 0], last)

    def rows_of(index: torch.Tensor) -> torch.Tensor:  # [B] -> [B, H]
        return hidden.gather(1, index[:, None, None].expand(batch, 1, hidden.shape[-1]))[:, 0]

    h_current = torch.where(live[:, None], rows_of(i_last), placeholder)
    h_repair = torch.where((length > 1)[:, None], rows_of(i_prev), placeholder)

    pos = base_pos + length
    repair_target = torch.where(length == window, pos - 1, pos + 1)
    lane_slots = slot_of(block_tables, torch.stack([repair_target, pos], dim=1), block_size)  # [B, 2]
    lane_slots = torch.where(live[:, None], lane_slots, torch.zeros_like(lane_slots))

    tokens = torch.stack([prev, last], dim=1).reshape(2 * batch)
    hidden_rows = torch.stack([h_repair, h_current], dim=1).reshape(2 * batch, hidden.shape[-1])
    positions = torch.stack([pos - 1, pos], dim=1).reshape(2 * batch)
    kv_lens = base_kv + length
    return tokens, hidden_rows.contiguous(), positions, kv_lens, lane_slots.reshape(2 * batch)


@torch.library.custom_op("fdecode::prepare_next_draft", mutates_args=())
def prepare_next_draft(
    accepted: torch.Tensor,
    hidden: torch.Tensor,
    placeholder: torch.Tensor,
    base_pos: torch.Tensor,
    base_kv: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused op (one graph node). See the module docstring for the exact semantics."""
    return prepare_next_draft_reference(accepted, hidden, placeholder, base_pos, base_kv, block_tables, block_size)


@prepare_next_draft.register_fake
def _(accepted, hidden, placeholder, base_pos, base_kv, block_tables, block_size):
    batch = accepted.shape[0]
    rows = 2 * batch
    return (
        accepted.new_empty(rows),
        hidden.new_empty(rows, hidden.shape[-1]),
        base_pos.new_empty(rows),
        base_kv.new_empty(batch),
        base_pos.new_empty(rows),
    )
