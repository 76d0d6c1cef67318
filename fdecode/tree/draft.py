"""A draft LM drafts a tree inside the step graph, level by level (docs/design.md, "Trees").

1. Catch-up forward: the last rows of the committed run (the accepted path's drafts and the bonus token,
   right-aligned, padding rows written to the scratch slot; `fdecode.tree.step.catch_up_length`: S + 1 after
   a tree, 2 after a chain depth, whose run the draft's chain wrote but for its last draft) at their lane
   positions, so the draft's KV of every committed position is what a chain would hold, whichever branch was
   accepted. Its last row (the bonus token `last` at P) gives the root's k children: depth 1, all expanded.
2. Levels 2 .. S: one forward over the frontier's k nodes per lane (B x k rows, `TreeRows`: each sees the
   context up to P and its own ancestors), whose KV goes to slots of the lane's future positions (never
   committed KV; overwritten later): the chain's node at its own, the others past the chain's
   (`frontier_positions`). Each frontier node keeps its top-k
   children, scored by path probability (the sum of the draft's log-probabilities along the path); the k
   best of the k^2 become the next frontier (EAGLE-2's expansion).
3. The N best of all k + (S - 1) k^2 candidates by path probability are the tree (EAGLE-2's reranking),
   ordered by depth, then score, so parents come first. A child's score never exceeds its parent's, so
   the chosen set is a tree; a node whose parent a tie left out is marked absent (-1, never accepted).

With request features, every row's logits go through the lane's processors after its own path
(`fdecode.tree.processing`), as the verify's do; a token they mask (a grammar's, min_tokens') is never a node.

The draft's own chain (the top child of the root, then of that child, S deep: what a chain of depth S
drafts) ranks first at every choice, in the frontier and in the N best: a tree is then a superset of the
chain, so greedy commits at least the chain's tokens per verify. By path probability alone the N best can
drop the chain's deepest nodes for shallow siblings, and on the real Qwen2.5-Coder pair's code prompt the
trees then committed fewer tokens than the chain (4.50 against 4.85 per verify at S = 4).

A recurrent (hybrid) draft LM's state follows each branch: the catch-up's state through the root is
committed, and each frontier node runs from its parent's (`fdecode.tree.draft_state`).
"""

from __future__ import annotations

import torch

from fdecode.drafts import drafter_for
from fdecode.drafts.tokens import agreed
from fdecode.ops.attention import TreeRows
from fdecode.ops.catch_up import missed_first
from fdecode.ops.paging import slot_of
from fdecode.ops.prepare_tree import prepare_tree_draft
from fdecode.ops.processors import lane_vectors, processors
from fdecode.ops.tree import rows_at
from fdecode.processing import features, processed
from fdecode.state.recurrent import forward_rows
from fdecode.tree.draft_state import branch_rows, commit_root, draft_start, parent_states
from fdecode.tree.processing import child_paths, root_paths
from fdecode.tree.shape import TreeShape


def catch_up_rows(cfg, state, committed, rows: int) -> tuple[torch.Tensor, ...]:
    """tokens, positions, slots [B, rows] of the committed run's last `rows` tokens (of accepted[:L] at
    base_pos + 1 ..; all of it where L <= rows), right-aligned, each row's hidden_in [B, rows, H] and which rows
    are real [B, rows] (the rest pad). hidden_in is the target's hidden at the row before (an MTP head pairs the
    token at p with it; `committed.hidden` row j is the accepted path's node at depth j, which chose accepted[j])."""
    return prepare_tree_draft(
        committed.accepted, committed.length, committed.hidden, state.base_pos, state.block_tables, cfg.block_size, rows
    )  # the fused op (`fdecode.ops.prepare_tree`): one graph node


