"""Acceptance and stop conditions of the decode step, as fixed-shape tensor math
(docs/design.md, "Lossless rejection sampling").

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
    drafts_accepted = first_true(tokens[:, 1:] != greedy[:, :-1])  # [B], 0..K; a draft id < 0 never matches
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


CHUNK = 1024  # tokens per first-level bucket of `sample`


def dense(probs: torch.Tensor, ids: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """[..., V] probabilities from candidates probs / ids [..., C] (ids are distinct, so scatter_add places
    each once); None ids: `probs` is dense already."""
    if ids is None:
        return probs
    return torch.zeros(*probs.shape[:-1], vocab, dtype=probs.dtype, device=probs.device).scatter_add(-1, ids, probs)


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The first index whose cumulative mass exceeds u * total, never a zero entry.  [..., N], [...] -> [...]

    Zero entries are excluded explicitly, not through the cumulative sums: a parallel scan may round
    a flat stretch of the CDF up or down, and u * total may round up to the total itself."""
    cdf = probs.cumsum(dim=-1)
    positive = probs > 0
    first = first_true((cdf > u[..., None] * cdf[..., -1:]) & positive)
    index = torch.arange(probs.shape[-1], device=probs.device)
    last_positive = (index * positive).max(dim=-1).values  # where rounding leaves u * total past every entry
    return torch.minimum(first, last_positive)


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw one token per row by inversion, without a host sync and with two uniforms per row.

    probs: [..., N] non-negative, not all zero (need not be normalised); u: [..., 2] uniform in [0, 1).
    Returns [...] int64 distributed as probs / probs.sum(); a zero entry is never returned.
    Two levels keep float32 exact enough at any N: u[..., 0] picks a bucket of CHUNK tokens by its
    mass, u[..., 1] a token inside it, so each cumulative sum runs over at most max(N / CHUNK, CHUNK)
    terms and a token's probability is resolved to 2**-24 of its bucket's mass, not of the total.
    """
    n = probs.shape[-1]
    if n <= CHUNK:
        return _inverse_cdf(probs, u[..., 0])
    buckets = -(-n // CHUNK)
    padded = torch.cat([probs, probs.new_zeros(*probs.shape[:-1], buckets * CHUNK - n)], dim=-1)
    chunks = padded.view(*probs.shape[:-1], buckets, CHUNK)
    bucket = _inverse_cdf(chunks.sum(dim=-1), u[..., 0])  # [...]
    row = chunks.gather(-2, bucket[..., None, None].expand(*bucket.shape, 1, CHUNK))[..., 0, :]
    return bucket * CHUNK + _inverse_cdf(row, u[..., 1])


def speculative_accept(
    tokens: torch.Tensor,  # [B, W] int64: t then the K drafts
    draft_probs: torch.Tensor,  # [B, K, V] q: the (filtered) distribution each draft was sampled from
    target_probs: torch.Tensor,  # [B, W, N] p: the target's filtered distribution after each window row
    accept_u: torch.Tensor,  # [B, K] uniform [0, 1)
    noise_u: torch.Tensor,  # [B, 2] uniform [0, 1): the draw of the recovered / bonus token
    target_ids: torch.Tensor | None = None,  # [B, W, N] token of each entry of p; None: p is dense (N = V)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative rejection sampling (lossless: the committed tokens follow p exactly).

    Draft d[r+1] is accepted with probability min(1, p_r(d) / q_r(d)); at the first
    rejection (row a) the lane commits a *recovered* token drawn from the residual
    max(0, p_a - q_a) (normalised by `sample`; a draft id < 0 was not proposed: it is
    rejected, and its q row, all zeros, leaves p_a itself); if all K drafts pass, it commits a
    *bonus* token drawn from p_K, the last window row. Only that one row is drawn from.
    With `target_ids`, p is given on candidates (entries outside them have p = 0, so
    the residual lives on them too); the draw is still made over the vocabulary in
    token order, so it picks the token a dense p would have picked with the same
    uniforms. Returns accepted [B, W] (-1 padded) and length [B] = a + 1.
    """
    batch, window = tokens.shape
    k = window - 1
    proposed = tokens[:, 1:] >= 0  # [B, K]: a draft id < 0 is nothing proposed (n-gram drafts), never accepted
    drafts = tokens[:, 1:, None].clamp_min(0)  # [B, K, 1]
    q_of_draft = draft_probs.gather(-1, drafts)[..., 0]  # [B, K]
    if target_ids is None:
        p_of_draft = target_probs[:, :-1].gather(-1, drafts)[..., 0]  # [B, K]
        q_rows = draft_probs  # [B, K, N]
    else:
        p_of_draft = torch.where(target_ids[:, :-1] == drafts, target_probs[:, :-1], 0.0).sum(dim=-1)
        q_rows = draft_probs.gather(-1, target_ids[:, :-1])  # q on p's candidates
    passed = (accept_u * q_of_draft < p_of_draft) & proposed  # u < p / q without dividing; p = 0 never passes
    drafts_accepted = first_true(~passed)  # [B], 0..K

    def row(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:  # x[b, r[b]]: [B, R, N], [B] -> [B, N]
        return x.gather(1, r[:, None, None].expand(batch, 1, x.shape[-1]))[:, 0]

    p_a = row(target_probs, drafts_accepted)
    residual = (p_a - row(q_rows, drafts_accepted.clamp(max=k - 1))).clamp_min(0.0)
    # p == q on the row leaves no residual, but then the draft is never rejected there.
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_a)
    recovery = torch.where((drafts_accepted < k)[:, None], residual, p_a)  # [B, N]
    ids = None if target_ids is None else row(target_ids, drafts_accepted)
    # Drawn over the vocabulary, in token order, as a dense row would be.
    fallback = sample(dense(recovery, ids, draft_probs.shape[-1]), noise_u)  # [B]

    index = torch.arange(window, device=tokens.device)[None, :]
    shifted = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)  # d1 .. dK then a dummy
    accepted = torch.where(index < drafts_accepted[:, None], shifted, fallback[:, None])
    accepted = torch.where(index <= drafts_accepted[:, None], accepted, torch.full_like(accepted, -1))
    return accepted, drafts_accepted + 1


