"""`SeedSource`: the seeds of requests that name none, agreed across tensor-parallel ranks
(docs/design.md, "Tensor parallelism").

A random lane's tokens are a pure function of its seed (`fdecode.ops.random`),
so every rank of a tensor-parallel step must give a request the same seed, or
the ranks sample different tokens, their KV caches diverge and the all-reduces
mix them. A step draws one 63-bit value of fresh entropy when it is compiled;
with a TP group, rank 0's value is broadcast to the others (host side, once).
Default seeds are then drawn from a generator seeded with it, in request order,
which every rank follows identically (each rank makes the same calls).

A seed given for a whole call (`generate(..., seed=3)` over several prompts) is a seed for the call,
not one stream shared by every lane: request i gets `derived(3, i)`, a pure function of the two (so
reproducible, and the same on every rank), different for different i. Request 0 keeps the seed itself,
so a one-prompt call draws what `Engine.add_request(..., seed=3)` draws.
"""

from __future__ import annotations

import hashlib
import random
import secrets

import torch
import torch.distributed as dist

SEED_BITS = 63  # seeds are in [0, 2**63): an int64 lane leaf, never negative


def derived(seed: int, index: int) -> int:
    """The seed of request `index` of a call given one `seed`: `seed` itself for request 0, else 63 bits
    of a BLAKE2b hash of (seed, index), so the requests of one call draw different streams (two of them
    coincide with probability 2**-63)."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"fdecode-seed:{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


class SeedSource:
    def __init__(self, tp=None, device: str = "cpu") -> None:
        """tp: the step's `TPGroup` (None: one process); device: where an NCCL broadcast stages its bytes."""
        entropy = secrets.randbits(SEED_BITS)
        if tp is not None:
            box = [entropy]
            staging = torch.device(device) if torch.device(device).type != "cpu" else None
            dist.broadcast_object_list(box, group=tp.group, group_src=0, device=staging)
            entropy = box[0]
        self._rng = random.Random(entropy)

    def draw(self) -> int:
        """A seed in [0, 2**63): the next of this step's default seeds."""
        return self._rng.getrandbits(SEED_BITS)

    def __repr__(self) -> str:
        return "SeedSource()"
