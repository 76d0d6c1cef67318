"""The decode step: validate -> sample -> prepare -> draft, one pure function of the state
(docs/design.md, "The iteration").

    state --validate--> target logits/hidden over the window [t, d1 .. dK]           (`validate`)
          --sample----> accepted tokens, cut at stop ids and budgets                  (`commit`)
          --prepare---> 2 draft rows per lane (fused op `fdecode::prepare_next_draft`) (`advance`)
          --draft-----> K draft forwards, or an n-gram lookup -> [last, d'1 .. d'K]   (`propose_lm`,
                                                                                       `propose_ngram`)

The phases hand over typed tuples, `Verified` and `Committed`. Nothing here reads a tensor value on
the host, so the whole function captures as one graph with fixed shapes. The KV leaves are written in
place (donation contract, see `DecodeState`); everything else in the returned state is freshly built
(`next_state`). `advance` is shared with priming, which hands it a one-token accepted run.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from fdecode.config import DecodeConfig
from fdecode.models.idle import idles_draft
from fdecode.models.mtp.head import depth_kwargs
from fdecode.models.ngram import is_ngram
from fdecode.models.parallel import rank0_tokens
from fdecode.models.regions import compiling_regions
from fdecode.ops.catch_up import missed_rows, sit_out
from fdecode.ops.filters import candidate_filter, filtered
from fdecode.ops.grammar import walk
from fdecode.ops.ngram import lookup, write_history
from fdecode.ops.paging import slot_of, window_columns
from fdecode.ops.plan import GREEDY, SamplingPlan, general
from fdecode.ops.prepare import prepare_next_draft
from fdecode.ops.processors import LaneVectors, Processors, lane_vectors, process, processors, tally
from fdecode.ops.processors import logprobs as token_logprobs
from fdecode.ops.random import uniform
from fdecode.ops.sampling import (
    apply_stops,
    cut_at_masked_rows,
    cut_at_missing_kv,
    dense,
    greedy_accept,
    sample,
    speculative_accept,
)
from fdecode.state import DecodeState, StepOutput
from fdecode.state.recurrent import commit_ring, commit_verify, draft_start, forward_rows, is_hybrid

CATCH_UP = -1  # `decode_step`'s depth for the step that catches a draft LM up (`fdecode.ops.catch_up`)


def transition_randoms(state: DecodeState, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All random numbers of one transition, drawn at once from the lanes' (seed, counter): the
    recovery / bonus draw [B, 2], the acceptance tests [B, K], the K draft draws [B, K, 2]."""
    u = uniform(state.seed, state.counter, 3 * k + 2)
    return u[:, :2], u[:, 2 : k + 2], u[:, k + 2 :].reshape(-1, k, 2)


def general_plan(cfg: DecodeConfig) -> SamplingPlan:
    """The plan exact for any lanes the config allows: every filter on, or greedy-only (`fdecode.ops.plan.general`)."""
    return general(cfg.sampling)


def agreed(cfg: DecodeConfig, model, tokens: torch.Tensor) -> torch.Tensor:
    """`tokens` as tensor-parallel rank 0 has them (`broadcast_accepted`, the catch-all for
    non-deterministic kernels), else unchanged: every rank derives its state from the same tokens."""
    return rank0_tokens(tokens, model.tp) if cfg.broadcast_accepted else tokens


class Verified(NamedTuple):
    """validate -> sample: the target over the window's first rows."""

    logits: torch.Tensor  # [B, R, V], R = depth + 1
    hidden: torch.Tensor  # [B, R, H]
    snapshots: tuple | None  # recurrent states after each row (None: no linear-attention layers)
    slots: torch.Tensor  # [B, W] KV slot of every window row (0: the scratch slot of an inactive lane)


class Committed(NamedTuple):
    """sample -> advance: what each lane commits in this transition."""

    accepted: torch.Tensor  # [B, W] int64, -1 padded
    length: torch.Tensor  # [B] int64: L, the accepted tokens
    hidden: torch.Tensor  # [B, W, H] target hidden of the rows that produced them
    remaining: torch.Tensor  # [B] int64 budget left after them
    finished: torch.Tensor  # [B] bool: stopped (a stop id, the budget, or overflow)
    overflow: torch.Tensor | None  # [B] bool: stopped because it ran past its KV blocks (None: never)
    drafts: torch.Tensor  # [B] int64: the drafts the verified rows carried (the acceptance metrics' denominator)
    min_left: torch.Tensor  # [B] int64: the lanes' min_tokens still to commit after them
    grammar_state: torch.Tensor  # [B] int64: the lanes' automaton states after them (-1: no grammar)
    logprobs: tuple | None  # (token [B, W], top ids [B, W, N], top [B, W, N]) or None (`logprob_rows`)
    masked: torch.Tensor | None = None  # [B] bool: stopped because a row allowed no token (None: never)


