"""Tiny Qwen3.5 models for the hybrid tests: transformers' Qwen3_5ForCausalLM is the oracle.

`hf_hybrid` draws every weight afresh (transformers' init zeroes the norms) at a scale where a dropped
norm offset, a swapped gate half or a wrong rotary width moves the logits far past 1e-4. Drafts:
the target itself (every draft accepted) and `near_copy` (noise on the MLPs: agrees often, not always).
"""

from __future__ import annotations

import copy
import functools
import json

import torch
import transformers
from safetensors.torch import load_file, save_file

import fdecode
from fdecode.models import from_hf
from fdecode.models.hybrid import HybridModel
from fdecode.models.hybrid_config import FULL, LINEAR
from fdecode.models.mtp.hybrid import HybridMTPHead

VOCAB = 97


PATTERNS = {
    "lin-lin-lin-full": (LINEAR, LINEAR, LINEAR, FULL),
    "full-lin-lin-full": (FULL, LINEAR, LINEAR, FULL),
}
# Also buildable, not in the parametrized set: both kinds of layer in the smallest graph (the Inductor test).
SMALL_PATTERNS = {"lin-full": (LINEAR, FULL)}


def hf_config(layer_types=PATTERNS["lin-lin-lin-full"], config_class=None, **overrides):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,  # GQA 2:1, rotary dim 4 of 16
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        layer_types=list(layer_types),
        max_position_embeddings=512,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    base.update(overrides)
    return (config_class or transformers.Qwen3_5TextConfig)(**base)


# The MoE hybrids (issue 17): 4 experts, 2 per token, a shared expert of another width; Qwen3-Next
# with a dense MLP on layer 1 (`mlp_only_layers`), so both kinds of feed-forward run.
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
FAMILIES = {
    "qwen3_5": (transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM, {}),
    "qwen3_next": (
        transformers.Qwen3NextConfig,
        transformers.Qwen3NextForCausalLM,
        {**MOE, "mlp_only_layers": [1], "norm_topk_prob": True},
    ),
    "qwen3_5_moe": (transformers.Qwen3_5MoeTextConfig, transformers.Qwen3_5MoeForCausalLM, MOE),
}


@functools.cache
def hf_hybrid(pattern: str = "lin-lin-lin-full", seed: int = 0, family: str = "qwen3_5", **overrides):
    """A random Qwen3.5 (or Qwen3-Next, Qwen3.5-MoE: `FAMILIES`) whose every weight is drawn afresh
    (transformers' init zeroes the norms)."""
    config_class, model_class, extra = FAMILIES[family]
    torch.manual_seed(seed)
    model = model_class(
        hf_config({**PATTERNS, **SMALL_PATTERNS}[pattern], config_class, **{**extra, **dict(overrides)})
    ).eval()
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


def prompts(lengths=(7, 11, 4), seed=1, vocab=VOCAB) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]


def paged(model: HybridModel, length: int):
    """One lane in block 1 of a throwaway cache (block_size = length): (kv, block_tables, slot of p)."""
    kv = model.kv_config.new_kv(2 * length, dtype=torch.float32, device="cpu")
    return kv, torch.tensor([[1]]), lambda p: length + p


NEW = 12


