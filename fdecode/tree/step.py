"""The tree step: verify a lane's N drafted nodes at once, commit the accepted path, draft the next tree
(docs/design.md, "Trees"). `fdecode.step.decode_step` runs it for a tree config (`DecodeConfig.tree`).

    state.tokens [B, N + 1] = [t, nodes], state.tree_parents [B, N + 1] (-1 for t, the root)
      --validate--> the target once over the N + 1 rows: row i at position base_pos + depth(i), its KV in the
                    slot of the lane's position base_pos + i (its own, never committed KV), seeing the context
                    before t and its ancestors (`TreeRows`)
      --sample----> each row through the lanes' request features after its node's path
                    (`fdecode.tree.processing`); greedy: the deepest path the target's argmax agrees with; random
                    lanes: recursive rejection over siblings (`fdecode.ops.tree`); then stops, budgets, missing KV
                    and rows the features left no token as a chain; logprobs from the accepted path's rows
      --commit----> the accepted path's target KV moved to base_pos + 1 .. (`move_path_kv`); a hybrid target's
                    recurrent state is the one after the path's last committed node (each node's state
                    continues its parent's in the verify: `fdecode.ops.delta_rule`), so branches leave none
      --advance---> the draft's next tree from the last committed token (`Drafter.propose_tree`: a draft LM's
                    `fdecode.tree.draft`, n-gram drafts' `fdecode.tree.ngram`)

A node whose own slot is the scratch slot (past the lane's blocks) is absent: it is never accepted.
"""

from __future__ import annotations

import torch

from fdecode.drafts import drafter_for
from fdecode.models.parallel import rank0_tokens
from fdecode.ops.attention import TreeRows
from fdecode.ops.catch_up import sit_out
from fdecode.ops.filters import filtered
from fdecode.ops.paging import slot_of, window_columns
from fdecode.ops.plan import SamplingPlan
from fdecode.ops.processors import processors
from fdecode.ops.random import uniform
from fdecode.ops.sampling import apply_stops, cut_at_masked_rows, cut_at_missing_kv, dense
from fdecode.ops.tree import ancestors, greedy_tree_accept, rows_at, tree_accept
from fdecode.processing import processed, tallied
from fdecode.state.decode_state import with_leaves
from fdecode.state.recurrent import commit_verify, forward_rows, is_hybrid
from fdecode.tree.processing import node_paths
from fdecode.tree.shape import TreeShape


