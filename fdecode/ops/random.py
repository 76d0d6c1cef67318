"""Counter-based randomness, JAX style: a pure function of (seed, counter, index).

Each lane carries a 32-bit `seed` and a `counter` that advances once per
transition (prefill or step). A transition draws all its numbers in one call:

    lane = hash(seed + counter * 0x9E3779B9)        (a bijection of counter for a fixed seed)
    bits = hash(lane + index)                       (index 0 .. size-1, 32-bit words)

so a lane's numbers depend on nothing but its own seed and step count: not on
the other lanes, the batch size, the backend or the device. There is no
generator object, no global state and no host sync. The hash is a bijection of
32-bit words, so the numbers of one transition never repeat within it. Two
levels of hashing only: Inductor inlines the whole chain into one kernel, and
every extra level multiplies its expression size (and compile time) by ~30.

The hash is Chris Wellons' `lowbias32` (xor-shift / multiply rounds). It is
written in plain int64 arithmetic that every backend lowers exactly: products
are split into 16-bit limbs so no intermediate exceeds 2**49, shifts are
floor divisions / multiplications by powers of two, and xor is
`(a | b) - (a & b)`. (Ascend GE graphs have no converters for bitwise xor and
shifts; this form needs neither, and is bit-identical in eager and compiled code.)
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x846CA68B
_GOLDEN = 0x9E3779B9  # odd: counter -> counter * _GOLDEN is a bijection mod 2**32


def _xor(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a | b) - (a & b)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32), via 16-bit limbs (no int64 overflow)."""
    lo, hi = x & 0xFFFF, torch.div(x, 65536, rounding_mode="floor")
    return (lo * c + ((hi * (c & 0xFFFF)) & 0xFFFF) * 65536) & MASK32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of int64 values in [0, 2**32) -> int64 in [0, 2**32)."""
    x = _xor(x, torch.div(x, 1 << 16, rounding_mode="floor"))
    x = _mul32(x, _M1)
    x = _xor(x, torch.div(x, 1 << 15, rounding_mode="floor"))
    x = _mul32(x, _M2)
    return _xor(x, torch.div(x, 1 << 16, rounding_mode="floor"))


def random_bits(seed: torch.Tensor, counter: torch.Tensor, size: int) -> torch.Tensor:
    """32 random bits per (lane, index).

    seed:    [B] int64 in [0, 2**32)
    counter: [B] int64, the lane's transition count
    returns: [B, size] int64 in [0, 2**32)
    """
    lane = hash32((seed + counter * _GOLDEN) & MASK32)  # [B]
    index = torch.arange(size, device=seed.device)
    return hash32((lane[:, None] + index) & MASK32)


def uniform(seed: torch.Tensor, counter: torch.Tensor, size: int) -> torch.Tensor:
    """[B, size] float32 uniform in (0, 1): the top 24 bits, offset by half a step so 0 never occurs."""
    bits = torch.div(random_bits(seed, counter, size), 256, rounding_mode="floor")
    return (bits.to(torch.float32) + 0.5) * (1.0 / (1 << 24))
