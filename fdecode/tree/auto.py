"""The draft shape `DecodeConfig(draft_topk="auto")`, the default, resolves to at `fdecode.compile` (docs/design.md,
"Trees", "The default shape").

A tree pays where a verify of 4K rows costs about what one of K + 1 does: on an accelerator, which reads the weights
once for every row. There the default drafts a tree as deep as the K asked for, of 4K nodes (k = 4, S = K: on the
real Qwen2.5-Coder pair the best tree measured at S = 4, 16 nodes at k = 4, committed 1.23x the chain's tokens per
verify over 256 tokens, 12 nodes at k = 3 1.18x); its step also runs the chains of 1 .. K and a tree of (K + 4K) //
2 nodes (`fdecode.tree.shape.tree_depths`), and the Engine's depth controller chooses among them by measured cost
and acceptance, starting at the chain of K (`first_depth`). A CPU pays for every row: on this project's CPU a tree
of 6 or 8 nodes cost 1.13-1.43x the chain of 4 for 1.05-1.14x its tokens, and the 16-node tree 1.54x for 1.16x
(0.75x the tokens per second), so the default there is the chain of K, as it is where a step verifies the whole
window at every step (`adaptive_depth=False`: no controller weighs the tree) or where no tree can run
(`fdecode.tree.shape.tree_reason`).
"""

from __future__ import annotations

import dataclasses

from fdecode.tree.shape import tree_reason

TOPK = 4  # children kept per expanded node
WIDTH = 4  # nodes per level of the chain asked for


def auto_shape(target, draft, drafter, cfg):
    """(cfg, reason): `cfg` with draft_topk "auto" resolved, the chain of K or a tree of `WIDTH` x K nodes over K
    levels, and a sentence saying which and why; a config that names its k comes back as it is, reason None."""
    if cfg.draft_topk != "auto":
        return cfg, None
    k = cfg.num_draft_tokens
    chain = dataclasses.replace(cfg, draft_topk=1, draft_depth=None)
    if cfg.device_type == "cpu":
        return chain, f"draft_topk='auto' on a CPU: the chain of {k} (a CPU pays for every row a tree adds)"
    if not cfg.adaptive_depth:
        return chain, (
            f"draft_topk='auto' with adaptive_depth=False: the chain of {k} (no depth controller weighs a tree "
            "against the chains)"
        )
    nodes = WIDTH * k  # within the TOPK + (K - 1) TOPK^2 candidates for every K
    tree = dataclasses.replace(cfg, num_draft_tokens=nodes, draft_topk=TOPK, draft_depth=k)
    reason = tree_reason(target, draft, drafter, tree)
    if reason is not None:
        return chain, f"draft_topk='auto': the chain of {k}, since no tree can run ({reason})"
    return tree, (
        f"draft_topk='auto' on {cfg.device_type}: a tree of {nodes} nodes over {k} levels (k = {TOPK}), whose step "
        f"also runs the chains of 1 .. {k}; the Engine chooses among them"
    )
