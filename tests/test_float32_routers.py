"""DeepSeek-V3 / GLM-4.5 MoE routers stay float32 in a bf16 model, as transformers keeps them.

transformers' `_keep_in_fp32_modules_strict = ["e_score_correction_bias", "gate.weight"]`: a bf16
`from_pretrained` holds both routers' tensors in float32, and the expert choice (a top-k of their scores)
depends on it. The oracle is a model transformers itself loaded from the same folder in bf16.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from support.deepseek_models import hf_deepseek, random_mtp_state, save_with_mtp
from support.glm_models import hf_glm, save_glm

import fdecode
from fdecode.models import from_hf
from fdecode.models.layers.routing import SigmoidRouter

ROWS = 4096


def routers(model: torch.nn.Module) -> dict[str, SigmoidRouter]:
    return {name: m for name, m in model.named_modules() if isinstance(m, SigmoidRouter)}


def saved(kind: str, folder) -> transformers.PreTrainedModel:
    """A float32 checkpoint folder with an MTP head, and transformers' bf16 model of it."""
    if kind == "deepseek_v3":
        save_with_mtp(folder, random_mtp_state())
        cls = transformers.DeepseekV3ForCausalLM
    else:
        save_glm(folder)
        cls = transformers.Glm4MoeForCausalLM
    return cls.from_pretrained(folder, dtype=torch.bfloat16).eval()


@pytest.mark.parametrize("kind", ["deepseek_v3", "glm4_moe"])
def test_a_bf16_model_routes_as_transformers_bf16_model(kind, tmp_path):
    hf = saved(kind, tmp_path)
    hf_gate = hf.model.layers[-1].mlp.gate
    assert hf_gate.weight.dtype == torch.float32  # transformers' own rule, which fdecode follows
    model = from_hf(tmp_path, dtype=torch.bfloat16)
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    ours = routers(model)
    assert any(name.startswith("mtp.") for name in ours)  # the MTP head's MoE layers too
    for name, router in ours.items():
        assert router.weight.dtype == router.e_score_correction_bias.dtype == torch.float32, name
    last = len(model.layers) - 1
    gate = ours[f"layers.{last}.mlp.gate"]
    assert torch.equal(gate.weight, hf_gate.weight)
    assert torch.equal(gate.e_score_correction_bias, hf_gate.e_score_correction_bias)
    # The same bf16 hidden rows pick the same experts with the same weights.
    x = torch.randn(ROWS, hf.config.hidden_size, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    weights, experts = gate(x)
    _, hf_weights, hf_experts = hf_gate(x)
    order, hf_order = experts.sort(dim=-1), hf_experts.sort(dim=-1)
    assert torch.equal(order.values, hf_order.values)
    assert torch.equal(weights.gather(-1, order.indices), hf_weights.gather(-1, hf_order.indices))
    # A step's own copies keep them: of the folder's model with its MTP head, and of the live transformers model.
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=1, max_seq_len=32, block_size=4, backend="eager")
    for target, draft in ((model, "mtp"), (hf, hf)):
        step = fdecode.compile(target, draft, cfg)
        assert step.config.dtype == torch.bfloat16
        for module in (step.target, step.draft):
            for name, router in routers(module).items():
                assert router.weight.dtype == router.e_score_correction_bias.dtype == torch.float32, name
        assert torch.equal(routers(step.target)[f"layers.{last}.mlp.gate"].weight, hf_gate.weight)


def test_a_step_in_bf16_over_a_float32_model_keeps_the_routers_unrounded():
    """`DecodeConfig(dtype=bf16)` converts a copy of a float32 model: every router keeps its float32 values."""
    model = from_hf(hf_glm())
    step = fdecode.compile(
        model,
        model,
        fdecode.DecodeConfig(
            num_draft_tokens=2, max_batch=1, max_seq_len=32, block_size=4, backend="eager", dtype=torch.bfloat16
        ),
    )
    assert step.target.embed_tokens.weight.dtype == torch.bfloat16
    for name, router in routers(step.target).items():
        assert torch.equal(router.weight, routers(model)[name].weight), name  # float32, equal values


def test_to_bf16_and_random_bf16_models_keep_float32_routers():
    model = from_hf(hf_deepseek()).to(torch.bfloat16)
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.equal(routers(model)["layers.1.mlp.gate"].weight, hf_deepseek().model.layers[1].mlp.gate.weight)
    made = type(model).random(model.config, seed=0, dtype=torch.bfloat16)
    assert routers(made) and all(r.weight.dtype == torch.float32 for r in routers(made).values())
