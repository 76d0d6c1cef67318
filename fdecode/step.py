"""The decode step: validate -> sample -> prepare -> draft, one pure function of the state.

    state --validate--> target logits/hidden over the window [t, d1 .. dK]
          --sample----> accepted tokens (greedy lanes: argmax match; random lanes:
                        rejection sampling), cut at stop ids and budgets
          --prepare---> 2 draft rows per lane (fused op `fdecode::prepare_next_draft`)
          --draft-----> K draft forwards -> next window [last, d'1 .. d'K]
                        (an n-gram draft: a lookup in the lane's token history instead,
                        -1 where nothing is proposed; `fdecode.ops.ngram`)

Nothing here reads a tensor value on the host: every per-lane quantity stays a
tensor, so the whole function captures as one graph with fixed shapes. The KV
leaves are written in place (donation contract, see `DecodeState`); everything
else in the returned state is freshly built.

`advance` (prepare + draft) is shared with priming: after a prefill the host
hands it a one-token accepted run, and the device-resident path takes over.
"""

from __future__ import annotations

import torch

from fdecode.config import DecodeConfig
from fdecode.models.ngram import is_ngram
from fdecode.models.mtp import depth_kwargs
from fdecode.models.parallel import rank0_tokens
from fdecode.models.regions import compiling_regions, shares_parameters
from fdecode.ops.filters import candidate_filter, filtered
from fdecode.ops.ngram import lookup, write_history
from fdecode.ops.paging import slot_of, window_columns
from fdecode.ops.plan import GREEDY, SamplingPlan
from fdecode.ops.prepare import prepare_next_draft
from fdecode.ops.random import uniform
from fdecode.ops.sampling import apply_stops, cut_at_missing_kv, dense, greedy_accept, sample, speculative_accept
from fdecode.state import DecodeState, StepOutput
from fdecode.state.recurrent import commit_ring, commit_verify, draft_start, forward_rows, is_hybrid


