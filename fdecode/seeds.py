"""`SeedSource`: the seeds of requests that name none, agreed across tensor-parallel ranks.

A random lane's tokens are a pure function of its seed (`fdecode.ops.random`),
so every rank of a tensor-parallel step must give a request the same seed, or
the ranks sample different tokens, their KV caches diverge and the all-reduces
mix them. A step draws one 63-bit value of fresh entropy when it is compiled;
with a TP group, rank 0's value is broadcast to the others (host side, once).
Default seeds are then drawn from a generator seeded with it, in request order,
which every rank follows identically (each rank makes the same calls).
"""

from __future__ import annotations

import random
import secrets

import torch
import torch.distributed as dist


class SeedSource:
    def __init__(self, tp=None, device: str = "cpu") -> None:
        """tp: the step's `TPGroup` (None: one process); device: where an NCCL broadcast stages its bytes."""
        entropy = secrets.randbits(63)
        if tp is not None:
            box = [entropy]
            staging = torch.device(device) if torch.device(device).type != "cpu" else None
            dist.broadcast_object_list(box, group=tp.group, group_src=0, device=staging)
            entropy = box[0]
        self._rng = random.Random(entropy)

    def draw(self) -> int:
        """A seed in [0, 2**63): the next of this step's default seeds."""
        return self._rng.getrandbits(63)

    def __repr__(self) -> str:
        return "SeedSource()"
