"""The Qwen3-Next family (`qwen3_next`, Qwen3NextForCausalLM): config mapping, key mapping, layer pattern
(docs/design.md, "Hybrid models: Qwen3.5, Qwen3-Next, Qwen3.5-MoE and the recurrent state").

Qwen3.5's hybrid (`fdecode.models.families.qwen3_5`: the same layer pattern, offset RMSNorms, gated attention
with partial RoPE, Gated DeltaNet, checkpoint key names, MTP head under `mtp.*`) with two differences:

- the DeltaNet projections are fused, `in_proj_qkvz` and `in_proj_ba`, each laid out per key head
  (`deltanet.FusedGatedDeltaNet`, transformers' `fix_query_key_value_ordering`);
- the feed-forward is the Qwen MoE (`moe.QwenMoE`: softmax top-k, renormalised when `norm_topk_prob`,
  plus the shared expert scaled by sigmoid(shared_expert_gate(x))) on every `decoder_sparse_step`-th
  layer not in `mlp_only_layers`, the dense MLP elsewhere (all dense with `num_experts` 0); the MTP
  head's layers follow the same rule by their own index, as in vLLM.

Checkpoints name their MTP depth `num_nextn_predict_layers`.
"""

from __future__ import annotations

from fdecode.models.families.family import Family
from fdecode.models.families.qwen3_5 import hybrid_fields, rename
from fdecode.models.hybrid import HybridModel
from fdecode.models.hybrid_config import HybridConfig
from fdecode.models.moe_config import softmax_moe_from_hf
from fdecode.models.mtp.hybrid import HybridMTPHead


def config_from_hf(hf: dict[str, object]) -> HybridConfig:
    """HybridConfig from a Qwen3-Next config.json dict."""
    return HybridConfig(
        **hybrid_fields(hf),
        model_type="qwen3_next",
        fused_qkvz=True,
        moe=softmax_moe_from_hf(hf) if int(hf.get("num_experts") or 0) else None,
        mlp_only_layers=tuple(int(i) for i in hf.get("mlp_only_layers") or ()),
        decoder_sparse_step=int(hf.get("decoder_sparse_step") or 1),
    )


QWEN3_NEXT = Family(config_from_hf, rename, HybridModel, HybridMTPHead)