def features(cfg: DecodeConfig) -> dict[str, bool]:
    """The logit processors the step was compiled with (`fdecode.ops.processors.process`)."""
    return dict(penalties=cfg.penalties, min_tokens=cfg.min_tokens, bias=cfg.max_logit_bias > 0, grammars=cfg.grammars)


def tallied(cfg: DecodeConfig, lanes: Processors, accepted: torch.Tensor, length: torch.Tensor, vocab: int):
    """(min_left, grammar_state) after a transition's committed tokens (`fdecode.ops.processors.tally`)."""
    if not cfg.processing:
        return lanes.min_left, lanes.grammar_state
    return tally(lanes, accepted, length, penalties=cfg.penalties, grammars=cfg.grammars, vocab=vocab)


def processed(
    cfg: DecodeConfig,
    lanes: Processors,
    logits: torch.Tensor,
    prior: torch.Tensor | None = None,
    before: int = 0,
    vectors: LaneVectors | None = None,
) -> torch.Tensor:
    """`logits` [B, R, V] as the lanes' requests change them (unchanged where the config has no processor)."""
    return process(logits, lanes, prior, before, vectors=vectors, **features(cfg)) if cfg.processing else logits


def logprob_rows(
    cfg: DecodeConfig,
    plan: SamplingPlan,
    state: DecodeState,
    raw: torch.Tensor,
    chosen: torch.Tensor,
    tokens: torch.Tensor,
) -> tuple | None:
    """The logprobs a transition reports (None: the config computes none) of `tokens` [B, R] from the rows
    [B, R, V] that chose them: `raw` (the target's logits) or, in "processed" mode, `chosen` (after the
    processors) under each lane's temperature and filters. Padded with -1 ids and 0.0 to W rows."""
    if cfg.max_logprobs is None:
        return None
    source = raw  # `token_logprobs` normalises each row
    if cfg.logprobs_mode == "processed":
        source = chosen.float()
        if plan.random:  # a random lane's distribution is its filtered one (log 0 = -inf outside it)
            probs, ids = filtered(plan, chosen, state.temperature, state.top_k, state.top_p, state.min_p)
            drawn = dense(probs, ids, chosen.shape[-1]).log()
            source = torch.where((state.temperature > 0)[:, None, None], drawn, source)
    token, ids, values = token_logprobs(source, tokens, cfg.max_logprobs)
    pad = cfg.W - tokens.shape[1]
    if pad:
        token = torch.cat([token, token.new_zeros(token.shape[0], pad)], dim=1)
        ids = torch.cat([ids, ids.new_full((ids.shape[0], pad, ids.shape[2]), -1)], dim=1)
        values = torch.cat([values, values.new_zeros(values.shape[0], pad, values.shape[2])], dim=1)
    return token, ids, values


