"""The request features a step was compiled with, applied to logits: penalties, min_tokens, logit bias and
grammars (`fdecode.ops.processors`), switched by the `DecodeConfig` (docs/design.md, "Request features").
The verify and the drafts both go through here, so drafts propose what the target will choose."""

from __future__ import annotations

import torch

from fdecode.config import DecodeConfig
from fdecode.ops.processors import LaneVectors, Paths, Processors, process, tally


def features(cfg: DecodeConfig) -> dict[str, bool]:
    """The logit processors the step was compiled with (`fdecode.ops.processors.process`)."""
    return dict(penalties=cfg.penalties, min_tokens=cfg.min_tokens, bias=cfg.max_logit_bias > 0, grammars=cfg.grammars)


def tallied(cfg: DecodeConfig, lanes: Processors, accepted: torch.Tensor, length: torch.Tensor, vocab: int):
    """(min_left, grammar_state) after a transition's committed tokens (`fdecode.ops.processors.tally`)."""
    if not cfg.processing:
        return lanes.min_left, lanes.grammar_state
    return tally(lanes, accepted, length, penalties=cfg.penalties, grammars=cfg.grammars, vocab=vocab)


def processed(
    cfg: DecodeConfig,
    lanes: Processors,
    logits: torch.Tensor,
    prior: torch.Tensor | None = None,
    before: int = 0,
    vectors: LaneVectors | None = None,
    paths: Paths | None = None,
) -> torch.Tensor:
    """`logits` [B, R, V] as the lanes' requests change them (unchanged where the config has no processor); `paths`:
    what is in front of each row where the rows are a tree's nodes (`fdecode.tree.processing`), else `prior`."""
    if not cfg.processing:
        return logits
    return process(logits, lanes, prior, before, vectors=vectors, paths=paths, **features(cfg))
