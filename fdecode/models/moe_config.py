"""Static description of a mixture-of-experts feed-forward layer, and its reading from config.json
(docs/design.md, "Mixture of experts: the MoE block, GLM-4.5, the DeepSeek-style MTP head").

`MoEConfig` is frozen and hashable (it sits inside a family's `ModelConfig`, baked into graphs).
Two routing styles, named by `router`:

    "sigmoid"  DeepSeek-V3 / GLM-4.5: sigmoid scores; experts chosen on scores + e_score_correction_bias
               (topk_method "noaux_tc") within the `topk_group` best of `n_group` groups; weights =
               the chosen plain scores, renormalised when `norm_topk_prob`, times
               `routed_scaling_factor`; `n_shared_experts` always-on experts summed in.
               topk_method "greedy" (DeepSeek's original): plain top-k over the scores, no groups, no bias.
    "softmax"  Qwen3-Next / Qwen3.5-MoE: softmax over the experts, top-k, renormalised when
               `norm_topk_prob`; one shared expert scaled by sigmoid(shared_expert_gate(x)).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

ROUTERS = ("sigmoid", "softmax")
TOPK_METHODS = ("noaux_tc", "greedy")  # of the sigmoid router


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int  # E routed experts
    top_k: int  # K experts per token
    moe_intermediate_size: int  # I of each routed expert
    router: str = "sigmoid"  # one of ROUTERS
    topk_method: str = "noaux_tc"  # one of TOPK_METHODS (sigmoid router only)
    n_group: int = 1  # expert groups (sigmoid router, noaux_tc)
    topk_group: int = 1  # groups a token may pick its experts from
    norm_topk_prob: bool = True  # renormalise the K chosen weights to sum to 1
    routed_scaling_factor: float = 1.0  # sigmoid router: multiplies the K weights
    n_shared_experts: int = 1  # sigmoid router: one shared MLP of n_shared_experts * I
    shared_expert_intermediate_size: int = 0  # softmax router: the gated shared expert's size

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"unsupported MoE router {self.router!r}; fdecode implements {ROUTERS}")
        if self.topk_method not in TOPK_METHODS:
            raise ValueError(
                f"unsupported MoE routing method topk_method={self.topk_method!r}; fdecode implements {TOPK_METHODS}"
            )
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.top_k}) must be in 1 .. n_routed_experts ({self.num_experts})"
            )
        if self.num_experts % self.n_group or not 0 < self.topk_group <= self.n_group:
            raise ValueError(
                f"n_group ({self.n_group}) must divide the {self.num_experts} experts and topk_group "
                f"({self.topk_group}) be in 1 .. n_group"
            )
        if self.n_group > 1 and self.num_experts // self.n_group < 2:
            raise ValueError("grouped routing scores each group by its best two experts: groups need >= 2 experts")
        if self.n_group > 1 and self.top_k > self.topk_group * (self.num_experts // self.n_group):
            raise ValueError(f"top_k ({self.top_k}) exceeds the experts of {self.topk_group} groups")

    def replace(self, **changes: object) -> MoEConfig:
        return dataclasses.replace(self, **changes)


def sigmoid_moe_from_hf(hf: Mapping[str, object], *, defaults: Mapping[str, object]) -> MoEConfig:
    """The DeepSeek-V3 / GLM-4.5 MoE of a config.json dict; `defaults` are the family config class's
    values for fields a config.json may leave out (they differ: DeepSeek scales by 2.5, GLM by 1)."""

    def get(key: str) -> object:
        value = hf.get(key)
        return defaults[key] if value is None else value

    scoring = hf.get("scoring_func") or "sigmoid"
    if scoring != "sigmoid":
        raise ValueError(f"unsupported MoE scoring_func {scoring!r}; fdecode implements sigmoid for this family")
    return MoEConfig(
        num_experts=int(get("n_routed_experts")),
        top_k=int(get("num_experts_per_tok")),
        moe_intermediate_size=int(get("moe_intermediate_size")),
        router="sigmoid",
        topk_method=str(hf.get("topk_method") or "noaux_tc"),
        n_group=int(get("n_group")),
        topk_group=int(get("topk_group")),
        norm_topk_prob=bool(get("norm_topk_prob")),
        routed_scaling_factor=float(get("routed_scaling_factor")),
        n_shared_experts=int(get("n_shared_experts")),
    )


def softmax_moe_from_hf(hf: Mapping[str, object], *, norm_topk_prob: bool | None = None) -> MoEConfig:
    """The Qwen3-Next / Qwen3.5-MoE MoE of a config.json dict. `norm_topk_prob` overrides the dict's
    (Qwen3.5-MoE always renormalises and has no such field); otherwise it defaults to True."""
    norm = hf.get("norm_topk_prob", True) if norm_topk_prob is None else norm_topk_prob
    return MoEConfig(
        num_experts=int(hf["num_experts"]),
        top_k=int(hf["num_experts_per_tok"]),
        moe_intermediate_size=int(hf["moe_intermediate_size"]),
        router="softmax",
        norm_topk_prob=bool(norm),
        n_shared_experts=0,
        shared_expert_intermediate_size=int(hf.get("shared_expert_intermediate_size") or 0),
    )