def decode_step(
    target,
    draft,
    cfg: DecodeConfig,
    state: DecodeState,
    *,
    context_blocks: int | torch.Tensor | None = None,
    plan: SamplingPlan | None = None,
    depth: int | None = None,
    draft_regions: bool,
) -> tuple[DecodeState, StepOutput]:
    """One speculative decoding iteration: validate -> sample -> advance (prepare the next draft, propose).
    Consumes `state` (its KV is updated in place).

    context_blocks: attend over the first `context_blocks` blocks of each lane only (a context bucket,
    `DecodeConfig.bucket_for`); it must hold every position up to max(base_pos) + 2K. None: whole lanes.
    Or a [n, 0] tensor whose length n is the window (`fdecode.ops.paging.window_columns`): the one graph
    of every window reads n as a symbolic size.
    plan: the sampling code to run (`fdecode.ops.plan`); it must be exact for every active lane's
    parameters. None: `general_plan(cfg)`.
    depth: how many of the window's drafts to verify, 0 .. K (None: K). The target runs over the window's
    first depth + 1 rows only, and the step proposes `proposals(draft, cfg, depth)` drafts for the next
    window (max(depth, 1) for a draft LM or MTP head; K for n-gram drafts, whose lookups cost nothing, and
    for recurrent drafts); the rest of the next window is -1 (nothing proposed: never accepted, and a random
    lane's rejection there draws from p itself, so every depth is exact). depth 0 commits one token per
    lane, as target-only decoding would (`fdecode.runtime.gate` decides when, for n-gram drafts); a draft LM
    sits it out (`fdecode.ops.catch_up`) and proposes nothing. depth CATCH_UP: depth 0 whose draft forward
    first takes the tokens the draft sat out, then proposes one draft.
    draft_regions: whether the draft's layers may run as compile regions (`cfg.layer_regions` and no parameter
    shared with the target: `fdecode.models.regions.shares_parameters`), checked by the caller once per graph
    (`pure_step`): inside the trace Dynamo would walk every parameter of both models.
    """
    plan = general_plan(cfg) if plan is None else plan
    depth = cfg.K if depth is None else depth
    catch_up, depth = depth == CATCH_UP, max(depth, 0)
    verified = validate(target, cfg, state, context_blocks, depth)
    noise, accept_u, draft_u = transition_randoms(state, cfg.K) if plan.random else (None, None, None)
    committed = commit(target, cfg, state, verified, noise, accept_u, plan, depth)
    new_state = advance(
        draft,
        cfg,
        state,
        committed,
        draft_u,
        context_blocks=context_blocks,
        plan=plan,
        proposals=1 if catch_up else proposals(draft, cfg, depth),
        catch_up=catch_up,
        draft_regions=compiling_regions(draft_regions),
    )
    return new_state, new_state.step_output


def validate(target, cfg: DecodeConfig, state: DecodeState, context_blocks, depth: int) -> Verified:
    """The target's forward over the window's first depth + 1 rows [t, d1 .. d_depth]."""
    rows = depth + 1
    context = window_columns(state.block_tables, context_blocks)  # [B, context_blocks]: what attention reads
    positions = state.base_pos[:, None] + torch.arange(cfg.W, device=state.base_pos.device)  # [B, W]
    slots = torch.where(
        state.active[:, None], slot_of(state.block_tables, positions, cfg.block_size), torch.zeros_like(positions)
    )
    committed = (state.target_conv[:, :, 0], state.target_rec[:, :, 0]) if is_hybrid(target) else None
    logits, hidden, snapshots = forward_rows(  # a draft id < 0 (nothing proposed) runs as id 0, never accepted
        target,
        state.tokens[:, :rows].clamp_min(0),
        positions[:, :rows],
        slots[:, :rows],
        state.target_kv,
        context,
        block_size=cfg.block_size,
        attention=cfg.attention,
        regions=cfg.layer_regions,
        recurrent=committed,
        snapshots=True,
    )
    return Verified(logits, hidden, snapshots, slots)


