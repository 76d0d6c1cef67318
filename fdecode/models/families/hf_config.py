"""config.json fields every family reads alike: sizes, RoPE, the activation (docs/design.md, "Model families
and the registry").

`shape_fields` gives the `ModelConfig` sizes (vocabulary, hidden and MLP sizes, layers, heads, head_dim),
`rope_from_hf` the RoPE theta and a hashable scaling spec from transformers 4's `rope_scaling` or 5's
`rope_parameters`, and `check_silu` refuses any other activation before a weight is read.
"""

from __future__ import annotations


def check_silu(hf: dict[str, object]) -> None:
    """Every family fdecode implements uses SiLU (SwiGLU MLPs); refuse a config that names another activation."""
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}; fdecode implements silu")


def shape_fields(hf: dict[str, object], *, default_head_dim: int | None = None) -> dict[str, int]:
    """The ModelConfig sizes every decoder family reads alike from config.json: vocabulary, hidden and MLP
    sizes, layers, heads (KV heads default to the query heads), head_dim (`default_head_dim`, else
    hidden_size / heads, where config.json has none)."""
    heads = int(hf["num_attention_heads"])
    return dict(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or default_head_dim or int(hf["hidden_size"]) // heads),
    )


def rope_from_hf(hf: dict[str, object]) -> tuple[float, tuple[tuple[str, object], ...] | None]:
    """(rope_theta, the scaling spec as sorted (key, value) pairs, or None for plain RoPE)."""
    params: dict[str, object] = {}
    # transformers 4 writes `rope_scaling`, transformers 5 `rope_parameters` (which also holds rope_theta).
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(hf.get(key), dict):
            params.update(hf[key])
    theta = float(params.pop("rope_theta", None) or hf.get("rope_theta") or 10000.0)
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if rope_type == "default":
        return theta, None
    if "original_max_position_embeddings" in hf and rope_type in ("llama3", "yarn"):
        # As in transformers: a top-level value (Phi-3 style) wins over the one inside the rope dict.
        params["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
    params["rope_type"] = rope_type
    hashable = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
    return theta, tuple(sorted(hashable.items()))
