"""Tensor parallelism for every family the loader builds: which slice of each layer a rank keeps
(docs/design.md, "Tensor parallelism").

`shard_model(model, tp)` returns this rank's copy of a full model: its module tree is copied (the
tensors are not), then every layer kind keeps its share, by the kind's own layout:

| layer                         | column-parallel (rows split by head / channel)         | row-parallel (all-reduce) |
|-------------------------------|--------------------------------------------------------|---------------------------|
| `Attention` (Llama, GLM-4.5)  | q, k, v (and biases)                                   | o_proj                    |
| `GatedAttention` (Qwen3.5)    | q_proj (each head's [query | gate] stays together), k, v | o_proj                    |
| `GatedDeltaNet` (Qwen3.5)     | in_proj_qkv by its q / k / v segments, z, b, a; the conv | out_proj                  |
|                               | channels by the same segments; A_log, dt_bias by head  |                           |
| `FusedGatedDeltaNet` (Qwen3-Next) | in_proj_qkvz / in_proj_ba by key-head group (each group's q, k, v, z together); the conv as above | out_proj |
| `MLAttention` (DeepSeek-V3)   | q_proj / q_b_proj, kv_b_proj by head; the latent (kv_a_proj, the cache) replicated | o_proj |
| `MLP` (SwiGLU)                | gate, up                                               | down                      |
| MoE blocks (every MoE family) | each routed expert's gate / up, the shared experts'    | each expert's down; one all-reduce per block |
| embedding / LM head           | by vocabulary rows, padded to N * ceil(V / N) (`VocabParallelEmbedding` / `LMHead`) | |

Routers, norms, RoPE, the MTP heads' eh_proj / fc stay whole on every rank (the routers in float32: every
rank picks the same experts). MoE is split *inside* each expert (each rank holds 1/N of every expert's
intermediate width) rather than by whole experts: the experts run as one gather per chosen (token, slot)
pair in fixed shapes, so expert parallelism would compute every pair on every rank and mask the others'
out, while a slice inside each expert does 1/N of the work of every pair, whatever the routing (no
imbalance between ranks); the cost is smaller matmuls per expert. Recurrent and KV leaves take the rank's
shapes from `rank_config` (`DecoderLM.kv_config`).
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.layers.decoder_layer import MLP, Attention
from fdecode.models.layers.deltanet import FusedGatedDeltaNet, GatedDeltaNet
from fdecode.models.layers.gated_attention import GatedAttention
from fdecode.models.layers.mla import MLAttention
from fdecode.models.layers.moe import DeepseekMoE, Experts, QwenMoE
from fdecode.models.mtp.head import MTPHead
from fdecode.models.parallel import (
    RowParallelLinear,
    TPGroup,
    VocabParallelEmbedding,
    VocabParallelLMHead,
    vocab_shard,
)


def split_dimensions(cfg: ModelConfig) -> dict[str, int]:
    """Every dimension of `cfg` that tensor parallelism splits, by its config name."""
    dims = {"num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads}  # the vocabulary pads (`vocab_rows`)
    if cfg.intermediate_size > 0:
        dims["intermediate_size"] = cfg.intermediate_size
    for name in ("linear_num_key_heads", "linear_num_value_heads"):
        if hasattr(cfg, name):
            dims[name] = getattr(cfg, name)
    moe = getattr(cfg, "moe", None)
    if moe is not None:
        dims["moe_intermediate_size"] = moe.moe_intermediate_size
        if moe.router == "softmax" and moe.shared_expert_intermediate_size:
            dims["shared_expert_intermediate_size"] = moe.shared_expert_intermediate_size
    return dims


def check_divides(cfg: ModelConfig, size: int, *, what: str = "model") -> None:
    """Raise a ValueError naming the first split dimension of `cfg` that does not divide by `size`."""
    for name, value in split_dimensions(cfg).items():
        if value % size:
            raise ValueError(
                f"tensor parallelism over {size} ranks splits {name} of the {what}, but {name} = {value} "
                f"does not divide by {size}"
            )


def rank_config(cfg: ModelConfig, size: int) -> ModelConfig:
    """The shapes one of `size` ranks holds: its share of the attention and linear-attention heads."""
    changes = {"num_heads": cfg.num_heads // size, "num_kv_heads": cfg.num_kv_heads // size}
    for name in ("linear_num_key_heads", "linear_num_value_heads"):
        if hasattr(cfg, name):
            changes[name] = getattr(cfg, name) // size
    return dataclasses.replace(cfg, **changes)


# --------------------------------------------------------------------------- slices


def _chunk(t: torch.Tensor, dim: int, tp: TPGroup) -> torch.Tensor:
    """This rank's contiguous 1/N of `t` along `dim`, a tensor of its own (the full one may be freed)."""
    return t.chunk(tp.size, dim)[tp.rank].clone()


