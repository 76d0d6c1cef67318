"""Qwen3.5 (Gated DeltaNet + gated attention): logits parity with transformers' Qwen3_5ForCausalLM.

Tiny random fp32 configs with a mix of linear and full layers, GQA and partial RoPE; every
parameter is re-drawn at a scale where a dropped norm offset, a swapped gate half or a wrong
rotary width moves the logits by far more than the 1e-4 tolerance.
"""

from __future__ import annotations

import functools

import pytest
import torch
import transformers

from fdecode.models import from_hf
from fdecode.models.dense import dense_forward
from fdecode.models.hybrid import HybridModel
from fdecode.models.hybrid_config import FULL, LINEAR

VOCAB = 97
PATTERNS = {
    "lin-lin-lin-full": (LINEAR, LINEAR, LINEAR, FULL),
    "full-lin-lin-full": (FULL, LINEAR, LINEAR, FULL),
}


def hf_config(layer_types=PATTERNS["lin-lin-lin-full"], **overrides) -> transformers.Qwen3_5TextConfig:
    base = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,  # GQA 2:1, rotary dim 4 of 16
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        layer_types=list(layer_types), max_position_embeddings=512, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    base.update(overrides)
    return transformers.Qwen3_5TextConfig(**base)


@functools.lru_cache(maxsize=None)
def hf_hybrid(pattern: str = "lin-lin-lin-full", seed: int = 0, **overrides) -> transformers.Qwen3_5ForCausalLM:
    """A random Qwen3.5 whose every weight is drawn afresh (transformers' init zeroes the norms)."""
    torch.manual_seed(seed)
    model = transformers.Qwen3_5ForCausalLM(hf_config(PATTERNS[pattern], **dict(overrides))).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.05, 1.0, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def prompts(lengths=(7, 11, 4), seed=1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen) for n in lengths]


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_prefill_logits_match_transformers(pattern: str) -> None:
    hf = hf_hybrid(pattern)
    model = from_hf(hf)
    assert isinstance(model, HybridModel) and model.config.layer_types == PATTERNS[pattern]
    for seq in prompts():
        expected = hf(seq[None]).logits[0]
        logits, _ = dense_forward(model, seq[None])
        assert expected.abs().max() > 1.0  # the comparison is not between near-zero logits
        torch.testing.assert_close(logits[0], expected, rtol=0, atol=1e-4)


def paged(model: HybridModel, length: int):
    """One lane in block 1 of a throwaway cache (block_size = length): (kv, block_tables, slot of p)."""
    kv = model.kv_config.new_kv(2 * length, dtype=torch.float32, device="cpu")
    return kv, torch.tensor([[1]]), lambda p: length + p


@pytest.mark.parametrize("chunk", [1, 3])
def test_incremental_decode_matches_transformers(chunk: int) -> None:
    """Prefill 5 tokens, then feed the rest `chunk` rows at a time from the carried (conv, rec) state."""
    hf = hf_hybrid("full-lin-lin-full")
    model = from_hf(hf)
    seq = prompts((17,))[0]
    expected = hf(seq[None]).logits[0]  # [17, V]
    n = len(seq)
    kv, table, slot = paged(model, n)
    conv, rec = model.new_recurrent(1, 1, dtype=torch.float32, device="cpu")
    state = (conv[:, :, 0], rec[:, :, 0])
    start = 0
    for stop in [5, *range(5 + chunk, n, chunk), n]:
        pos = torch.arange(start, stop)[None]
        logits, _, snaps = model(seq[None, start:stop], pos, slot(pos), kv, table, block_size=n, recurrent=state,
                                 snapshots=True)
        torch.testing.assert_close(logits[0], expected[start:stop], rtol=0, atol=1e-4)
        state = (snaps[0][:, :, -1], snaps[1][:, :, -1])  # after the last row
        start = stop