def commit(
    target,
    cfg: DecodeConfig,
    state: DecodeState,
    verified: Verified,
    noise: torch.Tensor | None,
    accept_u: torch.Tensor | None,
    plan: SamplingPlan,
    depth: int,
) -> Committed:
    """sample: accept (greedy match or rejection sampling), rank 0's run under TP, cut at stop ids, budgets
    and missing KV blocks, then roll a recurrent target back to the accepted prefix (in place)."""
    window, rows = cfg.W, depth + 1
    hidden, lanes = verified.hidden, processors(state)
    # Row r of the window counts the drafts d1 .. dr in front of it (`fdecode.ops.processors`).
    logits = processed(cfg, lanes, verified.logits, state.tokens[:, 1:rows])
    if depth == 0:
        accepted, length = first_row(state, logits, noise, plan)
    elif plan.random:
        accepted, length = verify(state, logits, noise, accept_u[:, :depth], plan)
    else:  # greedy-only graph: no filters, no random numbers
        accepted, length = greedy_accept(state.tokens[:, :rows], logits)
    if rows < window:  # the rows not verified: nothing accepted there, no hidden state
        accepted = torch.cat([accepted, accepted.new_full((accepted.shape[0], window - rows), -1)], dim=1)
        hidden = torch.cat([hidden, hidden.new_zeros(hidden.shape[0], window - rows, hidden.shape[2])], dim=1)
    if cfg.broadcast_accepted:  # rank 0's run, before the stops, budgets or next draft derive from it
        accepted = rank0_tokens(accepted, target.tp)
        length = (accepted >= 0).sum(dim=1)
    accepted, length, remaining, finished = apply_stops(accepted, length, state.active, state.remaining, state.stop_ids)
    accepted, length, remaining, overflow = cut_at_missing_kv(accepted, length, remaining, verified.slots != 0)
    masked = None
    if cfg.grammars and cfg.min_tokens:  # only a grammar's mask beside min_tokens' can leave a row no token
        accepted, length, remaining, masked = cut_at_masked_rows(accepted, length, remaining, logits)
    if verified.snapshots is not None:  # verify with rollback: the state after each lane's accepted prefix
        commit_verify((state.target_conv, state.target_rec), verified.snapshots, length)
    drafts = torch.where(state.active, (state.tokens[:, 1:rows] >= 0).sum(dim=1), 0)
    min_left, grammar_state = tallied(cfg, lanes, accepted, length, logits.shape[-1])
    logprobs = logprob_rows(cfg, plan, state, verified.logits, logits, accepted[:, :rows])
    stopped = finished | overflow if masked is None else finished | overflow | masked
    return Committed(
        accepted, length, hidden, remaining, stopped, overflow, drafts, min_left, grammar_state, logprobs, masked
    )


def proposals(draft, cfg: DecodeConfig, depth: int) -> int:
    """How many drafts a step of `depth` proposes for the next window: as many as it verified (at least the
    one the draft's first forward makes anyway, which keeps the draft's KV in step); none at depth 0 where the
    draft sits it out (`idles_draft`); all K where a proposal costs nothing (n-gram lookups) or a recurrent
    draft's ring needs them (`commit_ring`)."""
    if is_ngram(draft) or is_hybrid(draft):
        return cfg.K
    return 0 if depth == 0 and idles_draft(draft, cfg) else max(depth, 1)


def verify(
    state: DecodeState, logits: torch.Tensor, noise: torch.Tensor, accept_u: torch.Tensor, plan: SamplingPlan
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted tokens [B, R] (-1 padded) and lengths [B] over the window's first R rows (`logits`: [B, R, V],
    `accept_u`: [B, R - 1]): greedy or rejection sampling, per lane."""
    rows = logits.shape[1]
    tokens, draft_probs = state.tokens[:, :rows], state.draft_probs[:, : rows - 1]
    greedy, greedy_len = greedy_accept(tokens, logits)
    probs, ids = filtered(plan, logits, state.temperature, state.top_k, state.top_p, state.min_p)
    sampled, sampled_len = speculative_accept(tokens, draft_probs, probs, accept_u, noise, ids)
    random_lane = state.temperature > 0
    return torch.where(random_lane[:, None], sampled, greedy), torch.where(random_lane, sampled_len, greedy_len)


def first_row(
    state: DecodeState, logits: torch.Tensor, noise: torch.Tensor | None, plan: SamplingPlan
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target-only decoding of the window's first row: accepted [B, 1], length [B] = 1.

    logits: [B, 1, V]; the draw `speculative_accept` makes when the first draft is rejected or was never
    proposed (`target_draw`)."""
    params = (state.temperature, state.top_k, state.top_p, state.min_p)
    token = target_draw(logits[:, 0], params, noise, plan)
    return token[:, None], torch.ones_like(token)


def target_draw(
    logits: torch.Tensor, params: tuple[torch.Tensor, ...], noise: torch.Tensor | None, plan: SamplingPlan
) -> torch.Tensor:
    """One token per lane [B] from the target's logits [B, V]: the argmax for greedy lanes; for random ones
    (plan.random) a draw with `noise` from p filtered by `params` (temperature, top_k, top_p, min_p)."""
    token = logits.argmax(dim=-1)
    if plan.random:
        probs, ids = filtered(plan, logits[:, None], *params)
        drawn = sample(dense(probs[:, 0], None if ids is None else ids[:, 0], logits.shape[-1]), noise)
        token = torch.where(params[0] > 0, drawn, token)
    return token