def _segments(t: torch.Tensor, sizes: tuple[int, ...], dim: int, tp: TPGroup) -> torch.Tensor:
    """`t` cut into consecutive segments of `sizes` along `dim`, this rank's 1/N of each, concatenated: a
    packed projection whose parts are each split by head (never the packed block as one)."""
    return torch.cat([_chunk(part, dim, tp) for part in t.split(sizes, dim=dim)], dim=dim)


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def _columns_(linear: nn.Linear, tp: TPGroup, sizes: tuple[int, ...] | None = None) -> None:
    """Keep this rank's output rows of `linear` (by `sizes` segments where the projection is packed)."""
    take = (lambda t: _chunk(t, 0, tp)) if sizes is None else (lambda t: _segments(t, sizes, 0, tp))
    linear.weight = _param(take(linear.weight))
    if linear.bias is not None:
        linear.bias = _param(take(linear.bias))
    linear.out_features = linear.weight.shape[0]


def _row_parallel(linear: nn.Linear, tp: TPGroup, *, reduce: bool = True) -> nn.Module:
    """`linear` over this rank's input columns: all-reduced (`RowParallelLinear`), or, where the caller sums
    the ranks itself (`reduce=False`, inside a MoE block), the rank's partial product alone."""
    weight = _chunk(linear.weight, 1, tp)
    if not reduce:
        partial = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        partial.weight = _param(weight)
        return partial
    with torch.device("meta"):
        row = RowParallelLinear(linear.in_features, linear.out_features, bias=linear.bias is not None, tp=tp)
    row.weight = _param(weight)
    if linear.bias is not None:
        row.bias = _param(linear.bias)  # added once, after the sum
    return row


# --------------------------------------------------------------------------- layer kinds


def _attention_(attn: Attention | GatedAttention, tp: TPGroup) -> None:
    """q (GatedAttention's [query | gate] per head: contiguous rows of a head, so a plain chunk keeps them
    together), k, v by head; o_proj row-parallel."""
    for name in ("q_proj", "k_proj", "v_proj"):
        _columns_(getattr(attn, name), tp)
    attn.o_proj = _row_parallel(attn.o_proj, tp)
    attn.num_heads //= tp.size
    attn.num_kv_heads //= tp.size


def _deltanet_(net: GatedDeltaNet, tp: TPGroup) -> None:
    """Whole key heads (and their value heads) per rank: the conv channels and in_proj_qkv by the q / k / v
    segments, Qwen3-Next's fused projections by key-head group; out_proj row-parallel."""
    key_dim, _, value_dim = net.split
    if isinstance(net, FusedGatedDeltaNet):
        _columns_(net.in_proj_qkvz, tp)  # [Hk groups of (q, k, v, z)]: whole groups per rank
        _columns_(net.in_proj_ba, tp)  # [Hk groups of (b, a)]
    else:
        _columns_(net.in_proj_qkv, tp, (key_dim, key_dim, value_dim))
        for name in ("in_proj_z", "in_proj_b", "in_proj_a"):
            _columns_(getattr(net, name), tp)
    conv = _segments(net.conv1d.weight, (key_dim, key_dim, value_dim), 0, tp)  # the regrouped q | k | v channels
    net.conv1d = nn.Conv1d(conv.shape[0], conv.shape[0], conv.shape[2], groups=conv.shape[0], bias=False, device="meta")
    net.conv1d.weight = _param(conv)
    net.A_log, net.dt_bias = _param(_chunk(net.A_log, 0, tp)), _param(_chunk(net.dt_bias, 0, tp))
    net.out_proj = _row_parallel(net.out_proj, tp)
    net.hk, net.hv = net.hk // tp.size, net.hv // tp.size
    net.split = (key_dim // tp.size, key_dim // tp.size, value_dim // tp.size)


def _mla_(attn: MLAttention, tp: TPGroup) -> None:
    """The heads' queries and their absorbed kv_b_proj slices; o_proj row-parallel; the latent replicated."""
    _columns_(attn.q_b_proj if attn.low_rank_q else attn.q_proj, tp)
    _columns_(attn.kv_b_proj, tp)
    attn.o_proj = _row_parallel(attn.o_proj, tp)
    attn.num_heads //= tp.size


def _mlp_(mlp: MLP, tp: TPGroup, *, reduce: bool = True) -> None:
    _columns_(mlp.gate_proj, tp)
    _columns_(mlp.up_proj, tp)
    mlp.down_proj = _row_parallel(mlp.down_proj, tp, reduce=reduce)


def _experts_(experts: Experts, tp: TPGroup) -> None:
    """1/N of every expert's intermediate width: its gate rows and up rows, and down's matching columns."""
    inner = experts.intermediate_size
    experts.gate_up_proj = _param(_segments(experts.gate_up_proj, (inner, inner), 1, tp))
    experts.down_proj = _param(_chunk(experts.down_proj, 2, tp))
    experts.intermediate_size = inner // tp.size


def _moe_(block: DeepseekMoE | QwenMoE, tp: TPGroup) -> None:
    """Routed and shared experts as partial sums, then one all-reduce for the block (`block.tp`)."""
    _experts_(block.experts, tp)
    _mlp_(block.shared_experts if isinstance(block, DeepseekMoE) else block.shared_expert, tp, reduce=False)
    block.tp = tp


def _shard_layers_(root: nn.Module, tp: TPGroup) -> None:
    """Every layer kind under `root` keeps this rank's share, in place (on a copy: `shard_model`)."""
    done: set[int] = set()
    for module in list(root.modules()):
        if id(module) in done:
            continue
        if isinstance(module, (DeepseekMoE, QwenMoE)):
            _moe_(module, tp)
            done |= {id(m) for m in module.modules()}
        elif isinstance(module, (Attention, GatedAttention)):
            _attention_(module, tp)
        elif isinstance(module, GatedDeltaNet):
            _deltanet_(module, tp)
        elif isinstance(module, MLAttention):
            _mla_(module, tp)
        elif isinstance(module, MLP):
            _mlp_(module, tp)


def _tree_copy(module: nn.Module) -> nn.Module:
    """A copy of `module`'s tree of modules whose parameters and buffers are the very tensors of `module`
    (sharding then replaces them on the copy; the caller's model is left whole)."""
    memo = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, memo)


