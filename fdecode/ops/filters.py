"""Per-lane sampling filters: temperature, top-k, top-p, min-p, as fixed-shape tensor math
(docs/design.md, "Lossless rejection sampling").

Order: probs = softmax(logits / T); keep the top-k; renormalise; keep the smallest top set whose
mass reaches top-p; keep tokens with p >= min_p * max(p); renormalise. Per-lane parameters are
tensors, so changing them never recompiles; "off" values are k = 0, top_p = 1, min_p = 0. A lane
with T = 0 is greedy: its filtered distribution is not used (T = 1 keeps the math finite).
`filtered_probs` is the specification; the step runs one of two implementations of it, chosen by
its `SamplingPlan` (`fdecode.ops.plan`): `candidate_filter` (every random lane has
1 <= top_k <= C: the top C by `fdecode.ops.topk.topk`, then everything over the C candidates) or `full_filter`
(the whole vocabulary; exact top-k / top-p thresholds by radix select, no sort).

Float-level caveats: ties at a threshold are all kept (in the candidate path only within the C
candidates); top-p mass is summed in fixed point (each probability rounded to the nearest
2**-30), and top_p * mass is rounded in float32.
"""

from __future__ import annotations

import torch

from fdecode.ops.histogram import histogram
from fdecode.ops.plan import SamplingPlan
from fdecode.ops.sampling import first_true
from fdecode.ops.topk import topk

# Temperatures below this are greedy (`SamplingParams` stores 0), as in vLLM: logits / T overflows float32
# near T = 1e-38, and the distribution is the argmax long before (a logit gap of 1e-3 at T = 1e-5 is e^100).
GREEDY_BELOW = 1e-5

_TOP = 30  # a probability's float32 bit pattern is below 2**30 (1.0 is 0x3F800000)


def digit_shifts(vocab: int) -> tuple[int, ...]:
    """The digits of the search, as shifts of the bit pattern: two 15-bit digits when the vocabulary
    has at least 2**15 tokens (2**15 bins cost less than a pass over V), else four of 8, 8, 8, 6 bits
    (a small vocabulary would pay more for 2**15 bins than for the extra passes)."""
    width = 15 if vocab >= 1 << 15 else 8
    return tuple(max(shift, 0) for shift in range(_TOP - width, -width, -width))


_FIXED = float(1 << 30)  # fixed-point unit of top-p mass: a row sums to at most 2**30 + V / 2 < 2**31 (int32)


