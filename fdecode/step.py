"""The decode step: validate -> sample -> prepare -> draft, one pure function of the state
(docs/design.md, "The iteration").

    state --validate--> target logits/hidden over the window [t, d1 .. dK]           (`validate`)
          --sample----> accepted tokens, cut at stop ids and budgets                  (`commit`)
          --prepare---> 2 draft rows per lane (fused op `fdecode::prepare_next_draft`) (`advance`)
          --draft-----> K draft forwards, or an n-gram lookup -> [last, d'1 .. d'K]   (`Drafter.propose`,
                                                                                       `fdecode.drafts`)

The phases hand over typed tuples, `Verified` and `Committed`. Nothing here reads a tensor value on
the host, so the whole function captures as one graph with fixed shapes. The KV leaves are written in
place (donation contract, see `DecodeState`); everything else in the returned state is freshly built
(`next_state`). `advance` is shared with priming, which hands it a one-token accepted run.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fdecode.config import DecodeConfig
from fdecode.drafts import drafter_for
from fdecode.models.parallel import rank0_tokens
from fdecode.models.regions import compiling_regions
from fdecode.ops.filters import filtered
from fdecode.ops.paging import slot_of, window_columns
from fdecode.ops.plan import GREEDY, SamplingPlan, general
from fdecode.ops.prepare import prepare_next_draft
from fdecode.ops.processors import logprobs as token_logprobs
from fdecode.ops.processors import processors
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
from fdecode.processing import processed, tallied
from fdecode.state import DecodeState, StepOutput
from fdecode.state.decode_state import with_leaves
from fdecode.state.recurrent import commit_verify, forward_rows, is_hybrid
from fdecode.tree.shape import TreeShape
from fdecode.tree.step import tree_advance, tree_step


def transition_randoms(state: DecodeState, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All random numbers of one transition, drawn at once from the lanes' (seed, counter): the
    recovery / bonus draw [B, 2], the acceptance tests [B, K], the K draft draws [B, K, 2]."""
    u = uniform(state.seed, state.counter, 3 * k + 2)
    return u[:, :2], u[:, 2 : k + 2], u[:, k + 2 :].reshape(-1, k, 2)


def general_plan(cfg: DecodeConfig) -> SamplingPlan:
    """The plan exact for any lanes the config allows: every filter on, or greedy-only (`fdecode.ops.plan.general`)."""
    return general(cfg.sampling)


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
    catch_up: bool = False,
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
    first depth + 1 rows only, and the step proposes `Drafter.proposals` drafts for the next
    window (max(depth, 1) for a draft LM or MTP head; K for n-gram drafts, whose lookups cost nothing, and
    for recurrent drafts); the rest of the next window is -1 (nothing proposed: never accepted, and a random
    lane's rejection there draws from p itself, so every depth is exact). depth 0 commits one token per
    lane, as target-only decoding would (`fdecode.runtime.gate` decides when, for n-gram drafts); a draft LM
    sits it out (`fdecode.ops.catch_up`) and proposes nothing. catch_up (with depth 0): the draft's forward
    first takes the tokens it sat out, then proposes one draft.
    draft_regions: whether the draft's layers may run as compile regions (`cfg.layer_regions` and no parameter
    shared with the target: `fdecode.models.regions.shares_parameters`), checked by the caller once per graph
    (`pure_step`): inside the trace Dynamo would walk every parameter of both models.
    """
    plan = general_plan(cfg) if plan is None else plan
    depth = cfg.K if depth is None else depth
    if cfg.tree:  # a draft tree (`fdecode.tree`): its own validate, verify, commit and advance
        new_state = tree_step(
            target,
            draft,
            cfg,
            state,
            context_blocks=context_blocks,
            plan=plan,
            depth=depth,
            catch_up=catch_up,
            draft_regions=draft_regions,
        )
        return new_state, new_state.step_output
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
        proposals=1 if catch_up else drafter_for(draft).proposals(draft, cfg, depth),
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
    if cfg.tree:  # priming a tree step: the first tree from the first token (`fdecode.tree.step`)
        return tree_advance(
            draft, cfg, state, committed, context, TreeShape.at(cfg, cfg.K), draft_regions=draft_regions
        )
    bs = cfg.block_size
    placeholder = hidden.new_zeros(hidden.shape[-1])
    rows = prepare_next_draft(accepted, hidden, placeholder, state.base_pos, state.base_pos + 1, state.block_tables, bs)
    last = rows[0].view(batch, 2)[:, 1]  # the last committed token, the next window's t
    pos = state.base_pos + length  # P, its position (not sliced out of the op's strided rows: see `forward_proposals`)
    drafts, draft_probs, missed = drafter_for(draft).propose(  # `fdecode.drafts`: a lookup or draft forwards
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
        last=last,
    )
    return next_state(state, last, drafts, draft_probs, pos, committed, missed)


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
    return with_leaves(  # a fresh state (what the host knows of it: `fdecode.host_record`)
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
