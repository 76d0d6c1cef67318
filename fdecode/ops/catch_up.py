"""A draft LM that sits out depth-0 steps, and the step that catches it up (`DecodeConfig.draft_catch_up`;
docs/design.md, "Depth 0 and the idle draft").

A step of depth 0 verifies no draft: the target alone commits one token per lane, as target-only decoding
would. Running the draft there only keeps its KV in step, so a draft LM (`fdecode.drafts.Drafter.idles`)
sits such steps out, and the tokens it missed wait in the state (`DecodeState.missed`: per lane the last C
committed tokens the draft has not seen, the newest, at base_pos, last; -1 where none). The next step that
drafts is a catch-up step: it verifies the first row as depth 0 does, and the draft's first forward runs over
the missed tokens (at their positions, writing their KV) and the newly committed one, which proposes one
draft. A lane admitted meanwhile misses nothing; its row is all -1 and those rows only pad.

The host keeps the count of depth-0 steps since the draft last ran (`HostRecord.draft_lag`), and the step
catches up before a lane could miss more than C tokens. Were one to, the draft would attend over KV it
never wrote: worse drafts, never a wrong token (verification decides what is committed).
"""

from __future__ import annotations

import torch

from fdecode.ops.paging import slot_of


def sit_out(missed: torch.Tensor, committed: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """`missed` [B, C] after a depth-0 step the draft sat out: each lane that committed a token ([B], with
    `length` [B] 1, else 0) shifts it in as its newest; the oldest falls out."""
    shifted = torch.cat([missed[:, 1:], committed[:, None]], dim=1)
    return torch.where((length > 0)[:, None], shifted, missed)


def missed_rows(
    missed: torch.Tensor, base_pos: torch.Tensor, block_tables: torch.Tensor, live: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The draft's rows for the tokens it missed: (tokens, positions, slots), each [B, C]. Column j of lane b
    is position base_pos - (C - 1 - j); a column with nothing missed (or a lane not `live`) is padding:
    token 0 at position -1 (it sees key 0 only), writing the scratch slot 0."""
    width = missed.shape[1]
    positions = base_pos[:, None] - (width - 1) + torch.arange(width, device=missed.device)
    real = (missed >= 0) & live[:, None]
    slots = torch.where(real, slot_of(block_tables, positions, block_size), torch.zeros_like(positions))
    return missed.clamp_min(0), torch.where(real, positions, -1), slots


def missed_first(
    missed: torch.Tensor,
    base_pos: torch.Tensor,
    block_tables: torch.Tensor,
    live: torch.Tensor,
    block_size: int,
    rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, ...]:
    """A catch-up forward's rows: the tokens the draft missed (`missed_rows`, hidden state zeros: a draft LM reads
    none) in front of `rows` (tokens, positions, slots [B, R] and hidden_in [B, R, H])."""
    hidden = rows[3]
    pad = hidden.new_zeros(hidden.shape[0], missed.shape[1], hidden.shape[-1])
    sat_out = (*missed_rows(missed, base_pos, block_tables, live, block_size), pad)
    return tuple(torch.cat([before, row], dim=1) for before, row in zip(sat_out, rows))