def transition_randoms(state: DecodeState, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All random numbers of one transition, drawn at once from the lanes' (seed, counter): the
    recovery / bonus draw [B, 2], the acceptance tests [B, K], the K draft draws [B, K, 2]."""
    u = uniform(state.seed, state.counter, 3 * k + 2)
    return u[:, :2], u[:, 2 : k + 2], u[:, k + 2 :].reshape(-1, k, 2)


def general_plan(cfg: DecodeConfig) -> SamplingPlan:
    """The plan exact for any lanes the config allows: every filter on, or greedy-only."""
    return SamplingPlan(random=True, top_k=True, top_p=True) if cfg.sampling else GREEDY


def agreed(cfg: DecodeConfig, model, tokens: torch.Tensor) -> torch.Tensor:
    """`tokens` as tensor-parallel rank 0 has them (`broadcast_accepted`, the catch-all for
    non-deterministic kernels), else unchanged: every rank derives its state from the same tokens."""
    return rank0_tokens(tokens, model.tp) if cfg.broadcast_accepted else tokens


def decode_step(
    target, draft, cfg: DecodeConfig, state: DecodeState, *, context_blocks: int | torch.Tensor | None = None,
    plan: SamplingPlan | None = None, depth: int | None = None,
) -> tuple[DecodeState, StepOutput]:
    """One speculative decoding iteration. Consumes `state` (its KV is updated in place).

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
    lane, as target-only decoding would (`fdecode.runtime.gate` decides when, for n-gram drafts).
    """
    plan = general_plan(cfg) if plan is None else plan
    window = cfg.W
    depth = cfg.K if depth is None else depth
    rows = depth + 1
    context = window_columns(state.block_tables, context_blocks)  # [B, context_blocks]: what attention reads
    positions = state.base_pos[:, None] + torch.arange(window, device=state.base_pos.device)  # [B, W]
    slots = torch.where(
        state.active[:, None], slot_of(state.block_tables, positions, cfg.block_size), torch.zeros_like(positions)
    )
    committed = (state.target_conv[:, :, 0], state.target_rec[:, :, 0]) if is_hybrid(target) else None
    logits, hidden, snapshots = forward_rows(  # a draft id < 0 (nothing proposed) runs as id 0, never accepted
        target, state.tokens[:, :rows].clamp_min(0), positions[:, :rows], slots[:, :rows], state.target_kv, context,
        block_size=cfg.block_size, attention=cfg.attention, regions=cfg.layer_regions, recurrent=committed,
        snapshots=True,
    )  # [B, rows, V], [B, rows, H], recurrent states after each row (None: no linear-attention layers)
    noise, accept_u, draft_u = transition_randoms(state, cfg.K) if plan.random else (None, None, None)
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
    accepted, length, remaining, finished = apply_stops(
        accepted, length, state.active, state.remaining, state.stop_ids
    )
    accepted, _, remaining, overflow = cut_at_missing_kv(accepted, length, remaining, slots != 0)
    if snapshots is not None:  # verify with rollback: the state after each lane's accepted prefix, in place
        commit_verify((state.target_conv, state.target_rec), snapshots, (accepted >= 0).sum(dim=1))
    new_state = advance(
        draft, cfg, state, accepted, hidden, draft_u, remaining=remaining, finished=finished | overflow,
        overflow=overflow, context_blocks=context_blocks, plan=plan, proposals=proposals(draft, cfg, depth),
        # Checked only while tracing (eager steps never run regions): see `shares_parameters`.
        draft_regions=compiling_regions(cfg.layer_regions) and not shares_parameters(target, draft),
    )
    return new_state, new_state.step_output


def proposals(draft, cfg: DecodeConfig, depth: int) -> int:
    """How many drafts a step of `depth` proposes for the next window: as many as it verified (at least the
    one the draft's first forward makes anyway, which keeps the draft's KV in step); all K where a
    proposal costs nothing (n-gram lookups) or a recurrent draft's ring needs them (`commit_ring`)."""
    return cfg.K if is_ngram(draft) or is_hybrid(draft) else max(depth, 1)


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

    logits: [B, 1, V]. Greedy lanes take the argmax; random lanes draw from their filtered p with `noise`,
    the draw `speculative_accept` makes when the first draft is rejected or was never proposed."""
    token = logits[:, 0].argmax(dim=-1)
    if plan.random:
        probs, ids = filtered(plan, logits, state.temperature, state.top_k, state.top_p, state.min_p)
        drawn = sample(dense(probs[:, 0], None if ids is None else ids[:, 0], logits.shape[-1]), noise)
        token = torch.where(state.temperature > 0, drawn, token)
    return token[:, None], torch.ones_like(token)


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
    accepted: torch.Tensor,  # [B, W] int64, committed tokens of this transition, -1 padded
    hidden: torch.Tensor,  # [B, W, H] target hidden of the rows that produced them
    draft_u: torch.Tensor | None,  # [B, K, 2] uniforms for sampling the K drafts (None: greedy-only)
    *,
    remaining: torch.Tensor,  # [B] int64 budget left after `accepted`
    finished: torch.Tensor,  # [B] bool
    overflow: torch.Tensor | None = None,  # [B] bool: stopped because it ran past its KV blocks
    context_blocks: int | torch.Tensor | None = None,  # attention window in blocks (see `decode_step`), None: whole lanes
    plan: SamplingPlan = GREEDY,  # how random lanes draw their drafts (draft_u is given unless GREEDY)
    draft_regions: bool = False,  # run the draft's layers as compile regions (`fdecode.models.regions`)
    proposals: int | None = None,  # drafts to propose, 1 .. K (None: K); the rest of the window is -1
) -> DecodeState:
    """Prepare the next draft input from `accepted`, run the draft forwards, build the next state."""
    batch, window = accepted.shape
    context = window_columns(state.block_tables, context_blocks)  # [B, context_blocks]
    bs = cfg.block_size
    width = hidden.shape[-1]
    placeholder = hidden.new_zeros(width)
    tokens, rows_hidden, rows_pos, _kv_lens, rows_slots = prepare_next_draft(
        accepted, hidden, placeholder, state.base_pos, state.base_pos + 1, state.block_tables, bs
    )
    live = (accepted >= 0).any(dim=1)  # [B] lanes that committed something write draft KV
    length = (accepted >= 0).sum(dim=1)  # [B] L
    if is_ngram(draft):  # prompt lookup over the history: no draft forward, no draft KV
        last = tokens.view(batch, 2)[:, 1]
        pos = state.base_pos + length
        write_history(state.history, state.base_pos, accepted)  # in place, like the KV
        found = lookup(state.history[:, : context.shape[1] * bs], pos, cfg.K, draft.max_n, draft.min_n)
        drafts = list(found.unbind(1))
        # A point mass on each proposed token (rejection sampling stays exact); nothing where none was proposed.
        draft_probs = state.draft_probs if draft_u is None else point_masses(found, state.draft_probs.shape[-1])
        return _next_state(state, last, drafts, draft_probs, pos, accepted, remaining, finished, overflow)
    rows_slots = repair_slots(rows_slots, state, length, live, bs)
    hybrid = is_hybrid(draft)
    start = draft_start((state.draft_conv, state.draft_rec), length, cfg.K) if hybrid else None
    # A recurrent draft state takes the repair row only when it carries d'K (L == W): `fdecode.state.recurrent`.
    valid = torch.stack([length == window, torch.ones_like(live)], dim=1) if hybrid else None
    logits, draft_hidden, draft_state = forward_rows(
        draft,
        tokens.view(batch, 2),
        rows_pos.view(batch, 2),
        rows_slots.view(batch, 2),
        state.draft_kv,
        context,
        block_size=bs,
        hidden_in=rows_hidden.view(batch, 2, width),
        attention=cfg.attention, regions=draft_regions,
        recurrent=start,
        valid=valid,
    )  # the `current` row (column 1) proposes d'1 at P + 1
    ring = [draft_state]  # the draft's recurrent state after each row at P .. P+K-1
    last = tokens.view(batch, 2)[:, 1]
    # P, the position of `last`, computed afresh rather than sliced out of rows_pos: a strided view
    # (stride 2, kept even by .contiguous() when B == 1) would differ from primed states and recompile.
    pos = state.base_pos + (accepted >= 0).sum(dim=1)
    candidates = cfg.top_k_candidates
    proposal, probs = propose(state, logits[:, 1], None if draft_u is None else draft_u[:, 0], 0, plan, candidates)
    proposal = agreed(cfg, draft, proposal)  # a draft feeds the draft KV and the next verify
    h = draft_hidden[:, 1:2]
    drafts, draft_probs = [proposal], [probs]
    proposals = window - 1 if proposals is None else proposals
    for j in range(1, proposals):
        p = (pos + j)[:, None]
        slot = torch.where(live[:, None], slot_of(state.block_tables, p, bs), torch.zeros_like(p))
        logits, h, draft_state = forward_rows(
            draft, proposal[:, None], p, slot, state.draft_kv, context, block_size=bs, hidden_in=h,
            attention=cfg.attention, regions=draft_regions, recurrent=draft_state, **depth_kwargs(draft, j),
        )  # an MTP head of n layers runs layer j mod n
        ring.append(draft_state)
        proposal, probs = propose(state, logits[:, 0], None if draft_u is None else draft_u[:, j], j, plan, candidates)
        proposal = agreed(cfg, draft, proposal)
        drafts.append(proposal)
        draft_probs.append(probs)

    for j in range(proposals, window - 1):  # not proposed: -1, and q all zeros (a greedy graph passes q on)
        drafts.append(torch.full_like(last, -1))
        draft_probs.append(state.draft_probs[:, j] if draft_u is None else torch.zeros_like(probs))

    if hybrid:
        commit_ring((state.draft_conv, state.draft_rec), ring, live)
    return _next_state(state, last, drafts, torch.stack(draft_probs, dim=1), pos, accepted, remaining, finished, overflow)


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


def _next_state(
    state: DecodeState, last: torch.Tensor, drafts: list[torch.Tensor], draft_probs: torch.Tensor, pos: torch.Tensor,
    accepted: torch.Tensor, remaining: torch.Tensor, finished: torch.Tensor, overflow: torch.Tensor | None,
) -> DecodeState:
    """The state after a transition: window [last, *drafts] at base_pos = pos, the output packed."""
    status = finished.long() if overflow is None else torch.where(overflow, 2, finished.long())
    output = StepOutput.pack(accepted, (accepted >= 0).sum(dim=1), status)
    return DecodeState(
        tokens=torch.stack([last, *drafts], dim=1),
        draft_probs=draft_probs,
        base_pos=pos,
        block_tables=state.block_tables,
        target_kv=state.target_kv,
        draft_kv=state.draft_kv,
        target_conv=state.target_conv,
        target_rec=state.target_rec,
        draft_conv=state.draft_conv,
        draft_rec=state.draft_rec,
        history=state.history,
        active=~finished,
        remaining=remaining,
        stop_ids=state.stop_ids,
        temperature=state.temperature,
        top_k=state.top_k,
        top_p=state.top_p,
        min_p=state.min_p,
        seed=state.seed,
        counter=state.counter + 1,
        output=output.packed,
    )
