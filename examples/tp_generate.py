"""Tensor-parallel speculative decoding, one process per rank: by default the seed's configuration in
miniature, a Qwen3.5 hybrid (Gated DeltaNet + gated attention) with its MTP head, K = 3, at TP = N.

    torchrun --nproc-per-node 2 examples/tp_generate.py                       # random Qwen3.5 + MTP, CPU, gloo
    torchrun --nproc-per-node 2 examples/tp_generate.py --family llama        # random Llama + a draft LM
    torchrun --nproc-per-node 2 examples/tp_generate.py PATH --device cuda    # a checkpoint (any family), NCCL

Every rank loads the whole model and keeps its shards (`fdecode.models.sharding`); each runs the same
step on the same prompts and commits the same tokens (no broadcast needed); rank 0 prints them, and
whether every rank agreed. `--broadcast` adds the in-graph broadcast of rank 0's tokens (the catch-all
for non-deterministic kernels).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import fdecode
from fdecode.bench.models import llama, qwen3_5
from fdecode.models import from_hf, group_exit
from fdecode.models.parallel import DEVICE_BACKENDS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", help="checkpoint folder (default: a seeded random model of --family)")
    parser.add_argument("--family", default="qwen3_5", choices=["qwen3_5", "llama"])
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
    elif args.family == "qwen3_5":  # the same seed on every rank: the same weights everywhere
        target = qwen3_5(vocab=4096, hidden=256, layers=4, seed=0)  # 3 DeltaNet layers, 1 gated attention
    else:
        target = llama(vocab=512, hidden=128, layers=2, seed=0)
    draft = "mtp" if target.mtp is not None else llama(vocab=target.config.vocab_size, hidden=128, layers=1, seed=1)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=3,
        max_batch=2,
        max_seq_len=256,
        backend="eager",
        device=str(device),
        tp_size=dist.get_world_size(),
        broadcast_accepted=args.broadcast,
    )
    step = fdecode.compile(target, draft, cfg, tp_group=dist.group.WORLD)
    out = fdecode.generate(step, [[5, 6, 7, 8], [100, 200, 300]], max_new_tokens=32, temperature=[0.0, 0.8], seed=1)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, out)
    if dist.get_rank() == 0:
        print(step)
        for seq in out:
            print(seq)
        print("every rank committed the same tokens" if all(o == out for o in everyone) else "RANKS DISAGREE")
    group_exit.destroy_process_group()  # not dist's: that one can abort the exit (see group_exit)


if __name__ == "__main__":
    main()
