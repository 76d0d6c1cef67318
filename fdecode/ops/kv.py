"""Writing a forward's keys and values into the paged KV cache leaf, in place (docs/design.md, "Invariants").

The cache leaf is `kv: [num_layers, 2, num_slots, Hkv, D]` (an MLA model's latent
cache has one kind instead of keys and values: `fdecode.ops.latent_kv`); a forward's B*Q
rows of layer `layer` go to slots `slots: [B, Q]` (0 = the scratch slot, which
padding rows may write in any order). Two ways, one meaning, chosen per device type
(`KV_WRITE`, static when the step is traced):

- `"index_put"` (CPU, CUDA): one `index_put_` on the whole leaf with the index
  tuple (layer, kind, slot).
- `"scatter_nd"` (Ascend NPU): `ScatterNdUpdate(kv, indices, updates)` with
  `indices: [2*B*Q, 3]` rows (layer, kind, slot) and `updates: [2*B*Q, Hkv, D]`:
  torch_npu's `npu_scatter_nd_update_`; elsewhere the same call goes to
  `fdecode::scatter_nd_update_`, which has that op's schema and semantics.
"""

from __future__ import annotations

import torch

# The KV write each device type's step uses (others: "index_put").
KV_WRITE = {"npu": "scatter_nd"}
WAYS = ("index_put", "scatter_nd")


def kv_write_for(device_type: str) -> str:
    return KV_WRITE.get(device_type, "index_put")


@torch.library.custom_op("fdecode::scatter_nd_update_", mutates_args=("self",))
def scatter_nd_update_(self: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor) -> None:
    """`self[tuple(indices[n])] = updates[n]` for every row n of `indices: [N, depth]` (ScatterNdUpdate)."""
    self.index_put_(tuple(indices.unbind(-1)), updates)


@scatter_nd_update_.register_fake
def _(self: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor) -> None:
    return None


def _scatter_nd(kv: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor) -> None:
    if kv.device.type == "npu":
        torch.ops.npu.npu_scatter_nd_update_(kv, indices, updates)
    else:
        torch.ops.fdecode.scatter_nd_update_(kv, indices, updates)


def write_kv(
    kv: torch.Tensor,  # [num_layers, 2, num_slots, Hkv, D], written in place
    layer: int,
    slots: torch.Tensor,  # [B, Q] int64
    k: torch.Tensor,  # [B, Q, Hkv, D]
    v: torch.Tensor,  # [B, Q, Hkv, D]
    *,
    way: str = "index_put",
) -> None:
    write_rows(kv, layer, slots, torch.stack([k, v]), way=way)


def write_rows(
    kv: torch.Tensor,  # [num_layers, kinds, num_slots, H, D], written in place
    layer: int | torch.Tensor,  # or a [1] int64 tensor (`fdecode.models.regions.layer_indices`)
    slots: torch.Tensor,  # [B, Q] int64
    rows: torch.Tensor,  # [kinds, B, Q, H, D]: keys and values (2 kinds), or one latent (`fdecode.ops.latent_kv`)
    *,
    way: str = "index_put",
) -> None:
    """`kv[layer, kind, slots[b, q]] = rows[kind, b, q]` for every kind, in one write."""
    kinds, (heads, dim) = rows.shape[0], kv.shape[-2:]
    rows = rows.reshape(kinds, -1, heads, dim).to(kv.dtype)  # [kinds, B*Q, H, D]
    flat_slots = slots.reshape(1, -1)  # [1, B*Q]
    kind = torch.arange(kinds, device=slots.device)[:, None]  # [kinds, 1]: 0 = keys, 1 = values
    if way == "index_put":
        # A tensor index broadcasts; an int fills a tensor on the device (no upload from the host).
        index = layer if isinstance(layer, torch.Tensor) else torch.full_like(flat_slots, layer)
        kv.index_put_((index, kind, flat_slots), rows)
        return
    if way != "scatter_nd":
        raise ValueError(f"unknown KV write {way!r}, expected one of {WAYS}")
    grid = flat_slots.expand(kinds, -1)  # [kinds, B*Q]
    indices = torch.stack([torch.full_like(grid, layer), kind.expand_as(grid), grid], dim=-1)  # [kinds, B*Q, 3]
    _scatter_nd(kv, indices.reshape(-1, 3), rows.reshape(-1, heads, dim))