def radix_select(bits: torch.Tensor, weight: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """Per row, the largest t with sum(weight[bits >= t]) >= need.

    bits: [R, V] int32 in [0, 2**30); weight: [R, V] int32 >= 0 whose row sums fit int32;
    need: [R] int64 in [1, weight.sum(-1)]. Returns t [R, 1] int32. Digit by digit: entries outside
    the bin found so far go to an extra bin, the histogram splits the bin into one sub-bin per
    value of the next digit (`digit_shifts`), `above` is the weight of entries past the bin, and
    the digit is the last sub-bin that still reaches need. All int32 over V, one histogram per
    digit (`fdecode.ops.histogram`): no division of int64 and no int64 tensor of V's size.
    """
    prefix = torch.zeros_like(bits[:, :1])  # [R, 1] the digits found so far
    above = torch.zeros_like(need[:, None])  # [R, 1] int64
    top = _TOP
    for shift in digit_shifts(bits.shape[-1]):
        bins = 1 << (top - shift)
        offset = bits - prefix
        inside = (offset >= 0) & (offset < (1 << top))
        digit = torch.where(inside, torch.div(offset, 1 << shift, rounding_mode="trunc"), bins)
        hist = histogram(digit.long(), weight, bins + 1)[:, :bins].long()
        suffix = hist.sum(dim=-1, keepdim=True) - hist.cumsum(dim=-1) + hist  # [R, bins] weight with digit >= d
        d = ((above + suffix) >= need[:, None]).sum(dim=-1, keepdim=True) - 1  # >= 0: the previous bin reached need
        above = above + torch.cat([suffix, torch.zeros_like(above)], dim=-1).gather(-1, d + 1)
        prefix = prefix + (d * (1 << shift)).to(torch.int32)
        top = shift
    return prefix


def _scaled(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits / T as float32 ([B, R, N], [B]); greedy lanes (T = 0) divide by 1 to keep the math finite,
    and T is at least `GREEDY_BELOW` (the host never sends less: `SamplingParams` makes it greedy), so a
    lane's row never overflows to NaN."""
    t = torch.where(temperature > 0, temperature.clamp_min(GREEDY_BELOW), torch.ones_like(temperature))
    return logits.float() / t[:, None, None]


def full_filter(
    logits: torch.Tensor,  # [B, R, V] rows of one lane share its parameters
    temperature: torch.Tensor,  # [B] float32, 0 = greedy
    top_k: torch.Tensor,  # [B] int64, 0 = off
    top_p: torch.Tensor,  # [B] float32, 1 = off
    min_p: torch.Tensor,  # [B] float32, 0 = off
    *,
    use_top_k: bool = True,  # False: every lane's top_k is taken as off (the plan knows none uses it)
    use_top_p: bool = True,  # False: every lane's top_p is taken as off
) -> torch.Tensor:
    """The distribution a lane samples from: [B, R, V] float32, each row sums to 1."""
    b, r, v = logits.shape
    probs = torch.softmax(_scaled(logits, temperature), dim=-1)
    # max(dim) rather than amax: torchair's GE mode converts the former (ArgMaxWithValue), not the latter.
    keep = probs >= min_p[:, None, None] * probs.max(dim=-1, keepdim=True).values
    if use_top_k or use_top_p:
        bits = probs.contiguous().view(torch.int32).view(b * r, v)
    in_k = None
    if use_top_k:
        k = top_k[:, None].expand(b, r).reshape(-1)
        t_k = radix_select(bits, torch.ones_like(bits), k.clamp(1, v))
        in_k = (bits >= t_k) | (k <= 0)[:, None]
        keep = keep & in_k.view(b, r, v)
    if use_top_p:
        p = top_p[:, None].expand(b, r).reshape(-1)
        mass = (probs.view(b * r, v) * _FIXED + 0.5).to(torch.int32)  # rounded to the nearest 2**-30
        mass = mass if in_k is None else torch.where(in_k, mass, 0)
        total = mass.sum(dim=-1)
        need = torch.minimum((p * total.to(torch.float32)).to(torch.int64).clamp_min(1), total)
        t_p = radix_select(bits, mass, need)
        keep = keep & ((bits >= t_p) | (p >= 1.0)[:, None]).view(b, r, v)
    probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def filtered_probs(logits, temperature, top_k, top_p, min_p) -> torch.Tensor:
    """The specification: `full_filter` with every filter on ([B, R, V] logits, [B] parameters)."""
    return full_filter(logits, temperature, top_k, top_p, min_p)


def candidate_filter(
    logits: torch.Tensor,  # [B, R, V]
    temperature: torch.Tensor,  # [B] float32
    top_k: torch.Tensor,  # [B] int64; 0 (off) or above count keeps all count candidates
    top_p: torch.Tensor,  # [B] float32
    min_p: torch.Tensor,  # [B] float32
    count: int,  # C, the candidates kept by topk
) -> tuple[torch.Tensor, torch.Tensor]:
    """The filtered distribution on the top `count` tokens: probs [B, R, C] (rows sum to 1) and ids [B, R, C].

    Exact (the spec's distribution) for lanes with 1 <= top_k <= count; for other lanes, the spec's filters
    applied to the top `count` tokens only (what drafts propose from, `fdecode.step.propose`)."""
    b, r, _ = logits.shape
    count = min(count, logits.shape[-1])
    values, ids = topk(logits, count)  # sorted, descending
    k = torch.where((top_k >= 1) & (top_k <= count), top_k, count)[:, None, None].expand(b, r, 1)
    in_k = values >= values.gather(-1, k - 1)  # ties at the k-th value are kept
    probs = torch.softmax(torch.where(in_k, _scaled(values, temperature), float("-inf")), dim=-1)
    last = first_true(probs.cumsum(dim=-1) >= top_p[:, None, None]).clamp(max=count - 1)  # [B, R]
    in_p = (probs >= probs.gather(-1, last[..., None])) | (top_p >= 1.0)[:, None, None]
    in_min = probs >= min_p[:, None, None] * probs[..., :1]
    probs = torch.where(in_k & in_p & in_min, probs, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True), ids


def filtered(
    plan: SamplingPlan, logits: torch.Tensor, temperature, top_k, top_p, min_p
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The plan's implementation: (probs, ids) on candidates, or (dense probs [B, R, V], None)."""
    if plan.candidates:
        return candidate_filter(logits, temperature, top_k, top_p, min_p, plan.candidates)
    return full_filter(logits, temperature, top_k, top_p, min_p, use_top_k=plan.top_k, use_top_p=plan.top_p), None
