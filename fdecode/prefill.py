"""Priming: the host -> device transition that builds the first `DecodeState`.

For each prompt p[0 .. n-1] the host
1. checks it (ids in the vocabulary, length + budget within `max_seq_len`),
2. hands the lane KV blocks and builds its block table,
3. runs the target over the prompt (KV at positions 0 .. n-1), whose last row
   gives the first new token g (greedy),
4. runs the draft over the prompt (for an MTP head, the token at p is paired
   with the target hidden from p - 1; position 0 gets the zero placeholder),
5. hands `step.advance` the one-token accepted run [g] with base_pos = n - 1:
   the same prepare + draft path as every step, so the new window is
   [g, d'1 .. d'K] at base_pos = n.

Everything that can be wrong with the input raises here, before any tensor is
touched. Prefill runs eagerly (prompt lengths vary); the step graph never sees it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fdecode.config import DecodeConfig
from fdecode.ops.paging import slot_of
from fdecode.ops.sampling import apply_stops
from fdecode.state import DecodeState
from fdecode.step import advance

Prompt = Sequence[int] | torch.Tensor


def check_prompts(prompts: Sequence[Prompt], cfg: DecodeConfig, vocab_size: int) -> list[list[int]]:
    """Validate prompts and return them as lists of ints."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of token-id sequences, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: pass at least one prompt")
    if len(prompts) > cfg.max_batch:
        raise ValueError(f"{len(prompts)} prompts but max_batch is {cfg.max_batch}")
    out = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, torch.Tensor):
            if prompt.dim() != 1 or prompt.dtype.is_floating_point or prompt.dtype == torch.bool:
                raise TypeError(f"prompt {i}: expected a 1-D integer tensor, got {prompt.dtype} {tuple(prompt.shape)}")
            prompt = prompt.tolist()
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
            raise TypeError(f"prompt {i}: expected a sequence of token ids, got {type(prompt).__name__}")
        ids = list(prompt)
        if not ids:
            raise ValueError(f"prompt {i} is empty")
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool):
                raise TypeError(f"prompt {i}: token ids must be ints, got {t!r}")
            if not 0 <= t < vocab_size:
                raise ValueError(f"prompt {i}: token id {t} is outside the vocabulary [0, {vocab_size})")
        out.append(ids)
    return out


def check_budgets(lengths: list[int], max_new_tokens: int | None, cfg: DecodeConfig) -> list[int]:
    """Per-lane token budget; prompt + budget must fit in `max_seq_len`."""
    budgets = []
    for i, n in enumerate(lengths):
        room = cfg.max_seq_len - n
        if room < 1:
            raise ValueError(f"prompt {i} has {n} tokens; max_seq_len {cfg.max_seq_len} leaves no room to generate")
        if max_new_tokens is None:
            budgets.append(room)
            continue
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        if n + max_new_tokens > cfg.max_seq_len:
            raise ValueError(
                f"prompt {i}: {n} prompt tokens + max_new_tokens {max_new_tokens} > max_seq_len {cfg.max_seq_len}"
            )
        budgets.append(max_new_tokens)
    return budgets


def check_stop_ids(eos_token_id: int | Sequence[int] | None, cfg: DecodeConfig, vocab_size: int) -> list[int]:
    if eos_token_id is None:
        return []
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if len(ids) > cfg.max_stop_ids:
        raise ValueError(f"{len(ids)} eos ids but DecodeConfig.max_stop_ids is {cfg.max_stop_ids}")
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
            raise ValueError(f"eos token id {t!r} is not an id in [0, {vocab_size})")
    return ids


