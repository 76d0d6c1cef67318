"""Prompt lookup (n-gram drafts) as fixed-shape tensor math, and the same lookup on host lists
(docs/design.md, "Prompt lookup: n-gram drafts").

Per lane, the history holds the committed token at each position (prompt included; -1 where
nothing is committed yet). With P the position of the last committed token, the lookup takes the
last n tokens h[P-n+1 .. P] and finds their latest earlier occurrence, ending at some i < P; it
proposes the (up to) K tokens that followed it, h[i+1 .. min(i+K, P)]. n runs from `max_n` down to
`min_n`: the longest n with a match wins, and within it the latest match. No match proposes
nothing. A proposal is padded with -1 to K entries: a draft id < 0 is "nothing proposed", which
verification never accepts (`fdecode.ops.sampling`).

No host sync, no data-dependent shapes: every n is one comparison of the history with itself
shifted, the latest match is a max over positions, and nothing but compares, ands, gathers and
max reductions is used (no bitwise xor or shifts, which Ascend GE has no converters for).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NONE = -1  # "no token": past the committed history, and a draft that was not proposed


def write_history(history: torch.Tensor, base_pos: torch.Tensor, accepted: torch.Tensor) -> None:
    """Write each lane's accepted run at positions base_pos + 1 .. base_pos + W, in place.

    history: [B, S] int64 with S >= a lane's blocks' positions + W (room for the -1 padding past the last position);
    accepted: [B, W] int64, -1 padded. The padding lands past the lane's new last position, where
    nothing is committed; positions up to base_pos are never touched."""
    positions = base_pos[:, None] + 1 + torch.arange(accepted.shape[1], device=accepted.device)
    history.scatter_(1, positions.clamp(0, history.shape[1] - 1), accepted)


def lookup(history: torch.Tensor, last_pos: torch.Tensor, k: int, max_n: int, min_n: int) -> torch.Tensor:
    """The K proposed tokens of each lane [B, K] int64, -1 where nothing is proposed.

    history: [B, S] int64 (only these S positions are searched: a context window holding every
    lane's last_pos); last_pos: [B] int64, P, the position of each lane's last committed token."""
    batch, width = history.shape
    device = history.device
    index = torch.arange(width, device=device)[None, :]  # [1, S]: the end position i of a match
    back = torch.arange(max_n, device=device)
    # tail[b, j] = h[P - j]; -2 where P - j < 0 (matches nothing: history holds tokens >= 0 and -1)
    tail_pos = last_pos[:, None] - back
    tail = torch.where(tail_pos >= 0, history.gather(1, tail_pos.clamp(0, width - 1)), -2)  # [B, max_n]
    earlier = index < last_pos[:, None]  # an earlier occurrence: it is followed by at least one token
    run = torch.ones(batch, width, dtype=torch.bool, device=device)  # the last j tokens up to i match
    best = torch.full((batch,), -1, dtype=torch.int64, device=device)  # end of the chosen match, -1 none
    for j in range(max_n):
        shifted = torch.cat([history.new_full((batch, j), -3), history[:, : width - j]], dim=1)  # h[i - j], -3 before 0
        run = run & (shifted == tail[:, j : j + 1])
        n = j + 1
        if n >= min_n:
            latest = torch.where(run & earlier, index, -1).amax(dim=1)  # [B], -1: no match of length n
            best = torch.where(latest >= 0, latest, best)  # a longer n (later in the loop) takes precedence
    ahead = best[:, None] + 1 + torch.arange(k, device=device)  # positions of the proposed tokens
    proposed = (best[:, None] >= 0) & (ahead <= last_pos[:, None])
    tokens = history.gather(1, ahead.clamp(0, width - 1))
    return torch.where(proposed, tokens, NONE)


def lookup_list(tokens: Sequence[int], k: int, max_n: int, min_n: int) -> list[int]:
    """`lookup` of one lane on the host: `tokens` are its committed tokens (the last one at P)."""
    last = len(tokens) - 1
    for n in range(max_n, min_n - 1, -1):
        if n > len(tokens):
            continue
        tail = list(tokens[last - n + 1 :])
        for end in range(last - 1, n - 2, -1):  # latest first
            if list(tokens[end - n + 1 : end + 1]) == tail:
                return list(tokens[end + 1 : min(end + k, last) + 1])
    return []
