"""The compute floor of a compiled fdecode step: what its forwards alone cost
(docs/design.md, "Benchmarks, assets and tools").

One compiled target forward over the K + 1 tokens a step verifies, plus K compiled draft forwards
(the first over two tokens, the others over one), each timed in isolation on the step's own models,
KV caches and window, and captured the way the step is (inductor, or inductor + CUDA graphs). With an
n-gram draft the lookup has no forward and the floor is the verify alone. `fdecode bench` reports the
floor beside the step's time, and the overhead fraction 1 - floor / step: what the step spends
outside its model forwards (drafting control, acceptance, KV bookkeeping, launches).
"""

from __future__ import annotations

import torch

from fdecode.bench.timing import median_run
from fdecode.graphs.backends import capture
from fdecode.graphs.pure import fresh_code


def compute_floor(step, reps: int) -> float:
    """Seconds for one compiled target forward over W tokens plus K compiled draft forwards."""
    cfg = step.config
    state = step.prefill([[1] * 4] * cfg.max_batch, max_new_tokens=8)
    b, w, bs = cfg.max_batch, cfg.W, cfg.block_size
    window = cfg.bucket_for(step.schedule.record(state).max_position)  # the window the step attends over
    tables = state.block_tables[:, :window]

    def target_forward(t, p, s):
        return step.target(t, p, s, state.target_kv, tables, block_size=bs, attention=cfg.attention)

    def draft_forward(t, p, s, h):
        return step.draft(t, p, s, state.draft_kv, tables, block_size=bs, hidden_in=h, attention=cfg.attention)

    # Own code objects per call, so floors of many configurations never hit Dynamo's recompile limit;
    # captured like the step (inductor, or inductor + CUDA graphs).
    target = capture(step.backend, fresh_code(target_forward, "floor_target"), cfg)
    draft = capture(step.backend, fresh_code(draft_forward, "floor_draft"), cfg)
    tok_w, pos_w = state.tokens.clamp_min(0), state.base_pos[:, None] + torch.arange(w, device=state.base_pos.device)
    slots_w = torch.zeros_like(pos_w)
    h2 = torch.zeros(b, 2, step.target.config.hidden_size, dtype=cfg.dtype, device=state.tokens.device)
    tok2, pos2 = state.tokens[:, :2], pos_w[:, :2]
    tok1, pos1 = state.tokens[:, :1], pos_w[:, :1]
    with torch.no_grad():
        t = median_run(lambda: target(tok_w, pos_w, slots_w), reps * 5)[0]
        if not step.drafter.forwards:  # the lookup has no forward: the floor is the verify
            return t
        d0 = median_run(lambda: draft(tok2, pos2, torch.zeros_like(pos2), h2), reps * 5)[0]
        d1 = median_run(lambda: draft(tok1, pos1, torch.zeros_like(pos1), h2[:, :1]), reps * 5)[0]
    return t + d0 + (cfg.K - 1) * d1
