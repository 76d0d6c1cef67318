"""Tensor parallelism (Megatron style) for the Llama family and the MTP head, sharded at load time
(docs/design.md, "Tensor parallelism").

Each of the N ranks of a process group holds 1/N of every large weight and runs the same step on the
same state; the collectives are functional (`_c10d_functional`), so the step stays one graph. q/k/v
and gate/up are column-parallel, o and down row-parallel (all-reduce), the embedding and the LM head
vocabulary-parallel (the LM head all-gathered: every rank gets the full, bit-identical logits), the
KV cache split by heads (`kv_config` is the per-rank shape), norms, RoPE and the MTP eh_proj
replicated. Ranks agree by construction; `DecodeConfig(broadcast_accepted=True)` also broadcasts
every token the step derives state from, from the group's first rank (`rank0_tokens`).

Loading: every rank reads the whole checkpoint (`from_hf`), then keeps its slices
(`shard_state_dict`); the full weights are freed unless the caller holds them.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn

from fdecode.models.config import ModelConfig
from fdecode.models.layers.decoder_layer import DecoderLayer
from fdecode.models.llama import LlamaModel
from fdecode.models.mtp.head import MTPHead

# The collective library each device type needs (`DecodeConfig.device` -> process group backend).
DEVICE_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
# How each weight is split, by name suffix: dim 0 = output rows (column-parallel, and the
# vocabulary rows of embedding / LM head), dim 1 = input columns (row-parallel). Others are replicated.
SHARD_DIM = {
    **dict.fromkeys(
        ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias",
         "gate_proj.weight", "up_proj.weight", "embed_tokens.weight", "lm_head.weight"),
        0,
    ),
    **dict.fromkeys(("o_proj.weight", "down_proj.weight"), 1),
}


@dataclasses.dataclass(frozen=True)
class TPGroup:
    """The process group a sharded model runs in, with what its layers need as Python ints."""

    group: dist.ProcessGroup
    rank: int  # this process's rank inside `group`
    size: int  # N, ranks in `group`

    @classmethod
    def of(cls, group: dist.ProcessGroup) -> TPGroup:
        return cls(group, dist.get_rank(group), group.size())


def check_shardable(cfg: ModelConfig, size: int, *, what: str = "model") -> None:
    """Raise a ValueError unless every split dimension of `cfg` divides by the TP size."""
    for name in ("num_heads", "num_kv_heads", "vocab_size", "intermediate_size"):
        value = getattr(cfg, name)
        if value % size:
            raise ValueError(
                f"tensor parallelism over {size} ranks splits {name} of the {what}, but {name} = {value} "
                f"does not divide by {size}"
            )


def check_group(group: object, cfg_tp_size: int, device: str) -> TPGroup | None:
    """Validate the `tp_group` given to `fdecode.compile` against `DecodeConfig` (tp_size, device)."""
    if group is None:
        if cfg_tp_size > 1:
            raise ValueError(
                f"DecodeConfig.tp_size is {cfg_tp_size} but no process group was given: initialise "
                "torch.distributed (e.g. under torchrun) and pass fdecode.compile(..., tp_group=group)"
            )
        return None
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"tp_group must be a torch.distributed.ProcessGroup, got {type(group).__name__}")
    if group.size() != cfg_tp_size:
        raise ValueError(
            f"tp_group has {group.size()} ranks but DecodeConfig.tp_size is {cfg_tp_size}: set "
            f"DecodeConfig(tp_size={group.size()})"
        )
    device_type = torch.device(device).type
    want, have = DEVICE_BACKENDS.get(device_type), str(dist.get_backend(group))
    if want is not None and want not in have:
        raise ValueError(f"a tensor-parallel step on {device_type} needs a {want!r} process group, got {have!r}")
    return TPGroup.of(group)


def _done(t: torch.Tensor) -> torch.Tensor:
    """The plain result of a functional collective. Traced, it already is one (followed by a
    `wait_tensor` node); in eager mode it is an AsyncCollectiveTensor, which must not leak into
    the state or the caller's logits, so wait for it here."""
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def rank0_tokens(tokens: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """`tokens` as the group's rank 0 holds them, on every rank (an in-graph broadcast).

    The functional broadcast's `src` is a rank *within* `group` (not a global rank), so the
    source is 0 whatever global ranks the group holds (a DP x TP layout's group [2, 3] too)."""
    return _done(funcol.broadcast(tokens, 0, tp.group))


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_r @ W_r^T) + b: the input features are split across ranks, y is replicated."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features, in_features // tp.size))  # [out, in/N]
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _done(funcol.all_reduce(F.linear(x, self.weight), "sum", self.tp.group))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rank r embeds the tokens in its vocabulary rows; the others contribute zeros to the all-reduce."""

    def __init__(self, vocab_size: int, hidden_size: int, *, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.rows = vocab_size // tp.size
        self.start = tp.rank * self.rows
        self.weight = nn.Parameter(torch.empty(self.rows, hidden_size))  # [V/N, H]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.start  # [B, Q]
        mine = (local >= 0) & (local < self.rows)
        x = F.embedding(torch.where(mine, local, 0), self.weight)  # [B, Q, H]
        return _done(funcol.all_reduce(torch.where(mine[..., None], x, 0), "sum", self.tp.group))


class VocabParallelLMHead(nn.Module):
    """Logits of this rank's vocabulary rows, all-gathered so every rank holds the full [..., V]."""

    def __init__(self, hidden_size: int, vocab_size: int, *, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(vocab_size // tp.size, hidden_size))  # [V/N, H]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.weight)  # [..., V/N]
        # all_gather concatenates along dim 0, so the vocabulary goes first and comes back last.
        gathered = _done(funcol.all_gather_single(local.movedim(-1, 0).contiguous(), 0, self.tp.group))  # [V, ...]
        return gathered.movedim(0, -1)


def local_config(cfg: ModelConfig, size: int) -> ModelConfig:
    """The per-rank shape of the attention (what this rank's KV cache holds)."""
    return cfg.replace(num_heads=cfg.num_heads // size, num_kv_heads=cfg.num_kv_heads // size)


def _shard_layer_(layer: DecoderLayer, cfg: ModelConfig, tp: TPGroup) -> None:
    """Swap `layer`'s projections for their per-rank shards (shapes only; weights are loaded after)."""
    attn, mlp, n = layer.self_attn, layer.mlp, tp.size
    attn.num_heads, attn.num_kv_heads = cfg.num_heads // n, cfg.num_kv_heads // n
    q_dim, kv_dim = attn.num_heads * cfg.head_dim, attn.num_kv_heads * cfg.head_dim
    attn.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=cfg.attention_bias)
    attn.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
    attn.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
    o_bias = attn.o_proj.bias is not None
    attn.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=o_bias, tp=tp)
    mlp.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size // n, bias=False)
    mlp.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size // n, bias=False)
    mlp.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, bias=False, tp=tp)