def _sharded_copy(module: nn.Module, tp: TPGroup, *, aside: str) -> nn.Module:
    """A copy of `module` (`_tree_copy`) whose every layer keeps this rank's share, without the modules its
    attribute `aside` holds (a target's MTP head, sharded on its own; a head's borrowed target modules)."""
    held = getattr(module, aside)
    setattr(module, aside, None)
    try:
        sharded = _tree_copy(module)
    finally:
        setattr(module, aside, held)
    _shard_layers_(sharded, tp)
    sharded.tp = tp
    return sharded


def _check_head(head: MTPHead, tp: TPGroup) -> None:
    if getattr(head, "tp", None) is not None:
        raise ValueError("this MTP head is already sharded: pass the full head")
    check_divides(head.config, tp.size, what="MTP head")


def shard_model(model: nn.Module, tp: TPGroup) -> nn.Module:
    """This rank's tensor-parallel copy of a full decoder LM of any family (its MTP head, if any, sharded
    and bound to it): the same forward, the same logits on every rank (all-gathered)."""
    cfg, mtp = model.config, model.mtp
    if getattr(model, "tp", None) is not None or getattr(mtp, "tp", None) is not None:
        raise ValueError("this model is already sharded: pass the full model (every rank loads it whole)")
    check_divides(cfg, tp.size)
    sharded = _sharded_copy(model, tp, aside="mtp")
    with torch.device("meta"):  # the rank's rows are assigned below
        sharded.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp=tp)
        sharded.lm_head = VocabParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp=tp)
    sharded.embed_tokens.weight = _param(vocab_shard(model.embed_tokens.weight, tp))
    sharded.lm_head.weight = (
        sharded.embed_tokens.weight if cfg.tie_word_embeddings else _param(vocab_shard(model.lm_head.weight, tp))
    )
    sharded.rank_config = rank_config(cfg, tp.size)
    if mtp is not None:
        sharded.mtp = shard_head(mtp, tp).bind(sharded)
    return sharded.requires_grad_(False).eval()


def shard_head(head: MTPHead, tp: TPGroup) -> MTPHead:
    """This rank's copy of an MTP head of any family (bind it to the sharded target: its embedding and LM
    head are the target's shards)."""
    _check_head(head, tp)
    sharded = _sharded_copy(head, tp, aside="_shared")  # `_shared`: the target's modules, never copied
    sharded.kv_config = rank_config(head.kv_config, tp.size)
    return sharded.requires_grad_(False).eval()


def parallelize_pair(target: nn.Module, draft: nn.Module, drafter, tp: TPGroup) -> tuple[nn.Module, nn.Module]:
    """Shard a resolved (target, draft) pair for `fdecode.compile` (`drafter`: the draft's `fdecode.drafts.Drafter`):
    every check before any weight moves."""
    check_divides(target.config, tp.size, what="target")
    if not drafter.has_weights:  # an n-gram draft: every rank looks up the same committed tokens
        sharded = shard_model(target, tp)
        return sharded, draft.bound(sharded)  # the attention shapes of a rank's shard
    if not drafter.shares_target:
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(
                f"the draft's vocabulary ({draft.config.vocab_size}) differs from the target's "
                f"({target.config.vocab_size}): not supported with tensor parallelism yet; run with tp_size=1"
            )
        check_divides(draft.config, tp.size, what="draft")
    elif draft is not target.mtp:  # an MTP head of its own, checked before the target is sharded
        _check_head(draft, tp)
    sharded = shard_model(target, tp)
    if drafter.shares_target:  # an MTP head: its embedding and LM head are the target's shards
        return sharded, sharded.mtp if draft is target.mtp else shard_head(draft, tp).bind(sharded)
    return sharded, shard_model(draft, tp)
