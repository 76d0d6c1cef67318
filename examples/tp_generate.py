"""Tensor-parallel speculative decoding, one process per rank.

    torchrun --nproc-per-node 2 examples/tp_generate.py                 # seeded random model, CPU, gloo
    torchrun --nproc-per-node 2 examples/tp_generate.py PATH --device cuda   # a checkpoint, NCCL

Every rank loads the whole checkpoint and keeps its shards; each runs the same
step on the same prompts and commits the same tokens (no broadcast needed, see
`fdecode.models.parallel`); rank 0 prints them. `--broadcast` adds the in-graph
broadcast of rank 0's tokens (the catch-all for non-deterministic kernels).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import fdecode
from fdecode.models import LlamaModel, ModelConfig, from_hf
from fdecode.models.parallel import DEVICE_BACKENDS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", help="checkpoint folder (default: a seeded random Llama)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--broadcast", action="store_true", help="DecodeConfig(broadcast_accepted=True)")
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type != "cpu":  # one accelerator per rank
        device = torch.device(device.type, int(os.environ["LOCAL_RANK"]))
        getattr(torch, device.type).set_device(device)
    dist.init_process_group(DEVICE_BACKENDS[device.type])
    if args.model:
        target = from_hf(args.model)
    else:  # the same seed on every rank: the same weights everywhere
        cfg = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2,
                          num_heads=4, num_kv_heads=2, head_dim=32)
        target = LlamaModel.random(cfg, seed=0, std=0.1)
    draft = "mtp" if target.mtp is not None else LlamaModel.random(target.config.replace(num_layers=1), seed=1, std=0.1)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=3, max_batch=2, max_seq_len=256, backend="eager", device=str(device),
        tp_size=dist.get_world_size(), broadcast_accepted=args.broadcast,
    )
    step = fdecode.compile(target, draft, cfg, tp_group=dist.group.WORLD)
    out = fdecode.generate(step, [[5, 6, 7, 8], [100, 200, 300]], max_new_tokens=32, temperature=[0.0, 0.8], seed=1)
    if dist.get_rank() == 0:
        print(step)
        for seq in out:
            print(seq)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