def tree_step(
    target, draft, cfg, state, *, context_blocks, plan: SamplingPlan, depth: int, catch_up: bool, draft_regions: bool
):
    """One tree transition (validate -> sample -> commit -> advance); consumes `state` (KV written in place).
    depth (`tree_depths`): the window's first depth + 1 rows are verified (a tree: its nodes come in topological
    order); past S the step drafts a tree of depth nodes (the config's at K), at 0 .. S a chain (one at 0). A
    draft that idles (`Drafter.idles`) sits depth 0 out (no draft: the tokens it missed wait in
    `DecodeState.missed`), and catch_up (with depth 0) runs it over them first, then drafts one node."""
    from fdecode.step import Committed, logprob_rows  # the chain's (fdecode.step imports this module)

    context = window_columns(state.block_tables, context_blocks)
    batch, window = state.tokens.shape
    rows, levels, bs = depth + 1, cfg.levels, cfg.block_size  # the root and `depth` nodes (all N + 1 at K)
    own = state.base_pos[:, None] + torch.arange(window, device=state.base_pos.device)  # row i's own position
    slots = torch.where(state.active[:, None], slot_of(state.block_tables, own, bs), torch.zeros_like(own))
    tokens = torch.cat([state.tokens[:, :1], torch.where(slots[:, 1:rows] != 0, state.tokens[:, 1:rows], -1)], 1)
    parents = state.tree_parents[:, :rows]
    seen = ancestors(parents, levels)  # [B, rows, rows]
    positions = state.base_pos[:, None] + seen.sum(dim=-1) - 1  # base_pos + depth
    logits, hidden, snapshots = forward_rows(  # a hybrid's nodes each continue their parent's recurrent state
        target,
        tokens.clamp_min(0),
        positions,
        slots[:, :rows],
        state.target_kv,
        context,
        block_size=bs,
        attention=cfg.attention,
        tree=TreeRows(slots[:, :rows], seen, state.base_pos) if depth > levels else None,
        recurrent=(state.target_conv[:, :, 0], state.target_rec[:, :, 0]) if is_hybrid(target) else None,
        snapshots=True,
        parents=parents if depth > levels else None,  # a chain depth's rows: a chain, each after the one before
    )
    lanes = processors(state)
    vocab = logits.shape[-1]
    paths = node_paths(cfg, lanes, tokens, parents, seen, vocab) if cfg.processing else None
    chosen = processed(cfg, lanes, logits, paths=paths)  # each node's row after its own path
    accepted, length, path = verify_tree(cfg, state, tokens, parents, chosen, plan)
    if cfg.broadcast_accepted:  # rank 0's path, before the KV moves and the stops, budgets or next tree read it
        accepted, path = rank0_tokens(torch.cat([accepted, path], dim=1), target.tp).chunk(2, dim=1)
        length = (accepted >= 0).sum(dim=1)
    move_path_kv(state.target_kv, slots, path)
    pad = window - accepted.shape[1]
    accepted = torch.cat([accepted, accepted.new_full((batch, pad), -1)], dim=1)
    hidden = torch.cat([path_rows(hidden, path), hidden.new_zeros(batch, pad, hidden.shape[-1])], dim=1)
    accepted, length, remaining, finished = apply_stops(accepted, length, state.active, state.remaining, state.stop_ids)
    accepted, length, remaining, overflow = cut_at_missing_kv(accepted, length, remaining, slots != 0)
    masked = None
    if cfg.grammars and cfg.min_tokens:  # a row the two masks leave no token (`cut_at_masked_rows`)
        accepted, length, remaining, masked = cut_at_masked_rows(accepted, length, remaining, path_rows(chosen, path))
    if snapshots is not None:  # the state after the accepted path's last committed node; branches leave none
        commit_verify((state.target_conv, state.target_rec), snapshots, length, path)
    min_left, grammar_state = tallied(cfg, lanes, accepted, length, vocab)
    drafts = torch.where(state.active, (tokens[:, 1:] >= 0).sum(dim=1), 0)
    logprobs = None
    if cfg.max_logprobs is not None:  # of the committed tokens, from the rows that chose them: the path's nodes
        raw, used = path_rows(logits, path), path_rows(chosen, path)
        logprobs = logprob_rows(cfg, plan, state, raw, used, accepted[:, : path.shape[1]])
    stopped = finished | overflow if masked is None else finished | overflow | masked
    committed = Committed(
        accepted, length, hidden, remaining, stopped, overflow, drafts, min_left, grammar_state, logprobs, masked
    )
    drafter = drafter_for(draft)
    run_rows = catch_up_length(drafter.recurrent(draft), depth, levels)
    shape = TreeShape.at(cfg, depth)
    idle = depth == 0 and not catch_up and drafter.proposals(draft, cfg, 0) == 0
    return tree_advance(
        draft, cfg, state, committed, context, shape,
        draft_regions=draft_regions, run_rows=run_rows, catch_up=catch_up, idle=idle,
    )  # fmt: skip


def catch_up_length(recurrent: bool, depth: int, levels: int) -> int:
    """The rows the draft's catch-up forward runs after a step of `depth`: the committed run it has no KV for.
    A tree (depth > S) may commit a branch, whose nodes' KV went to scratch: its whole run, S + 1 rows. A chain
    depth commits a prefix of the draft's chain, whose KV the draft wrote at its own positions
    (`fdecode.tree.draft.frontier_positions`): the last two rows, as a chain step's (the last draft, never a
    draft input, and the bonus token); one at depth 0. A recurrent draft restarts from its state through the
    root, so it runs the whole run: depth + 1 rows."""
    if depth > levels:
        return levels + 1
    return depth + 1 if recurrent else min(depth, 1) + 1


