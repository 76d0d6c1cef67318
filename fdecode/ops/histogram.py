"""Per-row weighted histograms (`scatter_add` semantics), the core of the radix threshold searches
(docs/design.md, "Lossless rejection sampling").

`histogram(index, weight, bins)[r, j] = sum(weight[r, v] for v where index[r, v] == j)`, with
integer weights, so the sums are the same in any order on any backend. Two ways, one meaning:

- `"scatter_add"` (NPU, CUDA, default): GE converts it (`ScatterElements`, reduction add);
  inductor on CUDA emits atomic adds, which commute for integers.
- `"scatter_reduce"` (CPU): `scatter_reduce(..., "sum")`, which inductor on CPU runs as ATen's
  loop (`config.cpp.fallback_scatter_reduce_sum`) where `scatter_add` of int32 becomes a loop of
  atomic adds, several times slower over a 152k vocabulary. GE has no converter for it.

The way is chosen per device type (`WAY`), static when the step is traced, so it costs no
branch in the graph (as the KV write's, `fdecode.ops.kv`).
"""

from __future__ import annotations

import torch

WAY = {"cpu": "scatter_reduce"}  # other device types: "scatter_add"


def way_for(device_type: str) -> str:
    return WAY.get(device_type, "scatter_add")


def histogram(index: torch.Tensor, weight: torch.Tensor, bins: int) -> torch.Tensor:
    """index: [R, V] int64 in [0, bins); weight: [R, V] integer. Returns [R, bins] of weight's dtype."""
    out = torch.zeros(index.shape[0], bins, dtype=weight.dtype, device=index.device)
    if way_for(index.device.type) == "scatter_reduce":
        return out.scatter_reduce(1, index, weight, "sum")
    return out.scatter_add(1, index, weight)