def allocate_blocks(needs: list[int], cfg: DecodeConfig) -> torch.Tensor:
    """Block tables [B, max_blocks] (-1 = unallocated): lane b gets needs[b] blocks from 1 upwards."""
    total = sum(needs)
    if total > cfg.pool_blocks - 1:
        raise ValueError(
            f"the prompts need {total} KV blocks but the pool has {cfg.pool_blocks - 1} (num_blocks minus scratch)"
        )
    table = torch.full((cfg.max_batch, cfg.blocks_per_lane), -1, dtype=torch.int64)
    start = 1
    for lane, n in enumerate(needs):
        table[lane, :n] = torch.arange(start, start + n)
        start += n
    return table


@torch.no_grad()
def prefill(
    target,
    draft,
    cfg: DecodeConfig,
    prompts: Sequence[Prompt],
    *,
    max_new_tokens: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
) -> DecodeState:
    """Build the first state for `prompts` (lanes past len(prompts) stay inactive)."""
    vocab = target.config.vocab_size
    prompts = check_prompts(prompts, cfg, vocab)
    lengths = [len(p) for p in prompts]
    budgets = check_budgets(lengths, max_new_tokens, cfg)
    stops = check_stop_ids(eos_token_id, cfg, vocab)
    bs, batch, device = cfg.block_size, cfg.max_batch, torch.device(cfg.device)
    table = allocate_blocks([-(-(n + b) // bs) for n, b in zip(lengths, budgets)], cfg).to(device)

    used = len(prompts)
    longest = max(lengths)
    tokens = torch.zeros(batch, longest, dtype=torch.int64)
    for lane, p in enumerate(prompts):
        tokens[lane, : len(p)] = torch.tensor(p)
    tokens = tokens.to(device)
    length = torch.tensor(lengths + [0] * (batch - used), device=device)  # [B]
    active = torch.arange(batch, device=device) < used
    positions = torch.arange(longest, device=device).expand(batch, longest)
    real = positions < length[:, None]
    slots = torch.where(real, slot_of(table, positions, bs), torch.zeros_like(positions))

    target_kv = target.config.new_kv(cfg.num_slots, dtype=cfg.dtype, device=device)
    draft_kv = draft.kv_config.new_kv(cfg.num_slots, dtype=cfg.dtype, device=device)
    logits, hidden = target(tokens, positions, slots, target_kv, table, block_size=bs)  # [B, T, V], [B, T, H]
    last = (length - 1).clamp_min(0)
    first = logits[torch.arange(batch, device=device), last].argmax(dim=-1)  # [B]
    h_last = hidden[torch.arange(batch, device=device), last]  # [B, H]

    # MTP pairs the token at p with the target hidden at p - 1 (a draft LM ignores hidden_in).
    shifted = torch.cat([hidden.new_zeros(batch, 1, hidden.shape[-1]), hidden[:, :-1]], dim=1)
    draft(tokens, positions, slots, draft_kv, table, block_size=bs, hidden_in=shifted)

    window = cfg.W
    accepted = torch.full((batch, window), -1, dtype=torch.int64, device=device)
    accepted[:, 0] = torch.where(active, first, -1)
    window_hidden = hidden.new_zeros(batch, window, hidden.shape[-1])
    window_hidden[:, 0] = h_last
    stop_ids = torch.full((batch, cfg.max_stop_ids), -1, dtype=torch.int64)
    stop_ids[:used, : len(stops)] = torch.tensor(stops, dtype=torch.int64)
    stop_ids = stop_ids.to(device)
    remaining = torch.tensor(budgets + [0] * (batch - used), device=device)

    accepted, _, remaining, finished = apply_stops(accepted, active.long(), active, remaining, stop_ids)
    primed = DecodeState(
        tokens=torch.zeros(batch, window, dtype=torch.int64, device=device),
        base_pos=last,
        block_tables=table,
        target_kv=target_kv,
        draft_kv=draft_kv,
        active=active,
        remaining=remaining,
        stop_ids=stop_ids,
        output=torch.zeros(batch, window + 2, dtype=torch.int64, device=device),
    )
    return advance(draft, cfg, primed, accepted, window_hidden, remaining=remaining, finished=finished)
