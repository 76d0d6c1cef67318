"""`fdecode.compile` leaves the caller's models as they were, and resolves dtype / device from them.

DecodeConfig's defaults (`dtype="auto"`, `device=None`) take the target's own dtype and device;
a model that already has them is shared (the very parameter objects, no second copy of the
weights), one that does not is converted in a copy. `step.config` holds the resolved values.
"""

from __future__ import annotations

import json

import pytest
import torch
from support.llama_models import hf_greedy, hf_target

import fdecode
from fdecode.models import LlamaModel, ModelConfig, MTPHead, save_hf

CFG = ModelConfig(
    vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16
)
STEP = dict(num_draft_tokens=2, max_batch=2, max_seq_len=64, block_size=8, backend="eager")
PROMPTS = [[5, 17, 33, 2, 9], [7, 3]]


def models(dtype: torch.dtype = torch.float32) -> tuple[LlamaModel, LlamaModel]:
    target = LlamaModel.random(CFG, seed=0, std=0.1, dtype=dtype)
    return target, LlamaModel.random(CFG.replace(num_layers=1), seed=1, std=0.1, dtype=dtype)


def snapshot(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name -> (the parameter object, a copy of its values)."""
    return {name: (p, p.detach().clone()) for name, p in model.named_parameters()}


def assert_unchanged(model: torch.nn.Module, before: dict) -> None:
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    for name, (param, values) in before.items():
        assert after[name] is param, name
        assert param.dtype == values.dtype and param.device == values.device, name
        assert torch.equal(param, values), name


def test_a_bf16_model_stays_bf16_and_is_shared_under_the_default_config():
    target, draft = models(torch.bfloat16)
    before, draft_before = snapshot(target), snapshot(draft)
    step = fdecode.compile(target, draft, fdecode.DecodeConfig(**STEP))
    assert_unchanged(target, before)
    assert_unchanged(draft, draft_before)
    assert step.config.dtype == torch.bfloat16 and step.config.device == "cpu"
    assert isinstance(step.config.device, str)
    # Nothing to convert: the step runs on the caller's very parameters (no second copy of the weights).
    assert step.target.embed_tokens.weight is target.embed_tokens.weight
    assert step.draft.lm_head.weight is draft.lm_head.weight
    state = step.prefill(PROMPTS, max_new_tokens=4)
    assert state.target_kv.dtype == torch.bfloat16
    step(state)
    assert_unchanged(target, before)


def test_a_second_compile_with_another_dtype_leaves_the_first_step_alone():
    target, draft = models()
    before = snapshot(target)
    first = fdecode.compile(target, draft, fdecode.DecodeConfig(**STEP))
    want = fdecode.generate(first, PROMPTS, max_new_tokens=6, progress=False)
    first_weights = snapshot(first.target)
    second = fdecode.compile(target, draft, fdecode.DecodeConfig(**STEP, dtype=torch.bfloat16))
    assert second.config.dtype == torch.bfloat16
    assert second.target.embed_tokens.weight.dtype == torch.bfloat16
    assert first.config.dtype == torch.float32
    assert_unchanged(first.target, first_weights)
    assert_unchanged(target, before)
    assert fdecode.generate(first, PROMPTS, max_new_tokens=6, progress=False) == want


def test_auto_dtype_is_the_models_and_an_explicit_dtype_converts_a_copy():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        target, draft = models(dtype)
        assert fdecode.compile(target, draft, fdecode.DecodeConfig(**STEP, dtype="auto")).config.dtype == dtype
    target, draft = models(torch.bfloat16)
    before = snapshot(target)
    step = fdecode.compile(target, draft, fdecode.DecodeConfig(**STEP, dtype=torch.float32, device="cpu"))
    assert step.config.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in step.target.parameters())
    assert all(p.dtype == torch.float32 for p in step.draft.parameters())
    torch.testing.assert_close(step.target.embed_tokens.weight, target.embed_tokens.weight.float())
    assert_unchanged(target, before)
    # RoPE frequencies stay float32 in every copy.
    assert step.target.rotary.inv_freq.dtype == torch.float32


def test_a_draft_of_another_dtype_is_converted_to_the_targets():
    target, _ = models(torch.bfloat16)
    _, draft = models(torch.float32)
    draft_before = snapshot(draft)
    step = fdecode.compile(target, draft, fdecode.DecodeConfig(**STEP))
    assert step.config.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in step.draft.parameters())
    assert_unchanged(draft, draft_before)


def test_an_mtp_head_is_neither_converted_nor_bound_in_place():
    target, _ = models(torch.bfloat16)
    head = MTPHead.random(CFG, seed=7, std=0.1, dtype=torch.float32)
    before, head_before = snapshot(target), snapshot(head)
    step = fdecode.compile(target, head, fdecode.DecodeConfig(**STEP))
    assert step.draft_kind == "mtp" and step.draft is not head
    assert head.shared is None  # the caller's head was not bound to the step's target
    assert_unchanged(head, head_before)
    assert_unchanged(target, before)
    assert all(p.dtype == torch.bfloat16 for p in step.draft.parameters())
    assert step.draft.shared[0] is step.target.embed_tokens
    step(step.prefill(PROMPTS, max_new_tokens=4))


def test_the_targets_own_mtp_head_follows_the_targets_copy():
    target, _ = models(torch.float32)
    target.mtp = MTPHead.random(CFG, seed=7, std=0.1).bind(target)
    before = snapshot(target)
    step = fdecode.compile(target, "mtp", fdecode.DecodeConfig(**STEP, dtype=torch.bfloat16))
    assert step.draft is step.target.mtp
    assert step.draft.shared == (step.target.embed_tokens, step.target.lm_head)
    assert step.target.embed_tokens.weight.dtype == torch.bfloat16
    assert target.mtp.shared[0] is target.embed_tokens  # the caller's head still reads the caller's model
    assert_unchanged(target, before)
    step(step.prefill(PROMPTS, max_new_tokens=4))


def test_a_checkpoint_folder_resolves_to_its_config_dtype(tmp_path):
    target, _ = models(torch.bfloat16)
    target.mtp = MTPHead.random(CFG, seed=7, std=0.1, dtype=torch.bfloat16).bind(target)
    save_hf(target, tmp_path)
    step = fdecode.compile(tmp_path, "mtp", fdecode.DecodeConfig(**STEP))
    assert step.config.dtype == torch.bfloat16 and step.config.device == "cpu"
    assert step.target.embed_tokens.weight.dtype == torch.bfloat16
    # Without a dtype in config.json, "auto" is float32 (as vLLM does).
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert fdecode.compile(tmp_path, "mtp", fdecode.DecodeConfig(**STEP)).config.dtype == torch.float32


def test_config_dtype_and_device_fields():
    cfg = fdecode.DecodeConfig(**STEP)
    assert cfg.dtype == "auto" and cfg.device is None
    assert fdecode.DecodeConfig(**STEP, device=torch.device("cpu")).device == "cpu"
    with pytest.raises(TypeError, match="dtype"):
        fdecode.DecodeConfig(**STEP, dtype="float32")
    with pytest.raises(TypeError, match="dtype"):
        fdecode.DecodeConfig(**STEP, dtype=torch.int64)


def test_a_transformers_model_shares_its_storage_where_dtype_and_device_match():
    """A transformers model's weights are not copied when they already have the step's dtype and device
    (the step's tensors are views of the same storage); another dtype converts a copy."""
    hf = hf_target(2)
    storage = {p.untyped_storage().data_ptr() for p in hf.parameters()}
    step = fdecode.compile(hf, hf_target(1), fdecode.DecodeConfig(**STEP))
    assert {p.untyped_storage().data_ptr() for p in step.target.parameters()} <= storage
    assert step.target.embed_tokens.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    assert step.draft.lm_head.weight.data_ptr() == hf_target(1).lm_head.weight.data_ptr()
    want = [hf_greedy(tuple(p), 6) for p in PROMPTS]
    assert fdecode.generate(step, PROMPTS, max_new_tokens=6, progress=False) == want
    converted = fdecode.compile(hf, hf_target(1), fdecode.DecodeConfig(**STEP, dtype=torch.float64))
    assert not {p.untyped_storage().data_ptr() for p in converted.target.parameters()} & storage
    assert hf.model.embed_tokens.weight.dtype == torch.float32  # the caller's model is left as it was