def cut_at_missing_kv(
    accepted: torch.Tensor,  # [B, W] int64, after `apply_stops`
    length: torch.Tensor,  # [B] int64
    remaining: torch.Tensor,  # [B] int64 budget left after `length`
    has_kv: torch.Tensor,  # [B, W] bool: window row j's KV had a real slot (not scratch)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stop lanes that ran past their KV blocks (the host did not extend them in time).

    Row j's logits are only right if the keys of rows 0..j were really written, so a
    lane commits at most the leading rows with KV; if that cuts its accepted run it
    is stopped with an error (`overflow`). Returns accepted, length, remaining, overflow [B] bool.
    """
    return cut_before(accepted, length, remaining, ~has_kv)


def cut_at_masked_rows(
    accepted: torch.Tensor,  # [B, W] int64
    length: torch.Tensor,  # [B] int64
    remaining: torch.Tensor,  # [B] int64 budget left after `length`
    logits: torch.Tensor,  # [B, R, V] the processed logits the first R rows' tokens were chosen from (R <= W)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stop lanes whose processors left a row no token (every logit -inf: a grammar state that allows only
    its EOS while min_tokens masks it): the token chosen there (an argmax of nothing) is never committed;
    the lane keeps the rows before it and is stopped with an error (`masked`). Returns accepted, length,
    remaining, masked [B] bool."""
    dead = torch.isneginf(logits.amax(dim=-1))  # [B, R]
    pad = accepted.shape[1] - dead.shape[1]
    if pad:
        dead = torch.cat([dead, dead.new_zeros(dead.shape[0], pad)], dim=1)
    return cut_before(accepted, length, remaining, dead)


def cut_before(
    accepted: torch.Tensor, length: torch.Tensor, remaining: torch.Tensor, bad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each lane's accepted run cut before its first `bad` row ([B, W] bool); the budget of what was cut
    goes back. Returns accepted, length, remaining, and [B] bool: the cut took tokens (an error)."""
    usable = first_true(bad)  # [B] leading rows that are not bad
    cut = length > usable
    kept = torch.minimum(length, usable)
    keep = torch.arange(accepted.shape[1], device=accepted.device)[None, :] < kept[:, None]
    accepted = torch.where(keep, accepted, torch.full_like(accepted, -1))
    return accepted, kept, remaining + (length - kept), cut