def draft_tree(
    draft,
    cfg,
    state,
    committed,
    pos: torch.Tensor,
    context: torch.Tensor,
    shape: TreeShape,
    *,
    draft_regions: bool,
    run_rows: int,
    catch_up: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The next tree's `shape.nodes` nodes: tokens [B, n] (-1 absent) and parents [B, n] (0: the root, else a
    node's index 1 .. n), in topological order, the draft's chain first. pos: P [B], the position of the root
    (the last committed token). The catch-up runs the committed run's last `run_rows` rows
    (`fdecode.tree.step.catch_up_length`). An MTP head's rows take
    the hidden state of the row before them: the target's for the committed run, its own output at the parent
    for a tree node (a draft LM ignores it). catch_up: the rows of the tokens the draft sat out
    (`fdecode.ops.catch_up.missed_rows`) go first (a draft LM's: it reads no hidden state)."""
    k, levels, bs = shape.topk, shape.levels, cfg.block_size
    batch, device = pos.shape[0], pos.device
    drafter = drafter_for(draft)
    live = (committed.length > 0)[:, None]
    run = dict(block_size=bs, attention=cfg.attention)
    tokens, positions, slots, hidden_in, real = catch_up_rows(cfg, state, committed, run_rows)
    if catch_up:  # the tokens the draft sat out first, at their positions (padding where none)
        rows = (tokens, positions, slots, hidden_in)
        tokens, positions, slots, hidden_in = missed_first(
            state.missed, state.base_pos, state.block_tables, live[:, 0], bs, rows
        )
        real = torch.cat([state.missed >= 0, real], dim=1)
    recurrent = drafter.recurrent(draft)  # a hybrid draft LM: its state continues along each branch
    logits, hidden, after = forward_rows(
        draft, tokens, positions, slots, state.draft_kv, context, hidden_in=hidden_in, regions=draft_regions,
        last_logits=True, recurrent=draft_start(state) if recurrent else None, valid=real, **run,
        **drafter.forward_kwargs(draft, 0),
    )  # fmt: skip
    if after is not None:
        commit_root(state, after, live[:, 0])
        states = tuple(s[:, None].expand(batch, k, *s.shape[1:]) for s in after)  # the frontier's parents' states
    # The draft sees the requests' processors too (after this transition's tokens, `tally`), each row after its
    # own path (`fdecode.tree.processing`), so it drafts what the processed target will choose.
    lanes = processors(state)._replace(min_left=committed.min_left, grammar_state=committed.grammar_state)
    vocab = logits.shape[-1]
    vectors = lane_vectors(lanes, vocab, **features(cfg)) if cfg.processing else None  # for every level
    logits = processed(cfg, lanes, logits, vectors=vectors)
    score, token = draft_logprobs(cfg, logits[:, 0]).topk(k, dim=-1)  # [B, k]: depth 1, the root's children
    paths = child_paths(cfg, lanes, root_paths(cfg, lanes), torch.zeros_like(token), token, vocab)
    pool = [(token, score, torch.full_like(token, -1))]  # (tokens, path log-probs, parent's pool index) per level
    frontier, frontier_id = token, torch.arange(k, device=device).expand(batch, k)
    frontier_hidden = hidden[:, -1:].expand(batch, k, hidden.shape[-1])  # each frontier node's parent's output
    parent_run = None  # [B, k]: each frontier node's parent among the run nodes (None: the root)
    run_slots: list[torch.Tensor] = []
    run_ancestors = torch.zeros(batch, 0, 0, dtype=torch.bool, device=device)  # among the nodes run so far
    offset = k
    for level in range(2, levels + 1):  # run the frontier at depth level - 1: its children are at `level`
        m0 = (level - 2) * k
        ahead = frontier_positions(pos, level, k, levels)
        slots = torch.where(live, slot_of(state.block_tables, ahead, bs), torch.zeros_like(ahead))
        # Context: every key up to the root at P. A chain (k = 1) writes at its own positions (`frontier_positions`)
        # and sees them causally: the step's kernel runs it, a device kernel too; a tree's mask, the reference.
        tree = None
        if k > 1:  # each frontier node sees the nodes run so far that are its ancestors, and itself
            own = torch.arange(m0 + k, device=device)[None, None, :] == (m0 + torch.arange(k, device=device))[:, None]
            if parent_run is None:
                rows = own.expand(batch, k, m0 + k)
            else:
                inherited = run_ancestors.gather(1, parent_run[..., None].expand(batch, k, m0))  # [B, k, m0]
                rows = torch.cat([inherited, inherited.new_zeros(batch, k, k)], dim=-1) | own
            run_ancestors = torch.cat(
                [torch.cat([run_ancestors, run_ancestors.new_zeros(batch, m0, k)], dim=-1), rows], dim=1
            )
            run_slots.append(slots)
            tree = TreeRows(torch.cat(run_slots, dim=1), rows, pos + 1)
        positions = (pos + level - 1)[:, None].expand(batch, k)
        if recurrent:
            logits, hidden, states = branch_rows(draft, frontier, positions, slots, state.draft_kv, context, tree,
                                                 states, **run)  # fmt: skip
        else:
            logits, hidden = draft(
                frontier, positions, slots, state.draft_kv, context, hidden_in=frontier_hidden, tree=tree,
                **run, **drafter.forward_kwargs(draft, level - 1),
            )  # fmt: skip
        logits = processed(cfg, lanes, logits, vectors=vectors, paths=paths)
        if cfg.grammars:  # nothing under a node that ended its lane's language (an EOS) or left it (state -2)
            logits = torch.where((paths.grammar == -2)[..., None], float("-inf"), logits)
        child_score, child = draft_logprobs(cfg, logits).topk(k, dim=-1)  # [B, k, k]
        child_score = (score[..., None] + child_score).flatten(1)  # path log-probs [B, k^2]
        child = child.flatten(1)
        pool.append((child, child_score, frontier_id[..., None].expand(batch, k, k).flatten(1)))
        if level < levels:  # the k best children are the next frontier, the chain's node (index 0) first
            _, best = chain_first(child_score).topk(k, dim=-1)
            score = child_score.gather(1, best)
            frontier, frontier_id, parent_run = child.gather(1, best), offset + best, m0 + best // k
            frontier_hidden = rows_at(hidden, best // k)
            paths = child_paths(cfg, lanes, paths, best // k, frontier, vocab)
            if recurrent:  # each new frontier node continues the state of its parent, node best // k of this level
                states = parent_states(states, best // k)
        offset += k * k
    nodes, parents = select(shape, pool, masked=cfg.processing)
    # A frontier's ties may fall apart across tensor-parallel ranks: every rank drafts rank 0's tree.
    return agreed(cfg, draft, torch.cat([nodes, parents], dim=1)).chunk(2, dim=1)


def frontier_positions(pos: torch.Tensor, level: int, k: int, levels: int) -> torch.Tensor:
    """The lane positions [B, k] whose draft KV slots the frontier of `level` (its nodes at depth level - 1)
    writes: the chain's node (index 0) at its own position P + level - 1, as a chain's draft writes it, so a
    later step that verifies only the chain catches the draft up on two rows (`catch_up_length`); the other k - 1
    at scratch past the chain's, P + S + (level - 2)(k - 1) .. (future positions, overwritten before they are
    committed). Together P + 1 .. P + (S - 1) k, the positions the tree's rows may reach."""
    i = torch.arange(k, device=pos.device)
    return pos[:, None] + torch.where(i == 0, level - 1, levels + (level - 2) * (k - 1) + i - 1)


def draft_logprobs(cfg, logits: torch.Tensor) -> torch.Tensor:
    """The draft's log-probabilities over [..., V]; with processors, -inf (never drafted: `select`) where they
    masked a token, and everywhere in a row they masked whole (whose log_softmax is NaN)."""
    score = logits.log_softmax(dim=-1)
    return score.nan_to_num(nan=float("-inf")) if cfg.processing else score


def select(
    shape: TreeShape, pool: list[tuple[torch.Tensor, ...]], *, masked: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The N best candidates by path probability, the chain's S first, as a tree: tokens, parents [B, N]. Rows
    1 .. S are the chain (one node a depth), then the others by depth, then score: parents come first, and the
    window's first d + 1 rows are the chain of depth d that a shallower step verifies (`tree_depths`). masked:
    a candidate whose path log-probability is -inf (a token the processors masked, or under one) is absent."""
    n, levels = shape.nodes, shape.levels
    tokens = torch.cat([t for t, _, _ in pool], dim=1)  # [B, C]
    parents = torch.cat([p for _, _, p in pool], dim=1)
    batch, count = tokens.shape
    device = tokens.device
    depth = torch.cat([torch.full((t.shape[1],), d + 1, device=device) for d, (t, _, _) in enumerate(pool)])
    _, chosen = torch.cat([chain_first(s) for _, s, _ in pool], dim=1).topk(n, dim=1)  # best first: the chain
    rank = torch.arange(n, device=device)
    order = torch.where(rank < levels, depth[chosen] - levels - 1, depth[chosen] * n + rank).argsort(dim=1)
    chosen = chosen.gather(1, order)
    node_of = torch.full((batch, count), -1, dtype=torch.int64, device=device)
    node_of = node_of.scatter(1, chosen, torch.arange(1, n + 1, device=device).expand(batch, n))
    parent = parents.gather(1, chosen)  # pool index, -1: the root
    parent = torch.where(parent < 0, 0, node_of.gather(1, parent.clamp_min(0)))
    absent = parent < 0  # its parent tied below the cut
    if masked:
        absent |= torch.cat([s for _, s, _ in pool], dim=1).gather(1, chosen).isneginf()
    return torch.where(absent, -1, tokens.gather(1, chosen)), parent.clamp_min(0)


def chain_first(scores: torch.Tensor) -> torch.Tensor:
    """`scores` [B, C] of one level's candidates with the chain's node (index 0: the top child of the chain's
    node above, itself first in its level) ranked above every other."""
    return torch.cat([torch.full_like(scores[:, :1], float("inf")), scores[:, 1:]], dim=1)  # even a masked one's -inf