def shard_state_dict(weights: dict[str, torch.Tensor], tp: TPGroup) -> dict[str, torch.Tensor]:
    """This rank's slice of every weight of a full (unsharded) state dict, as tensors of its own."""
    out = {}
    for name, tensor in weights.items():
        dim = next((d for suffix, d in SHARD_DIM.items() if name.endswith(suffix)), None)
        # clone: the full tensor can be freed once every rank has its slice.
        out[name] = tensor if dim is None else tensor.chunk(tp.size, dim)[tp.rank].clone()
    return out


class ParallelLlamaModel(LlamaModel):
    """A LlamaModel whose layers are this rank's shards; same forward, same logits on every rank.

    `config` stays the full model's (vocabulary, hidden size); `kv_config` is the per-rank KV shape.
    """

    def __init__(self, cfg: ModelConfig, tp: TPGroup) -> None:
        super().__init__(cfg)
        self.tp = tp
        for layer in self.layers:
            _shard_layer_(layer, cfg, tp)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp=tp)
        self.lm_head = VocabParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp=tp)
        self.tie_weights_()
        self.requires_grad_(False)

    @property
    def kv_config(self) -> ModelConfig:
        return local_config(self.config, self.tp.size)


def _sharded_mtp(head: MTPHead, tp: TPGroup) -> MTPHead:
    with torch.device("meta"):
        sharded = MTPHead(head.config)
    _shard_layer_(sharded.layer, head.config, tp)
    sharded.load_state_dict(shard_state_dict(head.state_dict(), tp), assign=True)
    sharded.kv_config = local_config(head.kv_config, tp.size)
    sharded.tp = tp
    # The RoPE buffers were built on the CPU: follow the weights.
    return sharded.requires_grad_(False).eval().to(head.eh_proj.weight.device)


