"""The draft tree a config asks for, and the checks that refuse one that cannot be made or run
(docs/design.md, "Trees").

`DecodeConfig(num_draft_tokens=N, draft_topk=k, draft_depth=S)`: the draft expands k nodes per level
(the frontier) and keeps k children of each, so S levels make `candidates(k, S)` = k + (S - 1) k^2 nodes, of
which the step verifies the N best by path probability. k = 1 with S = N is the chain (no tree code runs); a
tree (k > 1) needs S < N, since N levels of N nodes hold only the draft's chain, which every tree keeps first.
`check_tree_shape` runs in `DecodeConfig.__post_init__` (numbers only); `check_tree` at `fdecode.compile`,
before anything is captured, with the models in hand (the vocabulary, the model kinds, the features).
"""

from __future__ import annotations

import dataclasses

import torch


def candidates(k: int, levels: int) -> int:
    """The nodes S levels of k children per frontier node make: k at depth 1, k^2 at each deeper level."""
    return k + (levels - 1) * k * k


@dataclasses.dataclass(frozen=True)
class TreeShape:
    """What one tree step drafts for the next: `nodes` (N) in `levels` (S) levels, `topk` (k) children kept
    per expanded node. k = 1 with S = N is a chain."""

    nodes: int
    topk: int
    levels: int

    @classmethod
    def at(cls, cfg, depth: int) -> TreeShape:
        """The tree a step of `depth` drafts (`tree_depths`): a tree of `depth` nodes (the config's k and S) past
        S, the config's own at K; a chain of `depth` nodes at 1 .. S, one draft at depth 0 (the draft's catch-up
        forward proposes it anyway)."""
        if depth > cfg.levels:
            return cls(depth, cfg.draft_topk, cfg.levels)
        return cls(max(depth, 1), 1, max(depth, 1))


def tree_sizes(cfg) -> tuple[int, ...]:
    """The trees a tree step drafts, in nodes: the config's N, and one of about half way from S to N (the
    config's k and S, the best (S + N) // 2 nodes) where that is more than S, a cheaper tree the depth controller
    may take where the N-node tree's rows cost more than they add (a larger batch's verify)."""
    half = (cfg.levels + cfg.K) // 2
    return ((half,) if cfg.levels < half < cfg.K else ()) + (cfg.K,)


def tree_depths(cfg) -> tuple[int, ...]:
    """The depths a tree step runs: 0 (the target alone: the root's row, one token), 1 .. S, which verify the
    window's first depth + 1 rows (the chain of the draft, which every tree holds first) and draft a chain of
    that depth (one draft at 0); and the `tree_sizes`, which verify the window's first depth + 1 rows (at K the
    whole tree) and draft a tree of that many nodes. Each commits the target's tokens (a tree's first rows in
    topological order are a tree too, whatever drafted them)."""
    return tuple(range(cfg.levels + 1)) + tree_sizes(cfg)


def first_depth(cfg) -> int:
    """The depth a step starts at where no other depth's graph is made (`Step.first_depth`): K, except an adaptive
    tree, which starts at its chain of depth S, the step a chain config of S runs, and weighs the tree once its
    graph is made (in the background) and timed. A CPU charges for each row, so there a tree step costs more than
    its chain's, by more than the tree adds on the real pair (docs/design.md, "Trees"); an accelerator has not
    been measured: its first stream is the chain's too. With `adaptive_depth=False` every step is the tree."""
    return cfg.levels if cfg.tree and cfg.adaptive_depth else cfg.K


