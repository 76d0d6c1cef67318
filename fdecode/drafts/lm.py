"""`LMDrafter`: a draft language model with KV of its own (docs/design.md, "The iteration" and "Adaptive
depth and the idle draft").

Its first forward runs over the fused op's two rows per lane (repair, current) and proposes d'1 at P + 1,
then one forward per further draft. Where `DecodeConfig.draft_catch_up` > 0 it sits depth-0 steps out
(`idles`): it proposes nothing, records the tokens it missed (`DecodeState.missed`), and its next forward
takes them first (`fdecode.ops.catch_up`). An MTP head (`fdecode.drafts.mtp`) proposes the same way from
the target's hidden states, and never idles.
"""

from __future__ import annotations

import torch

from fdecode.drafts.base import Drafter
from fdecode.drafts.tokens import agreed, propose, unproposed
from fdecode.ops.catch_up import missed_first, sit_out
from fdecode.ops.paging import slot_of
from fdecode.ops.plan import SamplingPlan
from fdecode.ops.processors import lane_vectors, processors
from fdecode.processing import features, processed
from fdecode.state.recurrent import commit_ring, draft_start, forward_rows


class LMDrafter(Drafter):
    """A draft LM: it may sit out depth-0 steps (`idles`), unless recurrent (its ring of states)."""

    kind = "model"

    def idles(self, draft, cfg) -> bool:
        return cfg.draft_catch_up > 0 and not self.recurrent(draft)

    def propose(
        self,
        draft,
        cfg,
        state,
        committed,
        rows,
        pos,
        context,
        draft_u,
        *,
        plan,
        draft_regions,
        proposals,
        catch_up,
        last,
    ):
        """The next window's drafts (none where the step sits the draft out: `proposals` 0), q, and `missed`."""
        if proposals == 0:  # the draft sits the step out: it takes the committed token when it catches up
            drafts, draft_probs = unproposed(state, draft_u, 0)
            return drafts, draft_probs, sit_out(state.missed, last, committed.length)
        drafts, draft_probs = forward_proposals(
            self,
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
        missed = torch.full_like(state.missed, -1) if catch_up else state.missed
        return drafts, draft_probs, missed

    def propose_tree(self, draft, cfg, state, committed, pos, context, *, shape, draft_regions, run_rows, catch_up):
        """The draft's forwards level by level, keeping the N best nodes by path probability."""
        from fdecode.tree.draft import draft_tree  # which asks `drafter_for` (fdecode.drafts imports this module)

        return draft_tree(
            draft, cfg, state, committed, pos, context, shape,
            draft_regions=draft_regions, run_rows=run_rows, catch_up=catch_up,
        )  # fmt: skip


def forward_proposals(
    drafter: Drafter,
    draft,
    cfg,
    state,
    committed,
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
    hybrid = drafter.recurrent(draft)
    start = draft_start((state.draft_conv, state.draft_rec), length, cfg.K) if hybrid else None
    # A recurrent draft state takes the repair row only when it carries d'K (L == W): `fdecode.state.recurrent`.
    valid = torch.stack([length == window, torch.ones_like(live)], dim=1) if hybrid else None
    rows_in = [
        tokens.view(batch, 2),
        rows_pos.view(batch, 2),
        rows_slots.view(batch, 2),
        rows_hidden.view(batch, 2, width),
    ]
    if catch_up:  # the tokens it missed, then the current row
        rows_in = missed_first(
            state.missed, state.base_pos, state.block_tables, live, bs, tuple(row[:, 1:] for row in rows_in)
        )
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
            **drafter.forward_kwargs(draft, j),
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


def repair_slots(rows_slots: torch.Tensor, state, length: torch.Tensor, live: torch.Tensor, bs: int):
    """The draft's repair row writes its KV at P - 1 where the last accepted draft was never a draft input:
    every draft the window carried was accepted. `prepare_next_draft` sees that as L == W; a window of fewer
    proposals (a step of smaller depth) has it at L - 1 == its proposals. Elsewhere the row's slot is
    the op's (a scratch write at P + 1). rows_slots: [2B], (repair, current) per lane."""
    carried = (state.tokens[:, 1:] >= 0).sum(dim=1)  # [B] drafts in the verified window
    repair = live & (length > 1) & (length - 1 == carried)
    target = slot_of(state.block_tables, (state.base_pos + length - 1)[:, None], bs)[:, 0]
    pairs = rows_slots.view(-1, 2)
    return torch.stack([torch.where(repair, target, pairs[:, 0]), pairs[:, 1]], dim=1).reshape(-1)
