"""Acceptance and stop conditions of the decode step, as fixed-shape tensor math.

Glossary (per lane; W = K + 1):
- *target argmax* g[j]: the target's greedy token after window row j.
- *accepted*: greedy speculative decoding accepts draft d[j] while d[j] == g[j-1];
  with a drafts accepted the lane commits g[0 .. a] (the last one is the
  correction, or the bonus token when a == K), L = a + 1 tokens, then -1 padding.
- *stop*: a committed token in the lane's stop ids (it is emitted, nothing after
  it), or the lane's remaining budget reaching 0.

No host syncs: first-match indices come from `argmax` over a padded boolean
row (argmax returns the first maximal index), never from `nonzero` or `.item()`.
"""

from __future__ import annotations

import torch


def first_true(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last dim, or mask.shape[-1] if none.  [..., N] -> [...]"""
    padded = torch.cat([mask, torch.ones_like(mask[..., :1])], dim=-1)
    return padded.to(torch.int64).argmax(dim=-1)


def greedy_accept(tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification of a window.

    tokens:        [B, W] int64, t then K drafts
    target_logits: [B, W, V] target logits of each window row
    returns:       accepted [B, W] int64 (-1 padded), length [B] int64 (1..W)
    """
    window = tokens.shape[1]
    greedy = target_logits.argmax(dim=-1)  # [B, W]
    drafts_accepted = first_true(tokens[:, 1:] != greedy[:, :-1])  # [B], 0..K
    length = drafts_accepted + 1
    keep = torch.arange(window, device=tokens.device)[None, :] < length[:, None]
    return torch.where(keep, greedy, torch.full_like(greedy, -1)), length


def apply_stops(
    accepted: torch.Tensor,  # [B, W] int64, -1 padded
    length: torch.Tensor,  # [B] int64
    active: torch.Tensor,  # [B] bool
    remaining: torch.Tensor,  # [B] int64 budget left
    stop_ids: torch.Tensor,  # [B, E] int64, -1 = none
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cut each lane's accepted run at its first stop id and at its budget; silence inactive lanes.

    returns accepted [B, W] (cut, -1 padded), length [B], remaining [B], finished [B] bool
    """
    window = accepted.shape[1]
    is_stop = ((accepted[:, :, None] == stop_ids[:, None, :]) & (accepted[:, :, None] >= 0)).any(dim=-1)
    stop_at = first_true(is_stop)  # [B], W if no stop id was accepted
    length = torch.minimum(torch.minimum(length, stop_at + 1), remaining.clamp_min(0))
    length = torch.where(active, length, torch.zeros_like(length))
    keep = torch.arange(window, device=accepted.device)[None, :] < length[:, None]
    accepted = torch.where(keep, accepted, torch.full_like(accepted, -1))
    remaining = remaining - length
    finished = ~active | (stop_at < length) | (remaining <= 0)
    return accepted, length, remaining, finished
