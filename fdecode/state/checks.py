"""`check_layout`: a state's shapes, device and dtype against the step that is to run it, checked on the host
(no device sync), so a wrong state fails before any graph runs (docs/design.md, "The state")."""

from __future__ import annotations

import torch

from fdecode.config import DecodeConfig
from fdecode.state.decode_state import DecodeState
from fdecode.state.recurrent import check_leaves, draft_copies


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
    check_leaves(state, target, draft, batch=cfg.max_batch, k=draft_copies(cfg))  # the recurrent-state layout
    present = {  # the optional leaves this step's state holds (`fdecode.state.parts`)
        "penalties": cfg.penalties,
        "bias_ids": cfg.max_logit_bias > 0,
        "grammar_state": cfg.grammars,
        "history": drafter.history_width(cfg) > 0,
        "missed": drafter.missed_width(draft, cfg) > 0,
        "tree_parents": cfg.tree,
    }
    for name, wanted in present.items():
        if (getattr(state, name) is not None) != wanted:
            have, want = ("absent", "holds it") if wanted else ("present", "has none")
            raise ValueError(
                f"state.{name} is {have}, this step ({drafter.kind} draft, its DecodeConfig's features) {want}: "
                f"was the state made by a step with another draft or DecodeConfig?"
            )
    widths = (("history", drafter.history_width(cfg)), ("missed", drafter.missed_width(draft, cfg)))
    for name, width in widths:
        shape = (cfg.max_batch, width)
        if width and tuple(getattr(state, name).shape) != shape:
            raise ValueError(
                f"state.{name} is {tuple(getattr(state, name).shape)}, this step's {drafter.kind} draft holds "
                f"{shape}: was the state made by a step with another draft or DecodeConfig?"
            )
