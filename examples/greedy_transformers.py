"""Speculative greedy decoding of a transformers model, checked against its own `generate`.

    python examples/greedy_transformers.py

Builds a small random Llama with transformers (nothing is downloaded), uses its
first layer as the draft, and shows the captured step and its graph report.
"""

from __future__ import annotations

import torch
import transformers

import fdecode
from fdecode.models import LlamaModel, from_hf


def main() -> None:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.1,
        eos_token_id=None,
    )
    hf_model = transformers.LlamaForCausalLM(config).eval()
    target = from_hf(hf_model)
    draft = LlamaModel(target.config.replace(num_layers=1))
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if not k.startswith(("layers.1", "layers.2"))})

    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=2, max_seq_len=128, backend="auto")
    step = fdecode.compile(hf_model, draft, cfg)
    print(step)

    prompts = [[5, 6, 7, 8], [100, 200, 300]]
    ours = fdecode.generate(step, prompts, max_new_tokens=32)
    for prompt, got in zip(prompts, ours):
        ids = torch.tensor([prompt])
        ref = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
        assert got == ref[0, len(prompt) :].tolist(), "speculative output differs from transformers"
    print("greedy output identical to transformers generate:", ours[0][:12], "...")
    print(fdecode.inspect(step, step.prefill(prompts, max_new_tokens=32)))


if __name__ == "__main__":
    main()
