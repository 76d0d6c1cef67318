"""Request features that change logits before a token is chosen: logit bias, min_tokens, repetition /
frequency / presence penalties, a grammar's mask, exact under speculation (docs/design.md, "Logit
processors and logprobs"; the grammar's mask: "Structured output").

Order (vLLM v1's and transformers'): logit bias, then the repetition penalty, then frequency and presence,
then min_tokens' mask, then the grammar's; temperature and the filters come after (`fdecode.ops.filters`). Row r of a batch
of rows counts the lane's committed tokens (`counts`, `seen`: updated in place by `tally` as tokens are
committed) plus the first `before + r` tokens of `prior`: the drafts in front of it in the verified window,
or the proposals already made by a draft. A rejection at row j discards every row after j, so each row is
exactly what plain decoding would have seen there, and nothing has to roll back. Rows whose fronts are not
prefixes of one list (a tree's nodes, each after its own path: `fdecode.tree.processing`) say what is in
front of each (`Paths`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fdecode.ops.grammar import allowed_tokens, walk
from fdecode.ops.topk import topk


class Processors(NamedTuple):
    """A lane's processing leaves of `DecodeState` (None where the config leaves a feature off)."""

    penalties: torch.Tensor  # [B, 3] float32: repetition (1 = off), frequency, presence (0 = off)
    counts: torch.Tensor  # [B, V] int32: each token's count among the lane's committed (generated) tokens
    seen: torch.Tensor  # [B, V] bool: the token is in the lane's prompt
    min_left: torch.Tensor  # [B] int64: tokens the lane commits before a stop id may be one of them
    bias_ids: torch.Tensor  # [B, NB] int64, -1 = none
    bias: torch.Tensor  # [B, NB] float32
    stop_ids: torch.Tensor  # [B, E] int64, -1 = none
    grammar_state: torch.Tensor  # [B] int64: the lane's automaton state after its committed tokens, -1 = none
    grammar_allowed: torch.Tensor  # [S, ceil(V / 32)] int32: the pool's bitmask rows (`fdecode.ops.grammar`)
    grammar_keys: torch.Tensor  # [T] int64 ascending: the pool's transitions, state * V + token
    grammar_next: torch.Tensor  # [T] int64: the state each key leads to


def processors(state) -> Processors:
    """The `Processors` of a `DecodeState` (or of anything with those leaves)."""
    return Processors(
        state.penalties,
        state.counts,
        state.seen,
        state.min_left,
        state.bias_ids,
        state.bias,
        state.stop_ids,
        state.grammar_state,
        state.grammar_allowed,
        state.grammar_keys,
        state.grammar_next,
    )


