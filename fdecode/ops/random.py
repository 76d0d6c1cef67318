"""Counter-based randomness: Philox4x32-10 (Salmon et al., SC'11), a pure function of (key, counter)
(docs/design.md, "Invariants").

Each lane carries a `seed` (the 64-bit Philox key, seeds are in [0, 2**63)) and a
`counter` that advances once per transition (prefill or step). Transition n of a
lane reads the 128-bit counter blocks

    (index, n mod 2**32, n // 2**32, 0)        index = 0, 1, ... (4 words each)

under the lane's key, so the streams of two transitions never overlap, and numbers
depend on nothing but the lane's own seed and step count. No generator object, no
global state, no host sync. The rounds are plain int64 arithmetic (no bitwise xor
or shift), bit-identical in eager and compiled code, on every backend.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
# Philox4x32 round multipliers and key schedule (Weyl) constants, from the paper.
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10


def _xor(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a | b) - (a & b)


def _mulhilo(x: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x * c) // 2**32 and (x * c) mod 2**32 for x in [0, 2**32), via the constant's 16-bit halves.

    x * c = b * 2**16 + a with a = x * c_lo, b = x * c_hi (each < 2**48: no int64 overflow), so with
    s = a + (b mod 2**16) * 2**16 (< 2**49): hi = b // 2**16 + s // 2**32 and lo = s mod 2**32."""
    c_lo, c_hi = c & 0xFFFF, c >> 16
    a, b = x * c_lo, x * c_hi
    s = a + (b & 0xFFFF) * (1 << 16)
    hi = torch.div(b, 1 << 16, rounding_mode="floor") + torch.div(s, 1 << 32, rounding_mode="floor")
    return hi, s & MASK32


def philox(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], key: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10 of broadcastable int64 words in [0, 2**32): 4 counter words, 2 key words -> 4 words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + _W0) & MASK32, (k1 + _W1) & MASK32
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = _xor(_xor(hi1, c1), k0), lo1, _xor(_xor(hi0, c3), k1), lo0
    return c0, c1, c2, c3


def random_bits(seed: torch.Tensor, counter: torch.Tensor, size: int) -> torch.Tensor:
    """32 random bits per (lane, index): the first `size` words of the lane's stream for this transition.

    seed:    [B] int64 in [0, 2**63), the lane's key
    counter: [B] int64 >= 0, the lane's transition count
    returns: [B, size] int64 in [0, 2**32)
    """
    blocks = torch.arange(-(-size // 4), device=seed.device)[None, :]  # [1, n]
    key = ((seed & MASK32)[:, None], torch.div(seed, 1 << 32, rounding_mode="floor")[:, None])
    n_lo = (counter & MASK32)[:, None]
    n_hi = torch.div(counter, 1 << 32, rounding_mode="floor")[:, None]
    words = philox((blocks.expand(seed.shape[0], -1), n_lo, n_hi, torch.zeros_like(n_lo)), key)
    words = torch.broadcast_tensors(*words)
    return torch.stack(words, dim=-1).flatten(1)[:, :size]


def uniform(seed: torch.Tensor, counter: torch.Tensor, size: int) -> torch.Tensor:
    """[B, size] float32 uniform on the grid {0, 2**-24, ..., 1 - 2**-24} (the top 24 bits of each word).

    Every value is exact in float32 and below 1 (an offset of half a step would round the top
    value to 1.0); the sampler is built so that neither end can select a zero-probability token."""
    bits = torch.div(random_bits(seed, counter, size), 256, rounding_mode="floor")
    return bits.to(torch.float32) * (1.0 / (1 << 24))