@functools.cache
def hf_greedy(
    prompt: tuple[int, ...], pattern: str = "full-lin-lin-full", new: int = NEW, family: str = "qwen3_5", **overrides
) -> list[int]:
    out = hf_hybrid(pattern, family=family, **overrides).generate(  # the mask: a token 0 is not padding
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
        max_new_tokens=new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def hybrid_target(pattern: str = "full-lin-lin-full", **overrides) -> HybridModel:
    return from_hf(hf_hybrid(pattern, **overrides))


def hybrid_mtp_head(target: HybridModel, seed: int = 3, layers: int = 1) -> HybridMTPHead:
    """A random MTP head of `layers` layers bound to `target` (it agrees with the target by chance only)."""
    return HybridMTPHead.random(target.config.replace(mtp_num_layers=layers), seed=seed, std=0.3).bind(target)


def near_copy(model: HybridModel, noise: float = 0.15, seed: int = 5) -> HybridModel:
    """The model with noise on its MLPs: a draft that agrees with it often, not always (mixed L)."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if ".mlp." in name:
                p.add_(noise * torch.randn(p.shape, generator=gen))
    return draft


def run(step, prompts, new=NEW, **kwargs):
    """Committed tokens per prompt and the accepted length of every (lane, step) of a live lane."""
    state = step.prefill(prompts, max_new_tokens=new, **kwargs)
    outs, lengths, out, first = [[] for _ in prompts], [], state.step_output, True
    while True:
        for lane in range(len(prompts)):
            n = int(out.num_tokens[lane])
            outs[lane] += out.tokens[lane, :n].tolist()
            if n and not first:
                lengths.append(n)
        if bool(out.finished[: len(prompts)].all()):
            return outs, lengths, state
        state, out = step(state)
        first = False


PROMPTS = [tuple(p.tolist()) for p in prompts((7, 11, 4))]


def assert_prefill_logits_match(model, hf, seqs) -> None:
    """fdecode's whole-sequence logits of each sequence equal transformers' (fp32, 1e-4), and are not near zero."""
    from fdecode.models.dense import dense_forward

    for seq in seqs:
        expected = hf(seq[None]).logits[0]
        logits, _ = dense_forward(model, seq[None])
        assert expected.abs().max() > 1.0  # the comparison is not between near-zero logits
        torch.testing.assert_close(logits[0], expected, rtol=0, atol=1e-4)


def staggered(engine, arrivals, budgets, greedy) -> tuple[dict, dict]:
    """Feed `engine` the requests `arrivals` ({tick: [prompt, ...]}) with the budgets `budgets` (in arrival
    order) and step it until it has no work; returns ({request id: tokens got}, {request id: the first
    `budget` tokens of greedy(prompt)}), which a test compares."""
    budgets = iter(budgets)
    want, got, tick = {}, {}, 0
    while tick <= max(arrivals) or engine.has_work():
        for prompt in arrivals.get(tick, []):
            budget = next(budgets)
            want[engine.add_request(list(prompt), max_new_tokens=budget)] = greedy(prompt)[:budget]
        for event in engine.step():
            got[event.request_id] = got.get(event.request_id, []) + event.new_tokens
        tick += 1
        assert tick < 200
    return got, want


def compiled(target, draft, k: int, backend: str = "eager", **changes):
    cfg = fdecode.DecodeConfig(
        **{"num_draft_tokens": k, "max_batch": 4, "max_seq_len": 64, "block_size": 4, "backend": backend, **changes}
    )
    return fdecode.compile(target, draft, cfg)


def scratch_states(model: HybridModel, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(conv [L, C, k-1], rec [L, Hv, dk, dv]) after a from-scratch forward over `tokens`."""
    n = len(tokens)
    kv, table, slot = paged(model, n)
    conv, rec = model.new_recurrent(1, 1, dtype=torch.float32, device="cpu")
    pos = torch.arange(n)[None]
    _, _, (conv, rec) = model(
        torch.tensor([tokens]), pos, slot(pos), kv, table, block_size=n, recurrent=(conv[:, :, 0], rec[:, :, 0])
    )
    return conv[0], rec[0]


CHECKPOINT_MTP = {
    "eh_proj.": "fc.",
    "enorm.": "pre_fc_norm_embedding.",
    "hnorm.": "pre_fc_norm_hidden.",
    "layers.": "layers.",
    "norm.": "norm.",
}


def checkpoint_names(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """An MTP head's tensor under its checkpoint name(s): Qwen3.5 / Qwen3-Next `mtp.*` names, and stacked
    experts split per expert (`mtp.layers.N.mlp.experts.E.{gate,up,down}_proj.weight`), as real checkpoints
    and transformers' save_pretrained write them."""
    prefix = next(p for p in CHECKPOINT_MTP if name.startswith(p))
    name = "mtp." + CHECKPOINT_MTP[prefix] + name[len(prefix) :]
    if name.endswith("experts.gate_up_proj"):
        base = name[: -len("gate_up_proj")]
        return {
            f"{base}{e}.{proj}.weight": part.contiguous()
            for e, expert in enumerate(tensor)
            for proj, part in zip(("gate_proj", "up_proj"), expert.chunk(2))
        }
    if name.endswith("experts.down_proj"):
        base = name[: -len("down_proj")]
        return {f"{base}{e}.down_proj.weight": expert.contiguous() for e, expert in enumerate(tensor)}
    return {name: tensor.contiguous()}


def save_with_mtp(
    folder,
    *,
    fc_columns: int | None = None,
    layers: int = 1,
    declared: int | None = None,
    family: str = "qwen3_5",
    drop: str | None = None,
) -> None:
    """transformers' save_pretrained of the target, plus `mtp.*` tensors of a random head of `layers`
    layers (Qwen3.5 names) and its depth (`declared`, default `layers`) in config.json, named as the
    family's checkpoints name it. fc_columns: give `mtp.fc` another input width (a bad head); drop: leave
    out this checkpoint key (a missing tensor)."""
    hf = hf_hybrid("full-lin-lin-full", family=family)
    hf.save_pretrained(folder)
    head = HybridMTPHead.random(from_hf(hf).config.replace(mtp_num_layers=layers), seed=3, std=0.3)
    weights = load_file(str(folder / "model.safetensors"))
    for name, tensor in head.state_dict().items():
        weights.update(checkpoint_names(name, tensor))
    if fc_columns is not None:
        weights["mtp.fc.weight"] = torch.zeros(weights["mtp.fc.weight"].shape[0], fc_columns)
    if drop is not None:
        del weights[drop]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    depth_key = "num_nextn_predict_layers" if family == "qwen3_next" else "mtp_num_hidden_layers"
    (folder / "config.json").write_text(json.dumps({**config, depth_key: declared or layers}))
