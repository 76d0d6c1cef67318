"""Each tensor-parallel rank's resident weight bytes against TP = 1, from the shapes alone.

    python bench/tp_memory.py [--json bench/results/tp_memory.json]
    python bench/tp_memory.py --quick     # a smoke run: the Qwen3.5 shape only

Models are built on the meta device (no memory: the shapes are the real ones) and sharded for every rank
of TP = 2 (and 4 where the KV heads divide) (`fdecode.models.sharding.shard_model`, which needs no process group to slice). For each
it reports the rank's bytes, the ratio to TP = 1, and the parameters replicated by design (whole on every
rank), summed by kind. Shapes:
- qwen3_5-2b-like: a Qwen3.5 dense hybrid (24 layers, every 4th gated attention, the others Gated
  DeltaNet; hidden 2048, 8 query / 2 KV heads of 256, DeltaNet 16 key / 32 value heads of 128,
  intermediate 6144, vocabulary 248,320) with a 1-layer MTP head;
- deepseek_v3-4-layers: DeepSeek-V3's own widths (hidden 7168, 128 MLA heads, q_lora 1536, kv_lora 512,
  256 experts of 2048, top 8, 1 shared expert, vocabulary 129,280), 4 layers (the first dense) and its
  NextN head, so that the routed experts weigh what they do in the real model.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch

from fdecode.models.parallel import TPGroup
from fdecode.models.sharding import shard_model

BF16 = 2  # bytes per weight: both checkpoints ship bf16


def qwen3_5_2b_like():
    from fdecode.models.hybrid import HybridModel
    from fdecode.models.hybrid_config import FULL, LINEAR, HybridConfig
    from fdecode.models.mtp.hybrid import HybridMTPHead

    cfg = HybridConfig(
        vocab_size=248_320,
        hidden_size=2048,
        intermediate_size=6144,
        num_layers=24,
        num_heads=8,
        num_kv_heads=2,
        head_dim=256,
        model_type="qwen3_5_text",
        partial_rotary_factor=0.25,
        tie_word_embeddings=True,
        layer_types=tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(24)),
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        mtp_num_layers=1,
    )
    target = HybridModel(cfg)
    target.mtp = HybridMTPHead(cfg).bind(target)
    return target


def deepseek_v3_4_layers():
    from fdecode.models.deepseek_config import DeepseekV3Config
    from fdecode.models.families.deepseek_v3 import DeepseekV3Model, mtp_head
    from fdecode.models.moe_config import MoEConfig

    cfg = DeepseekV3Config(
        vocab_size=129_280,
        hidden_size=7168,
        intermediate_size=18432,
        num_layers=4,
        num_heads=128,
        num_kv_heads=128,
        head_dim=64,
        model_type="deepseek_v3",
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        first_k_dense_replace=1,
        mtp_num_layers=1,
        moe=MoEConfig(
            num_experts=256, top_k=8, moe_intermediate_size=2048, n_group=8, topk_group=4, routed_scaling_factor=2.5
        ),
    )
    target = DeepseekV3Model(cfg)
    target.mtp = mtp_head(cfg).bind(target)
    return target


# model -> (builder, the TP sizes its heads divide by: 2 KV heads stop Qwen3.5 at 2)
MODELS = {"qwen3_5-2b-like": (qwen3_5_2b_like, (2,)), "deepseek_v3-4-layers": (deepseek_v3_4_layers, (2, 4))}


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of a model and its MTP head, once each, by name."""
    named = dict(model.named_parameters())
    if model.mtp is not None and not any(name.startswith("mtp.") for name in named):
        named |= {f"mtp.{k}": v for k, v in model.mtp.named_parameters()}
    return named


def kind(name: str) -> str:
    """A replicated parameter's kind, for the report."""
    for key in ("norm", "gate.", "e_score", "kv_a_proj", "q_a_proj", "eh_proj", "fc.", "shared_expert_gate"):
        if key in name:
            return {"gate.": "router", "e_score": "router", "fc.": "eh_proj / fc", "eh_proj": "eh_proj / fc"}.get(
                key, key
            )
    return name


def measure(name: str, sizes: tuple[int, ...]) -> dict[str, object]:
    with torch.device("meta"):
        full = MODELS[name][0]()
    full_params = params(full)
    full_bytes = sum(p.numel() for p in full_params.values()) * BF16
    row: dict[str, object] = {"model": name, "tp1_gib": full_bytes / 2**30, "ranks": {}}
    for size in sizes:
        with torch.device("meta"):
            shard = shard_model(full, TPGroup(None, 0, size))
        mine = params(shard)
        replicated: dict[str, float] = defaultdict(float)
        for pname, p in mine.items():
            whole = full_params.get(pname)
            if whole is not None and whole.shape == p.shape and p.numel() > 0:
                replicated[kind(pname)] += p.numel() * BF16 / 2**30
        rank_bytes = sum(p.numel() for p in mine.values()) * BF16
        row["ranks"][size] = {
            "rank_gib": rank_bytes / 2**30,
            "ratio": rank_bytes / full_bytes,
            "replicated_gib": dict(sorted(replicated.items(), key=lambda kv: -kv[1])),
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--quick", action="store_true", help="a smoke run: the first shape only")
    args = parser.parse_args()
    models = list(MODELS.items())[:1] if args.quick else MODELS.items()
    rows = [measure(name, sizes) for name, (_, sizes) in models]
    for row in rows:
        print(f"{row['model']}: TP = 1 {row['tp1_gib']:.2f} GiB")
        for size, r in row["ranks"].items():
            top = ", ".join(f"{k} {v:.3f}" for k, v in list(r["replicated_gib"].items())[:5])
            print(f"  TP = {size}: {r['rank_gib']:.2f} GiB per rank ({r['ratio']:.3f}x); replicated GiB: {top}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
