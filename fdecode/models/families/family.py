"""`Family`: how one checkpoint family loads (docs/design.md, "Model families and the registry").

A family module in this folder declares one `Family(...)` per checkpoint layout: the mapping from a
config.json dict to its config, the mapping from checkpoint keys to fdecode names, and the classes of
its model and MTP head. `fdecode.models.registry` maps each `model_type` to its declaration; the
loader (`fdecode.models.loading.hf`) only reads that table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from torch import nn

from fdecode.models.config import ModelConfig


class Family(NamedTuple):
    """How a model family loads: its config mapping, checkpoint key mapping and module classes."""

    config_from_hf: Callable[[dict[str, object]], ModelConfig]
    rename: Callable[[str, int], str | None]  # (checkpoint key, num_layers) -> fdecode name, None = ignored
    model: Callable[[ModelConfig], nn.Module]
    mtp: Callable[[ModelConfig], nn.Module]