def _scatter_count(ids: torch.Tensor, weight: torch.Tensor, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """[..., V] sums of `weight` at `ids` ([..., n] each; ids < 0 add nothing). Duplicate ids add up."""
    return torch.zeros(*ids.shape[:-1], vocab, dtype=dtype, device=ids.device).scatter_add(
        -1, ids.clamp_min(0), torch.where(ids >= 0, weight, torch.zeros_like(weight)).to(dtype)
    )


def _matches(ids: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    """How often each v of `vocab` ([V]) is among ids[..., :] (broadcast after ids' leading dims): one
    comparison per (id, token), elementwise, so a compiler fuses it with the logits' other changes into
    one pass (ids < 0 match nothing: token ids are >= 0)."""
    total = None
    for j in range(ids.shape[-1]):  # a few ids: the drafts in front of a row
        hit = (ids[..., j, None] == vocab).float()
        total = hit if total is None else total + hit
    return total


class Paths(NamedTuple):
    """What is in front of each row, past the lane's committed tokens, where the rows are not one list's
    prefixes (a tree's nodes: each row follows its own path). A field the step does not use may be None."""

    ids: torch.Tensor | None  # [B, R, A] int64: the tokens in front of row r (-1: none), for the penalties
    index: torch.Tensor | None  # [B, R] int64: how many tokens are in front of row r, for min_tokens
    grammar: torch.Tensor | None  # [B, R] int64: the automaton state in front of row r (-1: none, -2: left it)


class LaneVectors(NamedTuple):
    """What a lane's bias and stop ids are over the vocabulary, built once per phase of a step and shared by
    its rows (None: the feature is off)."""

    bias: torch.Tensor | None  # [B, 1, V] float32: the logit bias of each token
    stops: torch.Tensor | None  # [B, 1, V] bool: the lane's stop ids


def lane_vectors(lanes: Processors, vocab: int, *, bias: bool, min_tokens: bool, **_) -> LaneVectors:
    """The `LaneVectors` of `lanes` (scatters of a few ids into [B, V]; the flags as `process` takes them)."""
    return LaneVectors(
        _scatter_count(lanes.bias_ids, lanes.bias, vocab, torch.float32)[:, None] if bias else None,
        (_scatter_count(lanes.stop_ids, torch.ones_like(lanes.stop_ids), vocab, torch.int32) > 0)[:, None]
        if min_tokens
        else None,
    )


def process(
    logits: torch.Tensor,
    lanes: Processors,
    prior: torch.Tensor | None = None,
    before: int = 0,
    *,
    penalties: bool,
    min_tokens: bool,
    bias: bool,
    grammars: bool = False,
    vectors: LaneVectors | None = None,
    paths: Paths | None = None,
) -> torch.Tensor:
    """logits [B, R, V] as the lanes' requests change them; row r counts the first `before + r` tokens of
    `prior` [B, A] (-1: none) as generated after the committed ones, or, with `paths`, what `paths` puts in
    front of it (prior and before unused). The flags say which features the
    step was compiled with (off: nothing is computed for them); `vectors`: `lane_vectors(lanes, ...)`
    where the caller shares them between calls (None: built here). Returns float32 logits.

    Every change is elementwise over [B, R, V] (the drafts in front of a row compared with each token),
    so the whole function is one fused pass over the logits where a compiler fuses it."""
    b, rows, vocab = logits.shape
    token = torch.arange(vocab, device=logits.device)  # [V]
    if vectors is None:
        vectors = lane_vectors(lanes, vocab, bias=bias, min_tokens=min_tokens)
    logits = logits.float()
    if bias:
        logits = logits + vectors.bias
    if penalties:
        counts = lanes.counts[:, None, :].float()  # [B, 1, V]
        if paths is not None:
            if paths.ids.shape[-1]:  # a root alone (a step of depth 0) has nothing in front
                counts = counts + _matches(paths.ids, token)
        elif prior is not None and prior.shape[1]:
            upto = before + torch.arange(rows, device=logits.device)  # [R] tokens of prior counted by each row
            counted = torch.arange(prior.shape[1], device=logits.device)[None, :] < upto[:, None]  # [R, A]
            ids = torch.where(counted[None], prior[:, None, :], -1)  # [B, R, A]: the drafts in front of each row
            counts = counts + _matches(ids, token)
        rep, freq, pres = (lanes.penalties[:, i, None, None] for i in range(3))
        seen = lanes.seen[:, None, :] | (counts > 0)
        logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
        logits = logits - freq * counts - pres * (counts > 0).float()
    if min_tokens:
        index = before + torch.arange(rows, device=logits.device) if paths is None else paths.index
        masked = index < lanes.min_left[:, None]  # [B, R]: the row's token, counted from now, is before min_tokens
        logits = torch.where(masked[:, :, None] & vectors.stops, float("-inf"), logits)
    if grammars:  # the tokens the automaton allows after the committed tokens and the row's prior ones
        rows_state = paths.grammar if paths is not None else None
        if rows_state is None:
            prior = lanes.grammar_state.new_zeros(b, 0) if prior is None else prior
            states = walk(lanes.grammar_keys, lanes.grammar_next, lanes.grammar_state, prior, vocab)
            rows_state = states[:, before : before + rows]  # [B, R]
        logits = torch.where(allowed_tokens(lanes.grammar_allowed, rows_state, vocab), logits, float("-inf"))
    return logits


def tally(
    lanes: Processors,
    accepted: torch.Tensor,
    length: torch.Tensor,
    *,
    penalties: bool,
    grammars: bool = False,
    vocab: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Count a transition's committed tokens (`accepted` [B, W], -1 padded): the counts leaf is updated in
    place (like the KV) where penalties are on. Returns the next `min_left` [B] and the lanes' automaton
    states after the tokens [B]."""
    if penalties:
        lanes.counts.scatter_add_(1, accepted.clamp_min(0), (accepted >= 0).to(lanes.counts.dtype))
    state = lanes.grammar_state
    if grammars:  # vocab: the model's V, as the pool's keys are state * V + token
        # contiguous: a [B] leaf whose strides change between steps would be another graph (a recompile)
        state = walk(lanes.grammar_keys, lanes.grammar_next, state, accepted, vocab, length)[:, -1].contiguous()
    return (lanes.min_left - length).clamp_min(0), state


def logprobs(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log_softmax of `logits` [B, R, V] at `tokens` [B, R] (-1: 0.0), and its `top` most probable ids
    and logprobs [B, R, top] each (`fdecode.ops.topk.topk`; ties in no set order). The log-normaliser is one
    logsumexp per row: no [B, R, V] log_softmax is written."""
    x = logits.float()
    norm = torch.logsumexp(x, dim=-1)  # [B, R]
    token = x.gather(-1, tokens.clamp_min(0)[..., None])[..., 0] - norm
    token = torch.where(tokens >= 0, token, torch.zeros_like(token))
    if top == 0:
        empty = tokens.new_zeros(*tokens.shape, 0)
        return token, empty, empty.float()
    values, ids = topk(x, top)
    return token, ids, values - norm[..., None]


def prompt_seen(tokens: torch.Tensor, real: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, V] bool: which ids the prompts hold (tokens [n, T], real [n, T]: the row's positions in its prompt)."""
    ids = torch.where(real, tokens, torch.full_like(tokens, -1))
    return _scatter_count(ids, torch.ones_like(ids), vocab, torch.int32) > 0
