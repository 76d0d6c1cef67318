"""The ATen ops of the captured step, per draft kind and sampling mode: the table in docs/backends.md.

    python bench/ops_table.py [--device-kv-write npu]
    python bench/ops_table.py --quick     # a smoke run: the greedy draft-LM column only

Traces the step with `fdecode.inspect` on CPU (the AOTAutograd ATen graph every backend starts
from): K = 3, B = 2, a 2-layer random target, a 1-layer random draft LM or MTP head. With
`--device-kv-write npu` the KV write is the NPU's (`fdecode.ops.kv`: ScatterNdUpdate), which is
the graph an NPU captures apart from the attention lowering. The GE column says, for each
overload, whether torchair's GE mode converts it: "none" for the overloads torchair leaves
unconverted (`GE_UNCONVERTED`, read from torchair's sources), "fdecode's" where fdecode registers
a converter (`GE_SUPPLIED`, the fused op), "torchair's" otherwise (check a new overload against
torchair's `ge_converter/aten/*.py` by hand: the list of unconverted overloads is not exhaustive).
"""

from __future__ import annotations

import argparse

import torch

import fdecode
from fdecode.graphs import torchair as npu
from fdecode.models import LlamaModel, ModelConfig, MTPHead
from fdecode.ops import histogram, kv

# (draft kind, sampling plan): the candidate plan and the full-vocabulary plan with every filter hold
# every op any sampling plan has (the other full plans drop the top-k / top-p searches).
COLUMNS = (
    ("model", "top_k<=128"),
    ("model", "full+top_k+top_p"),
    ("mtp", "full+top_k+top_p"),
    ("model", "greedy"),
    ("mtp", "greedy"),
)


def overloads(draft_kind: str, plan: str, backend: str = "aot_eager") -> dict[str, int]:
    cfg = ModelConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16
    )
    target = LlamaModel.random(cfg, seed=0)
    draft = (
        LlamaModel.random(cfg.replace(num_layers=1), seed=1) if draft_kind == "model" else MTPHead.random(cfg, seed=2)
    )
    config = fdecode.DecodeConfig(
        num_draft_tokens=3, max_batch=2, max_seq_len=64, block_size=4, backend=backend, sampling=plan != "greedy"
    )
    step = fdecode.compile(target, draft, config)
    return fdecode.inspect(step, step.prefill([[1, 2, 3], [4, 5]], max_new_tokens=8), plan=plan).overload_counts


def ge_column(name: str) -> str:
    if name == "fdecode.scatter_nd_update_.default":  # the CPU stand-in of torch_npu's op
        return "torchair's (`npu.npu_scatter_nd_update_` on an NPU)"
    if name.startswith("aten._scaled_dot_product"):  # the reference attention, lowered for this device
        return "CPU lowering; a GE step uses `npu.npu_fused_infer_attention_score` instead (torchair's)"
    if name.startswith("fdecode.") or name in npu.GE_SUPPLIED:
        return "fdecode's"
    if name in npu.GE_UNCONVERTED:
        return "**none**"
    return "torchair's"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device-kv-write", default=None, help="trace with this device type's KV write (npu)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one column (draft LM, greedy)")
    args = parser.parse_args()
    chosen = [("model", "greedy")] if args.quick else COLUMNS
    if args.device_kv_write:
        kv.KV_WRITE["cpu"] = kv.kv_write_for(args.device_kv_write)
        histogram.WAY["cpu"] = histogram.way_for(args.device_kv_write)
    columns = [overloads(kind, plan, "eager" if args.quick else "aot_eager") for kind, plan in chosen]
    names = sorted(set().union(*columns))
    heads = " | ".join(f"{'draft LM' if kind == 'model' else 'MTP'}, {plan}" for kind, plan in chosen)
    print(f"| ATen overload | {heads} | GE converter |")
    print("|---|" + "---:|" * len(chosen) + "---|")
    for name in names:
        cells = " | ".join(str(col.get(name, "")) for col in columns)
        print(f"| `{name}` | {cells} | {ge_column(name)} |")
    totals = " | ".join(str(sum(col.values())) for col in columns)
    print(f"| total nodes | {totals} | |")


if __name__ == "__main__":
    with torch.no_grad():
        main()