def propose(
    state: DecodeState, logits: torch.Tensor, u: torch.Tensor | None, j: int, plan: SamplingPlan, candidates: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft j's token [B] (argmax for greedy lanes, a sample for random ones) and its distribution q [B, V].

    logits: [B, V] draft logits; u: [B, 2] uniforms for the draw, None in a greedy-only step
    (whose draft distributions are never read, so the state's are passed through).
    A random lane's draft proposes from the top `candidates` (`DecodeConfig.top_k_candidates`) of its
    logits, with the lane's filters applied within them, in every plan: one `torch.topk`, never a
    full-vocabulary threshold search. Any q keeps the committed tokens exact (acceptance compares p
    with the q the draft was drawn from, and the residual max(0, p - q) covers what q left out);
    truncating q only changes how often drafts are accepted. With candidates = 0, the plan's filter."""
    if not plan.random:
        return logits.argmax(dim=-1), state.draft_probs[:, j]
    params = (state.temperature, state.top_k, state.top_p, state.min_p)
    if candidates:
        probs, ids = candidate_filter(logits[:, None], *params, candidates)  # [B, 1, C] each
        token = ids[:, 0].gather(-1, sample(probs[:, 0], u)[:, None])[:, 0]
        q = dense(probs[:, 0], ids[:, 0], logits.shape[-1])
    else:
        probs, ids = filtered(plan, logits[:, None], *params)
        q = dense(probs[:, 0], None if ids is None else ids[:, 0], logits.shape[-1])
        token = sample(q, u)
    return torch.where(state.temperature > 0, token, logits.argmax(dim=-1)), q


def advance(
    draft,
    cfg: DecodeConfig,
    state: DecodeState,
    committed: Committed,
    draft_u: torch.Tensor | None,  # [B, K, 2] uniforms for sampling the K drafts (None: greedy-only)
    *,
    context_blocks: int
    | torch.Tensor
    | None = None,  # attention window in blocks (see `decode_step`), None: whole lanes
    plan: SamplingPlan = GREEDY,  # how random lanes draw their drafts (draft_u is given unless GREEDY)
    draft_regions: bool = False,  # run the draft's layers as compile regions (`fdecode.models.regions`)
    proposals: int | None = None,  # drafts to propose, 0 .. K (None: K); the rest of the window is -1
    catch_up: bool = False,  # the draft's first forward takes the tokens it sat out first (`fdecode.ops.catch_up`)
) -> DecodeState:
    """prepare -> propose: the next draft input from the committed run (the fused op), the drafts of the next
    window (draft forwards, or an n-gram lookup; none where the draft sits the step out, `proposals` 0), and
    the next state."""
    accepted, length, hidden = committed.accepted, committed.length, committed.hidden
    batch = accepted.shape[0]
    context = window_columns(state.block_tables, context_blocks)  # [B, context_blocks]
    bs = cfg.block_size
    placeholder = hidden.new_zeros(hidden.shape[-1])
    rows = prepare_next_draft(accepted, hidden, placeholder, state.base_pos, state.base_pos + 1, state.block_tables, bs)
    last = rows[0].view(batch, 2)[:, 1]  # the last committed token, the next window's t
    pos = state.base_pos + length  # P, its position (not sliced out of the op's strided rows: see `propose_lm`)
    missed = state.missed  # [B, 0] for an n-gram draft; all -1 before a step that is not depth 0 or a catch-up
    if is_ngram(draft):
        drafts, draft_probs = propose_ngram(draft, cfg, state, committed, pos, context, draft_u)
    elif proposals == 0:  # the draft sits the step out: it takes the committed token when it catches up
        drafts, draft_probs = unproposed(state, draft_u, 0)
        missed = sit_out(missed, last, length)
    else:
        drafts, draft_probs = propose_lm(
            draft,
            cfg,
            state,
            committed,
            rows,
            pos,
            context,
            draft_u,
            plan=plan,
            draft_regions=draft_regions,
            proposals=proposals,
            catch_up=catch_up,
        )
        missed = torch.full_like(missed, -1) if catch_up else missed
    return next_state(state, last, drafts, draft_probs, pos, committed, missed)


def propose_ngram(
    draft,
    cfg: DecodeConfig,
    state: DecodeState,
    committed: Committed,
    pos: torch.Tensor,
    context: torch.Tensor,
    draft_u: torch.Tensor | None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Prompt lookup over the lane's token history (written in place, like the KV): no draft forward, no
    draft KV. q is a point mass on each proposed token (rejection sampling stays exact), zero where none."""
    write_history(state.history, state.base_pos, committed.accepted)
    found = lookup(state.history[:, : context.shape[1] * cfg.block_size], pos, cfg.K, draft.max_n, draft.min_n)
    if cfg.grammars:  # a proposal that leaves the lane's language ends the proposal there
        vocab = state.draft_probs.shape[-1]
        walked = walk(state.grammar_keys, state.grammar_next, committed.grammar_state, found, vocab)[:, 1:]  # [B, K]
        found = torch.where(torch.cumsum((walked == -2).long(), dim=1) > 0, -1, found)
    draft_probs = state.draft_probs if draft_u is None else point_masses(found, state.draft_probs.shape[-1])
    return list(found.unbind(1)), draft_probs


def propose_lm(
    draft,
    cfg: DecodeConfig,
    state: DecodeState,
    committed: Committed,
    rows: tuple[torch.Tensor, ...],
    pos: torch.Tensor,
    context: torch.Tensor,
    draft_u: torch.Tensor | None,
    *,
    plan: SamplingPlan,
    draft_regions: bool,
    proposals: int | None,
    catch_up: bool = False,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A draft LM's or MTP head's proposals: its first forward over the op's two rows per lane (repair,
    current), which proposes d'1 at P + 1, then one forward per further draft; -1 and all-zero q rows
    past `proposals`. catch_up: the first forward's rows are the tokens the draft sat out, then current
    (`fdecode.ops.catch_up`; a first-row step repairs nothing). `pos` is P computed afresh: the op's
    rows_pos is a strided view (stride 2, kept even by .contiguous() when B == 1) that would differ from
    primed states and recompile."""
    tokens, rows_hidden, rows_pos, _kv_lens, rows_slots = rows
    accepted, length = committed.accepted, committed.length
    batch, window = accepted.shape
    bs, width = cfg.block_size, committed.hidden.shape[-1]
    live = length > 0  # [B] lanes that committed something write draft KV
    rows_slots = repair_slots(rows_slots, state, length, live, bs)
    hybrid = is_hybrid(draft)
    start = draft_start((state.draft_conv, state.draft_rec), length, cfg.K) if hybrid else None
    # A recurrent draft state takes the repair row only when it carries d'K (L == W): `fdecode.state.recurrent`.
    valid = torch.stack([length == window, torch.ones_like(live)], dim=1) if hybrid else None
    rows_in = [
        tokens.view(batch, 2),
        rows_pos.view(batch, 2),
        rows_slots.view(batch, 2),
        rows_hidden.view(batch, 2, width),
    ]
    if catch_up:
        sat_out = missed_rows(state.missed, state.base_pos, state.block_tables, live, bs)
        hidden_pad = rows_hidden.new_zeros(batch, state.missed.shape[1], width)  # a draft LM reads no hidden state
        rows_in = [torch.cat([before, row[:, 1:]], dim=1) for before, row in zip((*sat_out, hidden_pad), rows_in)]
    logits, draft_hidden, draft_state = forward_rows(
        draft,
        *rows_in[:3],
        state.draft_kv,
        context,
        block_size=bs,
        hidden_in=rows_in[3],
        attention=cfg.attention,
        regions=draft_regions,
        recurrent=start,
        valid=valid,
        last_logits=True,
    )  # the `current` row (the last column) proposes d'1 at P + 1: the head runs over it alone
    ring = [draft_state]  # the draft's recurrent state after each row at P .. P+K-1
    candidates = cfg.top_k_candidates
    # The drafts see the requests' processors too (after this transition's tokens, `tally`), so they
    # propose what the target will choose; draft j counts the proposals before it.
    lanes = processors(state)._replace(min_left=committed.min_left, grammar_state=committed.grammar_state)
    vectors = lane_vectors(lanes, logits.shape[-1], **features(cfg)) if cfg.processing else None  # for every draft
    logits = processed(cfg, lanes, logits[:, -1:], vectors=vectors)[:, 0]
    proposal, probs = propose(state, logits, None if draft_u is None else draft_u[:, 0], 0, plan, candidates)
    proposal = agreed(cfg, draft, proposal)  # a draft feeds the draft KV and the next verify
    h = draft_hidden[:, -1:]
    drafts, draft_probs = [proposal], [probs]
    proposals = window - 1 if proposals is None else proposals
    for j in range(1, proposals):
        p = (pos + j)[:, None]
        slot = torch.where(live[:, None], slot_of(state.block_tables, p, bs), torch.zeros_like(p))
        logits, h, draft_state = forward_rows(
            draft,
            proposal[:, None],
            p,
            slot,
            state.draft_kv,
            context,
            block_size=bs,
            hidden_in=h,
            attention=cfg.attention,
            regions=draft_regions,
            recurrent=draft_state,
            **depth_kwargs(draft, j),
        )  # an MTP head of n layers runs layer j mod n
        ring.append(draft_state)
        logits = processed(cfg, lanes, logits[:, :1], torch.stack(drafts, dim=1), before=j, vectors=vectors)[:, 0]
        proposal, probs = propose(state, logits, None if draft_u is None else draft_u[:, j], j, plan, candidates)
        proposal = agreed(cfg, draft, proposal)
        drafts.append(proposal)
        draft_probs.append(probs)

    rest, rest_probs = unproposed(state, draft_u, proposals)
    if hybrid:
        commit_ring((state.draft_conv, state.draft_rec), ring, live)
    return drafts + rest, torch.cat([torch.stack(draft_probs, dim=1), rest_probs], dim=1)


def unproposed(state: DecodeState, draft_u: torch.Tensor | None, start: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The window's drafts start + 1 .. K where nothing is proposed: -1 each, and q [B, K - start, V] all zeros
    (a greedy-only step, `draft_u` None, passes the state's q on: never read)."""
    batch, k = state.draft_probs.shape[:2]
    drafts = [state.tokens.new_full((batch,), -1) for _ in range(start, k)]
    q = state.draft_probs[:, start:]
    return drafts, q if draft_u is None else torch.zeros_like(q)


def repair_slots(rows_slots: torch.Tensor, state: DecodeState, length: torch.Tensor, live: torch.Tensor, bs: int):
    """The draft's repair row writes its KV at P - 1 where the last accepted draft was never a draft input:
    every draft the window carried was accepted. `prepare_next_draft` sees that as L == W; a window of fewer
    proposals (a step of smaller depth) has it at L - 1 == its proposals. Elsewhere the row's slot is
    the op's (a scratch write at P + 1). rows_slots: [2B], (repair, current) per lane."""
    carried = (state.tokens[:, 1:] >= 0).sum(dim=1)  # [B] drafts in the verified window
    repair = live & (length > 1) & (length - 1 == carried)
    target = slot_of(state.block_tables, (state.base_pos + length - 1)[:, None], bs)[:, 0]
    pairs = rows_slots.view(-1, 2)
    return torch.stack([torch.where(repair, target, pairs[:, 0]), pairs[:, 1]], dim=1).reshape(-1)


def point_masses(proposals: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, K, V] float32: q = 1 on each proposed token, an all-zero row where none was proposed (-1)."""
    hot = torch.nn.functional.one_hot(proposals.clamp_min(0), vocab).to(torch.float32)
    return hot * (proposals >= 0)[..., None]


def next_state(
    state: DecodeState,
    last: torch.Tensor,
    drafts: list[torch.Tensor],
    draft_probs: torch.Tensor,
    pos: torch.Tensor,
    committed: Committed,
    missed: torch.Tensor,
) -> DecodeState:
    """The state after a transition: window [last, *drafts] at base_pos = pos, the output packed; the KV,
    recurrent and history leaves were written in place, the lanes' parameters carry over."""
    overflow, finished = committed.overflow, committed.finished
    status = finished.long() if overflow is None else torch.where(overflow, 2, finished.long())
    if committed.masked is not None:
        status = torch.where(committed.masked, 3, status)
    output = StepOutput.pack(committed.accepted, committed.length, status, committed.drafts, committed.logprobs)
    return dataclasses.replace(  # a fresh state: host bookkeeping (`DecodeState.host`) unknown
        state,
        tokens=torch.stack([last, *drafts], dim=1),
        draft_probs=draft_probs,
        base_pos=pos,
        active=~finished,
        remaining=committed.remaining,
        min_left=committed.min_left,
        grammar_state=committed.grammar_state,
        counter=state.counter + 1,
        output=output.packed,
        missed=missed,
    )