def parallelize(model: LlamaModel, tp: TPGroup) -> ParallelLlamaModel:
    """This rank's tensor-parallel copy of a full `model` (its MTP head, if any, sharded and bound too)."""
    if isinstance(model, ParallelLlamaModel) or getattr(model.mtp, "tp", None) is not None:
        raise ValueError("this model is already sharded: pass the full model (every rank loads it whole)")
    check_shardable(model.config, tp.size)
    with torch.device("meta"):  # no memory for full-size weights that are replaced right away
        sharded = ParallelLlamaModel(model.config, tp)
    own = {k: v for k, v in model.state_dict().items() if not k.startswith("mtp.")}  # the head is sharded below
    sharded.load_state_dict(shard_state_dict(own, tp), assign=True)
    sharded.tie_weights_()  # assign=True replaced embed_tokens.weight, breaking the tie
    if model.mtp is not None:
        sharded.mtp = _sharded_mtp(model.mtp, tp).bind(sharded)
    return sharded.requires_grad_(False).eval().to(model.embed_tokens.weight.device)


def parallelize_pair(
    target: LlamaModel, draft: nn.Module, kind: str, tp: TPGroup
) -> tuple[ParallelLlamaModel, nn.Module]:
    """Shard a resolved (target, draft) pair for `fdecode.compile`: every check before any weight moves."""
    if any(getattr(getattr(m, "config", None), "recurrent", False) for m in (target, draft)):  # n-gram drafts have none
        raise ValueError(
            "tensor parallelism is not implemented for hybrid (Gated DeltaNet) models: their DeltaNet heads, conv "
            "channels, recurrent-state leaves and gated attention are not sharded yet; run them with tp_size=1"
        )
    if any(getattr(getattr(m, "config", None), "latent_kv", False) for m in (target, draft)):
        raise ValueError(
            "tensor parallelism is not implemented for MLA (DeepSeek-V3) models: their latent projections, the "
            "absorbed kv_b_proj per head and the routed experts are not sharded yet; run them with tp_size=1"
        )
    if any(getattr(m.config, "moe", None) is not None for m in (target, draft) if hasattr(m, "config")):
        raise ValueError(
            "tensor parallelism is not implemented for mixture-of-experts models (DeepSeek-V3, GLM-4.5, ...): the "
            "stacked experts, routers and shared experts are not sharded yet; run them with tp_size=1"
        )
    check_shardable(target.config, tp.size, what="target")
    if kind == "ngram":  # no weights: every rank looks up the same committed tokens
        sharded = parallelize(target, tp)
        return sharded, draft.bound(sharded)  # the attention shapes of a rank's shard
    if kind == "model":
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(
                f"the draft's vocabulary ({draft.config.vocab_size}) differs from the target's "
                f"({target.config.vocab_size}): not supported with tensor parallelism yet; run with tp_size=1"
            )
        check_shardable(draft.config, tp.size, what="draft")
    elif draft is not target.mtp:  # an MTP head of its own
        if getattr(draft, "tp", None) is not None:
            raise ValueError("this MTP head is already sharded: pass the full head")
        check_shardable(draft.config, tp.size, what="MTP head")
    sharded = parallelize(target, tp)
    if kind == "mtp":
        return sharded, sharded.mtp if draft is target.mtp else _sharded_mtp(draft, tp).bind(sharded)
    return sharded, parallelize(draft, tp)