def verify_tree(cfg, state, tokens, parents, logits, plan: SamplingPlan):
    """accepted [B, S + 1], length [B], the accepted path's rows [B, S + 1] (-1 past it): greedy lanes by the
    target's argmax, random lanes (plan.random) by `tree_accept` on their filtered distributions."""
    levels = cfg.levels
    accepted, length, path = greedy_tree_accept(tokens, parents, logits.argmax(dim=-1), levels)
    if not plan.random:
        return accepted, length, path
    u = uniform(state.seed, state.counter, 2 + levels * cfg.draft_topk)
    probs, ids = filtered(plan, logits, state.temperature, state.top_k, state.top_p, state.min_p)
    probs = dense(probs, ids, logits.shape[-1])
    drawn = tree_accept(tokens, parents, probs, u[:, 2:].reshape(-1, levels, cfg.draft_topk), u[:, :2], levels)
    random_lane = state.temperature > 0
    return tuple(
        torch.where(random_lane.view(-1, *[1] * (g.dim() - 1)), r, g) for r, g in zip(drawn, (accepted, length, path))
    )


def path_rows(rows: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
    """rows [B, R, X] of the accepted path's nodes `path` [B, S + 1] (the root's row past the path's end)."""
    return rows_at(rows, path.clamp_min(0))


def move_path_kv(kv: torch.Tensor, slots: torch.Tensor, path: torch.Tensor) -> None:
    """The KV of the accepted path's node at depth j (row path[:, j], written at its own slot) to the slot of
    position base_pos + j, `slots[:, j]`, for every layer, in place. Rows past the path move scratch to scratch.
    kv: any paged leaf, its slots on axis 2: keys and values [L, 2, num_slots, Hkv, D], or an MLA model's
    latents [L, 1, num_slots, 1, R + Dr] (`fdecode.ops.latent_kv`)."""
    depth = path.shape[1]
    on_path = path[:, 1:] >= 0
    source = torch.where(on_path, slots.gather(1, path[:, 1:].clamp_min(0)), 0).reshape(-1)
    target = torch.where(on_path, slots[:, 1:depth], 0).reshape(-1)
    kv.index_copy_(2, target, kv.index_select(2, source))


def tree_advance(
    draft,
    cfg,
    state,
    committed,
    context,
    shape: TreeShape,
    *,
    draft_regions: bool,
    run_rows: int | None = None,
    catch_up: bool = False,
    idle: bool = False,
):
    """The state after a transition (or priming): the last committed token at P, the root of the draft's next
    tree, and the tree of `shape` (the window's rows past it absent); the output packed as a chain's
    (`fdecode.step.next_state`). run_rows: the committed run's last rows the draft catches up on (None: S + 1, all
    a tree can commit; `catch_up_length`). catch_up: the draft
    first takes the tokens it sat out (`DecodeState.missed`, then cleared). idle: the draft sits the step out
    (`Drafter.idles`, depth 0): no node, and the committed token joins the ones it missed
    (`fdecode.ops.catch_up.sit_out`)."""
    from fdecode.step import next_state

    accepted, length = committed.accepted, committed.length
    last = accepted.gather(1, (length - 1).clamp_min(0)[:, None])[:, 0]
    last = torch.where(length > 0, last, state.tokens[:, 0])
    pos = state.base_pos + length
    if idle:
        nodes = parents = last.new_zeros(last.shape[0], 0)
        missed = sit_out(state.missed, last, length)
    else:
        drafter = drafter_for(draft)  # a draft LM's forwards level by level, a lookup's most frequent continuations
        nodes, parents = drafter.propose_tree(
            draft, cfg, state, committed, pos, context, shape=shape, draft_regions=draft_regions,
            run_rows=cfg.levels + 1 if run_rows is None else run_rows, catch_up=catch_up,
        )  # fmt: skip
        missed = torch.full_like(state.missed, -1) if catch_up else state.missed
    absent = cfg.K - nodes.shape[1]
    nodes = torch.cat([nodes, nodes.new_full((nodes.shape[0], absent), -1)], dim=1)
    parents = torch.cat([parents, parents.new_zeros(parents.shape[0], absent)], dim=1)
    new = next_state(state, last, list(nodes.unbind(1)), state.draft_probs, pos, committed, missed)
    return with_leaves(new, tree_parents=torch.cat([parents.new_full((parents.shape[0], 1), -1), parents], 1))
