"""Per-expert checkpoint tensors -> the stacked layout of `fdecode.models.layers.moe.Experts`
(docs/design.md, "Mixture of experts: the MoE block, GLM-4.5, the DeepSeek-style MTP head").

Real checkpoints (and transformers' `save_pretrained`) write each routed expert apart:

    <layer>.mlp.experts.<n>.gate_proj.weight  [I, H]
    <layer>.mlp.experts.<n>.up_proj.weight    [I, H]
    <layer>.mlp.experts.<n>.down_proj.weight  [H, I]

while a live transformers model (and `Experts`) holds them fused and stacked:
`experts.gate_up_proj` [E, 2I, H] (gate rows first) and `experts.down_proj` [E, H, I]. Both load:
`expert_parts` says, for every stacked tensor the model expects and the checkpoint lacks, which
per-expert tensors make it (and raises, naming the layer and expert, when one is missing or the
checkpoint holds more experts than the config); `stack` builds it one expert at a time, so at most
one expert's tensors are read beyond the stacked result.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping

import torch

_PER_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<n>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
_STACKED = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


def expert_parts(names: Collection[str], expected: Mapping[str, torch.Size]) -> dict[str, list[tuple[str, ...]]]:
    """{stacked name: [per expert, the names concatenated along dim 0]} for each stacked expert tensor in
    `expected` (name -> shape) that `names` (the checkpoint's, in fdecode naming) does not hold as such."""
    per_expert = {m["prefix"]: set() for m in map(_PER_EXPERT.match, names) if m}
    for name in names:
        m = _PER_EXPERT.match(name)
        if m:
            per_expert[m["prefix"]].add((int(m["n"]), m["proj"]))
    parts: dict[str, list[tuple[str, ...]]] = {}
    for prefix, have in per_expert.items():
        for stacked, projs in _STACKED.items():
            name = f"{prefix}.{stacked}"
            if name not in expected or name in names:
                continue  # not an Experts tensor of this model, or given fused: the usual checks report it
            count = expected[name][0]
            extra = sorted(n for n, _ in have if n >= count)
            if extra:
                raise ValueError(f"{prefix}: the checkpoint has expert {extra[0]} but the config has {count} experts")
            for n in range(count):
                for proj in projs:
                    if (n, proj) not in have:
                        raise ValueError(
                            f"{prefix}: expert {n} is missing from the checkpoint ({prefix}.{n}.{proj}.weight)"
                        )
            parts[name] = [tuple(f"{prefix}.{n}.{proj}.weight" for proj in projs) for n in range(count)]
    return parts


def stack(
    parts: list[tuple[str, ...]],
    read: Callable[[str], torch.Tensor],
    shape: torch.Size,
    *,
    dtype: torch.dtype | None,
    device: torch.device | str | None,
) -> torch.Tensor:
    """The stacked tensor of `shape` [E, rows, cols] from per-expert tensors (`read(name)`), one expert at a time."""
    out = None
    for n, names in enumerate(parts):
        piece = torch.cat([read(name) for name in names]) if len(names) > 1 else read(names[0])
        if tuple(piece.shape) != tuple(shape[1:]):
            raise ValueError(f"{names[0]}: expert shape {tuple(piece.shape)}, the model expects {tuple(shape[1:])}")
        if out is None:
            out = torch.empty(shape, dtype=dtype or piece.dtype, device=device or piece.device)
        out[n].copy_(piece)
    return out
