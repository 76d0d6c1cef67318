"""How a draft turns its logits into proposals: a token and its distribution q per lane, the padding of a
window where nothing is proposed, point masses for drafts without a distribution, and rank 0's choice under
tensor parallelism (docs/design.md, "The iteration")."""

from __future__ import annotations

import torch

from fdecode.models.parallel import rank0_tokens
from fdecode.ops.filters import candidate_filter, filtered
from fdecode.ops.plan import SamplingPlan
from fdecode.ops.sampling import dense, sample


def agreed(cfg, model, tokens: torch.Tensor) -> torch.Tensor:
    """`tokens` as tensor-parallel rank 0 has them (`broadcast_accepted`, the catch-all for
    non-deterministic kernels), else unchanged: every rank derives its state from the same tokens."""
    return rank0_tokens(tokens, model.tp) if cfg.broadcast_accepted else tokens


def propose(
    state, logits: torch.Tensor, u: torch.Tensor | None, j: int, plan: SamplingPlan, candidates: int
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


def unproposed(state, draft_u: torch.Tensor | None, start: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The window's drafts start + 1 .. K where nothing is proposed: -1 each, and q [B, K - start, V] all zeros
    (a greedy-only step, `draft_u` None, passes the state's q on: never read)."""
    batch, k = state.draft_probs.shape[:2]
    drafts = [state.tokens.new_full((batch,), -1) for _ in range(start, k)]
    q = state.draft_probs[:, start:]
    return drafts, q if draft_u is None else torch.zeros_like(q)


def point_masses(proposals: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, K, V] float32: q = 1 on each proposed token, an all-zero row where none was proposed (-1)."""
    hot = torch.nn.functional.one_hot(proposals.clamp_min(0), vocab).to(torch.float32)
    return hot * (proposals >= 0)[..., None]
