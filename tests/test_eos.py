"""The model's EOS ids are the default stop, as in transformers' `generate` (issue 18, item 1).

Oracle: transformers' `generate(do_sample=False)` with the model's default generation config (eos from
its config), on the tiny random Llama of support/llama_models.py with `eos_token_id` set to a token its greedy
continuation reaches after a few steps.
"""

from __future__ import annotations

import functools

import pytest
import torch
import transformers
from support.llama_models import hf_config, hf_greedy, hf_target, independent_draft

import fdecode
from fdecode.models import from_hf

PROMPT = [1, 3]
NEW = 20
CFG = dict(num_draft_tokens=2, max_batch=2, max_seq_len=32, block_size=4, backend="eager")


@functools.cache
def eos_ids() -> tuple[int, int]:
    """Two ids the greedy continuation reaches late enough to show a stop: the 4th and 6th new tokens
    (neither appears before)."""
    greedy = hf_greedy(tuple(PROMPT), NEW)
    first = next(i for i in range(3, NEW) if greedy[i] not in greedy[:i])
    second = next(i for i in range(first + 2, NEW) if greedy[i] not in greedy[:i])
    return greedy[first], greedy[second]


def hf_with_eos(eos) -> transformers.LlamaForCausalLM:
    """llama_models' target with `eos_token_id=eos` in its config (and so in its default generation config)."""
    model = transformers.LlamaForCausalLM(hf_config(2, eos_token_id=eos)).eval()
    model.load_state_dict(hf_target(2).state_dict())
    return model


def reference(model) -> list[int]:
    ids = torch.tensor([PROMPT])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
    return out[0, len(PROMPT) :].tolist()


def compiled(target, **changes) -> fdecode.Step:
    draft = independent_draft(
        "partial", from_hf(target) if not isinstance(target, fdecode.models.LlamaModel) else target
    )
    return fdecode.compile(target, draft, fdecode.DecodeConfig(**{**CFG, **changes}))


def test_the_models_eos_stops_generation_as_in_transformers():
    eos, _ = eos_ids()
    model = hf_with_eos(eos)
    want = reference(model)
    assert want[-1] == eos and len(want) < NEW  # transformers stops there by default
    step = compiled(model)
    assert step.config.eos_token_id == (eos,)
    assert fdecode.generate(step, [PROMPT], max_new_tokens=NEW) == [want]
    engine = fdecode.Engine(step)
    rid = engine.add_request(PROMPT, max_new_tokens=NEW)
    assert engine.run()[rid] == want
    state = step.prefill([PROMPT], max_new_tokens=NEW)
    assert state.stop_ids[0].tolist()[:1] == [eos]


def test_a_list_of_eos_ids_in_the_generation_config():
    first, second = eos_ids()
    model = hf_with_eos(second)
    model.generation_config.eos_token_id = [second, first]  # the generation config wins over config.json
    want = reference(model)
    assert want[-1] == first
    assert fdecode.generate(compiled(model), [PROMPT], max_new_tokens=NEW) == [want]


def test_a_checkpoint_folder_and_a_model_loaded_from_it_keep_the_eos(tmp_path):
    eos, _ = eos_ids()
    model = hf_with_eos(eos)
    model.save_pretrained(tmp_path)  # config.json + generation_config.json
    want = reference(model)
    assert from_hf(tmp_path).eos_token_ids == (eos,)
    for target in (str(tmp_path), from_hf(tmp_path)):
        step = compiled(target)
        assert step.config.eos_token_id == (eos,)
        assert fdecode.generate(step, [PROMPT], max_new_tokens=NEW) == [want]


def test_an_explicit_stop_overrides_and_ignore_eos_disables():
    first, second = eos_ids()
    model = hf_with_eos(first)
    step = compiled(model)
    full = hf_greedy(tuple(PROMPT), NEW)
    assert fdecode.generate(step, [PROMPT], max_new_tokens=NEW, eos_token_id=second) == [full[: full.index(second) + 1]]
    assert fdecode.generate(step, [PROMPT], max_new_tokens=NEW, ignore_eos=True) == [full]
    assert fdecode.generate(step, [PROMPT], max_new_tokens=NEW, eos_token_id=[]) == [full]
    assert fdecode.generate(step, [PROMPT], fdecode.SamplingParams(max_new_tokens=NEW, ignore_eos=True)) == [full]
    off = compiled(model, eos_token_id=None)  # no default stop for this step
    assert off.config.eos_token_id == () and fdecode.generate(off, [PROMPT], max_new_tokens=NEW) == [full]


def test_more_model_eos_ids_than_stop_slots_fail_at_compile():
    model = hf_with_eos([1, 2, 3])
    with pytest.raises(ValueError, match=r"has 3 EOS ids \[1, 2, 3\] but DecodeConfig.max_stop_ids is 2"):
        compiled(model, max_stop_ids=2)
