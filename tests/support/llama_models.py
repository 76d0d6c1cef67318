"""Tiny random Llamas built in the tests; transformers is the oracle for the target's greedy output.

Draft kinds used across the step tests (the names say how well they agree with the target):
- "self":    the target's own weights (every draft is accepted),
- "partial": the target truncated to its first layer (a mixture of accepted lengths),
- "random":  unrelated random weights (almost nothing is accepted).
For MTP heads the same three are built by construction (see `mtp_head`): with the
target's embedding rows at unit RMS, `enorm(embed(t)) == embed(t)`, so an MTP head
whose `eh_proj` selects the embedding half and whose layer and norm are copies of
the target's first layer and final norm computes the target truncated to that layer.
`fresh_forward` is a from-scratch forward of such a model (or head) over one sequence.
"""

from __future__ import annotations

import functools

import torch
import transformers

from fdecode.models import LlamaModel, MTPHead, from_hf
from fdecode.ops.paging import slot_of

VOCAB = 96


def hf_config(num_layers: int = 2, **overrides) -> transformers.LlamaConfig:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    base.update(overrides)
    return transformers.LlamaConfig(**base)


@functools.cache
def hf_target(num_layers: int = 2, seed: int = 0) -> transformers.LlamaForCausalLM:
    """A random Llama whose embedding rows have unit RMS (so MTP heads can mimic it exactly)."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(hf_config(num_layers)).eval()
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.div_(emb.pow(2).mean(dim=-1, keepdim=True).sqrt())
    return model


@functools.cache
def hf_greedy(prompt: tuple[int, ...], max_new_tokens: int, eos: int | None = None, num_layers: int = 2) -> list[int]:
    """transformers' greedy continuation of one prompt (new tokens only, stop id included)."""
    model = hf_target(num_layers)
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def truncated(model: LlamaModel, num_layers: int) -> LlamaModel:
    """`model` with only its first `num_layers` decoder layers (same embedding, final norm and head)."""
    small = LlamaModel(model.config.replace(num_layers=num_layers))
    state = {
        k: v for k, v in model.state_dict().items() if not k.startswith("layers.") or int(k.split(".")[1]) < num_layers
    }
    small.load_state_dict(state)
    return small.eval()


def independent_draft(kind: str, target: LlamaModel) -> LlamaModel:
    if kind == "self":
        return truncated(target, target.config.num_layers)
    if kind == "partial":
        return truncated(target, 1)
    if kind == "random":
        return LlamaModel.random(target.config.replace(num_layers=1), seed=123, std=0.1)
    raise ValueError(kind)


def mtp_head(kind: str, target: LlamaModel) -> MTPHead:
    """MTP heads that agree with `target` fully ("self", 1-layer target), partly, or not at all."""
    head = MTPHead.random(target.config, seed=7, std=0.1).bind(target)  # compile binds a copy, not this head
    if kind == "random":
        return head
    width = target.config.hidden_size
    with torch.no_grad():
        head.enorm.weight.fill_(1.0)
        head.eh_proj.weight.zero_()
        head.eh_proj.weight[:, :width] = torch.eye(width)
        head.layer.load_state_dict(target.layers[0].state_dict())
        head.norm.load_state_dict(target.norm.state_dict())
    return head


def draft_of(draft_kind: str, kind: str, target: LlamaModel):
    """The draft of `draft_kind` ("model": a draft LM, "mtp": an MTP head, "ngram") that agrees with `target`
    as `kind` says ("self", "partial", "random")."""
    if draft_kind == "mtp":
        return mtp_head(kind, target)
    return "ngram" if draft_kind == "ngram" else independent_draft(kind, target)


def fdecode_target(num_layers: int = 2) -> LlamaModel:
    return from_hf(hf_target(num_layers))


def fresh_forward(model, seq: list[int], *, block_size: int = 4, hidden_in=None):
    """A from-scratch forward of `model` over `seq` (one lane, contiguous blocks, a fresh cache).

    Returns logits [1, n, V], hidden [1, n, H] and the KV it wrote, in position order [L, 2, n, Hkv, D].
    """
    n = len(seq)
    table = torch.arange(1, -(-n // block_size) + 1)[None]
    kv = model.kv_config.new_kv((table.shape[1] + 1) * block_size, dtype=torch.float32, device="cpu")
    positions = torch.arange(n)[None]
    slots = slot_of(table, positions, block_size)
    with torch.no_grad():
        logits, hidden = model(
            torch.tensor([seq]), positions, slots, kv, table, block_size=block_size, hidden_in=hidden_in
        )
    return logits, hidden, kv[:, :, slots[0]]
