"""`check_layout`: a state's shapes, device and dtype against the step that is to run it, checked on the host
(no device sync), so a wrong state fails before any graph runs (docs/design.md, "The state")."""

from __future__ import annotations

import torch

from fdecode.config import DecodeConfig
from fdecode.state.decode_state import DecodeState
from fdecode.state.recurrent import check_leaves


def check_layout(state: DecodeState, config: DecodeConfig, target, draft, drafter) -> None:
    """Raise unless `state` has the layout a step of `config`, `target` and `draft` (of kind `drafter`,
    `fdecode.drafts`) reads and writes."""
    if not isinstance(state, DecodeState):
        raise TypeError(f"expected a DecodeState, got {type(state).__name__}")
    cfg = config
    if tuple(state.tokens.shape) != (cfg.max_batch, cfg.W):
        raise ValueError(
            f"state.tokens is {tuple(state.tokens.shape)}, this step expects [max_batch, K+1] = "
            f"[{cfg.max_batch}, {cfg.W}]: was the state made by a step with another DecodeConfig?"
        )
    want = torch.device(cfg.device)
    have = state.tokens.device
    if have.type != want.type or (want.index is not None and have.index != want.index):
        raise ValueError(f"state is on {state.tokens.device}, the step runs on {cfg.device}")
    if state.target_kv.dtype != cfg.dtype:
        raise ValueError(f"state KV dtype {state.target_kv.dtype} differs from DecodeConfig.dtype {cfg.dtype}")
    check_leaves(state, target, draft, batch=cfg.max_batch, k=cfg.K)  # the recurrent-state layout
    widths = (("history", drafter.history_width(cfg)), ("missed", drafter.missed_width(draft, cfg)))
    for name, width in widths:
        shape = (cfg.max_batch, width)
        if tuple(getattr(state, name).shape) != shape:
            raise ValueError(
                f"state.{name} is {tuple(getattr(state, name).shape)}, this step's {drafter.kind} draft holds "
                f"{shape}: was the state made by a step with another draft or DecodeConfig?"
            )
