"""Tensor parallelism (Megatron style): the process group and the parallel modules every family's
shards are made of (docs/design.md, "Tensor parallelism").

Each of the N ranks of a process group holds 1/N of every large weight and runs the same step on the
same state; the collectives are functional (`_c10d_functional`), so the step stays one graph.
`RowParallelLinear` ends a column-parallel / row-parallel pair with one all-reduce, the embedding and the
LM head are vocabulary-parallel (the LM head all-gathered: every rank gets the full, bit-identical
logits). Which slice of each layer kind a rank keeps: `fdecode.models.sharding`. Ranks agree by
construction; `DecodeConfig(broadcast_accepted=True)` also broadcasts every token the step derives state
from, from the group's first rank (`rank0_tokens`).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn

from fdecode.models.layers.reduce import done, summed

# The collective library each device type needs (`DecodeConfig.device` -> process group backend).
DEVICE_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


@dataclasses.dataclass(frozen=True)
class TPGroup:
    """The process group a sharded model runs in, with what its layers need as Python ints."""

    group: dist.ProcessGroup
    rank: int  # this process's rank inside `group`
    size: int  # N, ranks in `group`

    @classmethod
    def of(cls, group: dist.ProcessGroup) -> TPGroup:
        return cls(group, dist.get_rank(group), group.size())


def check_group(group: object, cfg_tp_size: int, device: str) -> TPGroup | None:
    """Validate the `tp_group` given to `fdecode.compile` against `DecodeConfig` (tp_size, device)."""
    if group is None:
        if cfg_tp_size > 1:
            raise ValueError(
                f"DecodeConfig.tp_size is {cfg_tp_size} but no process group was given: initialise "
                "torch.distributed (e.g. under torchrun) and pass fdecode.compile(..., tp_group=group)"
            )
        return None
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"tp_group must be a torch.distributed.ProcessGroup, got {type(group).__name__}")
    if group.size() != cfg_tp_size:
        raise ValueError(
            f"tp_group has {group.size()} ranks but DecodeConfig.tp_size is {cfg_tp_size}: set "
            f"DecodeConfig(tp_size={group.size()})"
        )
    device_type = torch.device(device).type
    want, have = DEVICE_BACKENDS.get(device_type), str(dist.get_backend(group))
    if want is not None and want not in have:
        raise ValueError(f"a tensor-parallel step on {device_type} needs a {want!r} process group, got {have!r}")
    return TPGroup.of(group)


def rank0_tokens(tokens: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """`tokens` as the group's rank 0 holds them, on every rank (an in-graph broadcast).

    The functional broadcast's `src` is a rank *within* `group` (not a global rank), so the
    source is 0 whatever global ranks the group holds (a DP x TP layout's group [2, 3] too)."""
    return done(funcol.broadcast(tokens, 0, tp.group))


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_r @ W_r^T) + b: the input features are split across ranks, y is replicated."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features, in_features // tp.size))  # [out, in/N]
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = summed(F.linear(x, self.weight), self.tp)
        return y if self.bias is None else y + self.bias


def vocab_rows(vocab_size: int, size: int) -> int:
    """Rows of the vocabulary each of `size` ranks holds: ceil(V / N), the last rank's padded past V."""
    return -(-vocab_size // size)


def vocab_shard(weight: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Rank r's `vocab_rows` rows of a [V, H] embedding or LM head weight (zero rows past V), a tensor of its own."""
    rows = vocab_rows(weight.shape[0], tp.size)
    part = weight[tp.rank * rows : (tp.rank + 1) * rows]
    pad = rows - part.shape[0]
    return torch.cat([part, part.new_zeros(pad, weight.shape[1])]) if pad else part.clone()


class VocabParallelEmbedding(nn.Module):
    """Rank r embeds the tokens in its vocabulary rows; the others contribute zeros to the all-reduce."""

    def __init__(self, vocab_size: int, hidden_size: int, *, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.rows = vocab_rows(vocab_size, tp.size)
        self.start = tp.rank * self.rows
        self.weight = nn.Parameter(torch.empty(self.rows, hidden_size))  # [ceil(V/N), H]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.start  # [B, Q]
        mine = (local >= 0) & (local < self.rows)
        x = F.embedding(torch.where(mine, local, 0), self.weight)  # [B, Q, H]
        return summed(torch.where(mine[..., None], x, 0), self.tp)


class VocabParallelLMHead(nn.Module):
    """Logits of this rank's vocabulary rows, all-gathered so every rank holds the full [..., V] (a vocabulary
    that does not divide by N is padded to N * ceil(V / N) rows, the padding cut off after the gather)."""

    def __init__(self, hidden_size: int, vocab_size: int, *, tp: TPGroup) -> None:
        super().__init__()
        self.tp, self.vocab_size = tp, vocab_size
        self.weight = nn.Parameter(torch.empty(vocab_rows(vocab_size, tp.size), hidden_size))  # [ceil(V/N), H]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.weight)  # [..., ceil(V/N)]
        # all_gather concatenates along dim 0, so the vocabulary goes first and comes back last.
        gathered = done(funcol.all_gather_single(local.movedim(-1, 0).contiguous(), 0, self.tp.group))  # [N*rows, ...]
        if gathered.shape[0] != self.vocab_size:
            gathered = gathered[: self.vocab_size]
        return gathered.movedim(0, -1)