def check_tree_shape(cfg) -> None:
    """Raise ValueError for `draft_topk` / `draft_depth` that make no tree of `num_draft_tokens` nodes."""
    n, k, s = cfg.num_draft_tokens, cfg.draft_topk, cfg.draft_depth
    if k == "auto":  # `fdecode.tree.auto` chooses the levels too: a chain of n, or a tree as deep
        if s is not None and s != n:
            raise ValueError(
                f"DecodeConfig(num_draft_tokens={n}, draft_depth={s}) with draft_topk='auto' (the default): "
                f"draft_depth shapes a tree whose children per node you name; set draft_topk > 1 (e.g. "
                f"draft_topk=3) for a tree of {n} nodes over {s} levels, or leave draft_depth unset"
            )
        return
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"DecodeConfig.draft_topk must be 'auto' or a positive int, got {k!r}")
    if s is None:
        s = n
    elif isinstance(s, bool) or not isinstance(s, int) or s < 1:
        raise ValueError(f"DecodeConfig.draft_depth must be a positive int or None, got {s!r}")
    if s > n:
        raise ValueError(f"DecodeConfig.draft_depth={s} needs at least one node a level, but num_draft_tokens is {n}")
    if k > 1 and s == n:  # N levels of N nodes hold the draft's chain alone (a tree keeps it first)
        given = f"draft_depth={s}" if cfg.draft_depth is not None else f"draft_depth unset (= num_draft_tokens = {n})"
        levels_of = "1 level of 1 node" if n == 1 else f"{n} levels of {n} nodes"
        fix = "num_draft_tokens >= 2 and draft_depth < it" if n == 1 else "draft_depth (--draft-depth) below it"
        raise ValueError(
            f"DecodeConfig(num_draft_tokens={n}, draft_topk={k}) drafts a tree, which needs draft_depth < "
            f"num_draft_tokens, but {given}: {levels_of} are the draft's chain alone. Set {fix}, "
            f"e.g. num_draft_tokens=8, draft_topk=3, draft_depth=4; or draft_topk=1 for the chain"
        )
    if n > candidates(k, s):
        raise ValueError(
            f"DecodeConfig(num_draft_tokens={n}, draft_topk={k}, draft_depth={s}): {s} levels of {k} children per "
            f"expanded node make at most {candidates(k, s)} nodes (k + (S - 1) k^2), fewer than {n}"
            + (" (draft_topk=1 is the chain: draft_depth must equal num_draft_tokens)" if k == 1 else "")
        )


def tree_reason(target, draft, drafter, cfg) -> str | None:
    """Why a step of these models and features cannot run a tree yet (None: it can, or cfg is a chain)."""
    if not cfg.tree:
        return None
    vocab = target.config.vocab_size
    if cfg.draft_topk > vocab:
        return f"draft_topk={cfg.draft_topk} exceeds the vocabulary ({vocab} tokens)"
    from fdecode.models.hybrid import HybridModel
    from fdecode.models.llama import LlamaModel

    reason = drafter.tree_reason(draft)
    if reason is not None:
        return reason
    # The models whose forwards the tree runs: the target, and the draft where it has one (an MTP head, bound
    # to the target, was checked by its drafter). An MLA latent cache is read as any cache: the mask and key
    # slots of `TreeRows` are the `PagedContext`'s, and the accepted path moves along the leaf's slot axis.
    # Hybrid models carry per-node recurrent state.
    models = (("target", target),) + ((("draft", draft),) if drafter.forwards else ())
    for role, model in models:
        known = isinstance(model, (LlamaModel, HybridModel)) or (role == "draft" and drafter.shares_target)
        if not known:
            return f"the {role} is neither a Llama-family nor a hybrid (Qwen3.5, Qwen3-Next) model"
    # A device attention kernel takes no tree mask: a tree's forwards run the reference kernel, the chains of the
    # step the config's (`fdecode.ops.attention.paged_context`).
    return None


def kernel_reason(cfg) -> str | None:
    """Why a tree step's trees do not run on its device attention kernel (`step.attention_reason`; None for a
    chain or the reference): a device kernel reads keys by position, and only the reference takes a tree mask, so
    the forwards over tree nodes run the reference while the chains run the kernel
    (`fdecode.ops.attention.paged_context`)."""
    if not cfg.tree or cfg.attention == "torch":
        return None
    depths = " and ".join(str(d) for d in tree_sizes(cfg))
    return f"{cfg.attention} takes no tree mask: the trees' forwards (depths {depths}) run the reference, 'torch'"


def check_tree(target, draft, drafter, cfg) -> None:
    """Raise ValueError where `tree_reason` names one (before anything compiles)."""
    reason = tree_reason(target, draft, drafter, cfg)
    if reason is not None:
        raise ValueError(
            f"DecodeConfig(num_draft_tokens={cfg.num_draft_tokens}, draft_topk={cfg.draft_topk}, "
            f"draft_depth={cfg.levels}) cannot run: {reason}"
        )


def slot_reach(cfg) -> int:
    """How far past the root P a tree step writes KV slots (0 for a chain): the verify's node i at P + i, up to N,
    and the draft's frontier up to P + (S - 1) k (`fdecode.tree.draft.frontier_positions`). A node's slot lies past
    its depth, so a lane's last steps write past its budget's end nodes that can still be committed: a lane owns
    these slots too (`fdecode.prefill.lane_blocks`), else its last trees lose the nodes whose slots are past its
    blocks (absent, or drafted over the scratch slot). A chain's node past the budget is never committed."""
    return max(cfg.K, (cfg.levels - 1) * cfg.draft_topk) if cfg.tree else 0


def parents_leaf(cfg, batch: int, device) -> torch.Tensor | None:
    """`DecodeState.tree_parents` of `batch` fresh lanes: [B, W] of -1 for a tree (a root alone), None for a chain."""
    return torch.full((batch, cfg.W), -1, dtype=torch.int64, device=device) if cfg.tree else None
