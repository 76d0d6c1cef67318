"""`Float32Module`: a module whose floating weights stay float32 whatever the model's dtype
(docs/design.md, "Mixture of experts: the MoE block, GLM-4.5, the DeepSeek-style MTP head").

transformers keeps DeepSeek-V3's and GLM-4.5's MoE routers in float32 in a bf16 model
(`_keep_in_fp32_modules_strict = ["e_score_correction_bias", "gate.weight"]`): the expert choice is a
top-k over the router's scores, and a router weight rounded to bf16 sends some tokens to other
experts. A `Float32Module`'s floating parameters and buffers stay float32 through `Module.to` /
`.half()` / `.bfloat16()` (only the device follows), through loading (`fdecode.models.loading.hf`) and
through the copy a step makes of a model (`fdecode.models.resolve.owned`).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain

import torch
from torch import nn


class Float32Module(nn.Module):
    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Float32Module:
        def device_only(t: torch.Tensor) -> torch.Tensor:
            moved = fn(t)
            return moved if not t.is_floating_point() or moved.dtype == t.dtype else t.to(device=moved.device)

        return super()._apply(device_only, recurse)


def float32_names(model: nn.Module) -> set[str]:
    """State-dict names of the floating tensors that `model` keeps in float32 (those of its `Float32Module`s)."""
    return {
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        if isinstance(module, Float32Module)
        for name, t in chain(module.named_parameters(), module.named_buffers())
        if t.is_floating_point()
    }


def dtype_in(module: nn.Module, dtype: torch.dtype) -> torch.dtype:
    """The dtype `module`'s own floating tensors take in a model of `dtype`."""
    return torch.float32 if isinstance(module, Float32Module) else dtype
