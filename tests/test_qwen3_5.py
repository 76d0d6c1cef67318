"""Qwen3.5 (Gated DeltaNet + gated attention), issue 16: the model against transformers' Qwen3_5ForCausalLM.

Logits parity on tiny random fp32 configs with a mix of linear and full layers, GQA and partial RoPE,
in prefill and in incremental decode from the carried recurrent state; the family's config mapping
and what it refuses. The decode step on the hybrid is in `test_qwen3_5_step.py`.
"""

from __future__ import annotations

import pytest
import torch
from support.hybrid_models import (
    PATTERNS,
    assert_prefill_logits_match,
    hf_config,
    hf_hybrid,
    paged,
    prompts,
    save_with_mtp,
)

from fdecode.models import from_hf
from fdecode.models.families.qwen3_5 import config_from_hf
from fdecode.models.hybrid import HybridModel
from fdecode.models.hybrid_config import FULL, LINEAR


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_prefill_logits_match_transformers(pattern: str) -> None:
    hf = hf_hybrid(pattern)
    model = from_hf(hf)
    assert isinstance(model, HybridModel) and model.config.layer_types == PATTERNS[pattern]
    assert_prefill_logits_match(model, hf, prompts())


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
        logits, _, snaps = model(
            seq[None, start:stop], pos, slot(pos), kv, table, block_size=n, recurrent=state, snapshots=True
        )
        torch.testing.assert_close(logits[0], expected[start:stop], rtol=0, atol=1e-4)
        state = (snaps[0][:, :, -1], snaps[1][:, :, -1])  # [B, L_lin, ...] after the last row
        start = stop


def test_mtp_layers_of_an_unexpected_shape_are_refused(tmp_path) -> None:
    save_with_mtp(tmp_path, fc_columns=7)
    with pytest.raises(ValueError, match="mtp.eh_proj.weight"):
        from_hf(tmp_path)


def test_unsupported_layer_types_and_configs_are_refused() -> None:
    hf = hf_config().to_dict()
    with pytest.raises(ValueError, match=r"unsupported layer type\(s\) \['sliding_attention'\]"):
        config_from_hf(
            {**hf, "layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]}
        )
    assert config_from_hf({**hf, "mtp_num_hidden_layers": 2}).mtp_num_layers == 2  # no longer refused (issue 16)
    with pytest.raises(ValueError, match="layer_types names 3 layers"):
        config_from_hf({**hf, "layer_types": ["linear_attention"] * 3})
    # The multimodal checkpoint's text part, and the layer pattern from full_attention_interval.
    multimodal = {"model_type": "qwen3_5", "text_config": {**hf, "layer_types": None, "full_attention_interval": 2}}
    assert config_from_hf(multimodal).layer_types == (LINEAR, FULL, LINEAR, FULL)


def test_save_hf_refuses_a_hybrid_and_says_how_to_save_it(tmp_path) -> None:
    from fdecode.models import save_hf

    with pytest.raises(ValueError, match="save_pretrained"):
        save_hf(from_hf(hf_hybrid()), tmp_path)
    assert not any(tmp_path.iterdir())  # refused before writing anything
