"""Per-lane sampling filters: temperature, top-k, top-p, min-p, as fixed-shape tensor math.

Order (the usual one): probs = softmax(logits / T); keep the top-k; renormalise;
keep the smallest top set whose mass reaches top-p; keep tokens with
p >= min_p * max(p); renormalise. Per-lane parameters are tensors, so changing
them never recompiles; "off" values are k = 0, top_p = 1, min_p = 0. A lane with
T = 0 is greedy: its filtered distribution is not used (T = 1 is used to keep the
math finite).

No sort of the vocabulary. Both thresholds are found by a radix search over the
bit patterns of the (non-negative) float32 probabilities, whose integer order is
their numeric order: 8 passes of 4 bits, each pass comparing every probability
with 15 candidate thresholds in one fused reduction, finding the exact k-th
largest probability (top-k) and the exact smallest kept probability (top-p).
Ties at a threshold are all kept. Cost per filtered row: 2 x 8 reductions of
15 x V compares (no data movement, no intermediate of size V), against
O(V log V) with a full permutation for a sort; a step filters (K + 1) target rows
and K draft rows per lane. (Radix 16 rather than 2: a quarter of the sequential
reductions, which is what the compiled graph's size and compile time scale with.)
"""

from __future__ import annotations

import torch

_DIGITS = (28, 24, 20, 16, 12, 8, 4, 0)  # 4-bit digits of a non-negative float32's bit pattern


def _prob_bits(probs: torch.Tensor) -> torch.Tensor:
    return probs.contiguous().view(torch.int32).to(torch.int64)


def _radix_threshold(bits: torch.Tensor, enough) -> torch.Tensor:
    """Largest t (as bits) with enough(bits >= t) true, per row, digit by digit.

    bits: [..., V]; enough maps keep masks [..., 15, V] (one per candidate digit) to [..., 15] bool,
    monotone in the threshold, so the satisfied candidates are a prefix and their count is the digit.
    """
    t = torch.zeros_like(bits[..., :1])  # [..., 1]
    digits = torch.arange(1, 16, device=bits.device)
    for shift in _DIGITS:
        candidates = t + digits * (1 << shift)  # [..., 15]
        ok = enough(bits[..., None, :] >= candidates[..., :, None])  # [..., 15]
        t = t + ok.sum(dim=-1, keepdim=True) * (1 << shift)
    return t


def top_k_mask(probs: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[..., V] probs, [...] k (0 = off) -> [..., V] bool: the k most probable tokens (ties kept)."""
    bits = _prob_bits(probs)
    need = k[..., None]
    t = _radix_threshold(bits, lambda keep: keep.sum(dim=-1) >= need)
    return (bits >= t) | (need <= 0)


def top_p_mask(probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """[..., V] normalised probs, [...] top_p (1 = off) -> [..., V] bool: the smallest top set with mass >= p."""
    bits = _prob_bits(probs)
    need = p[..., None]
    t = _radix_threshold(bits, lambda keep: (probs[..., None, :] * keep).sum(dim=-1) >= need)
    return (bits >= t) | (need >= 1.0)


def filtered_probs(
    logits: torch.Tensor,  # [B, R, V] rows of one lane share its parameters
    temperature: torch.Tensor,  # [B] float32, 0 = greedy
    top_k: torch.Tensor,  # [B] int64, 0 = off
    top_p: torch.Tensor,  # [B] float32, 1 = off
    min_p: torch.Tensor,  # [B] float32, 0 = off
) -> torch.Tensor:
    """The distribution a lane samples from: [B, R, V] float32, each row sums to 1."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    probs = torch.softmax(logits.float() / t[:, None, None], dim=-1)
    probs = probs * top_k_mask(probs, top_k[:, None].expand(probs.shape[:2]))
    probs = probs / probs.sum(dim=-1, keepdim=True)
    probs = probs * top_p_mask(probs, top_p[:, None].expand(probs.shape[:2]))
    # max(dim) rather than amax: torchair's GE mode converts the former (ArgMaxWithValue), not the latter.
    probs = probs * (probs >= min_p[:, None, None] * probs.max(dim=-1, keepdim=True).values)
    return probs / probs.sum(dim=-1, keepdim=True)
