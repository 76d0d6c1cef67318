"""Train fdecode's bundled model: a tiny byte-level Llama with a jointly trained MTP head, plus a draft LM.

    python examples/train_tiny.py                     # writes fdecode/assets/tiny-stdlib{,-draft}
    python examples/train_tiny.py --steps 50 --out /tmp/tiny   # a smoke run

Corpus: the Python standard library's own source files (every machine has them,
offline), tests and vendored packages left out. Files whose path hashes to 0 mod
HOLDOUT_EVERY are held out; HELDOUT_WINDOWS windows of them are shipped next to
the weights (`tiny-stdlib-heldout.safetensors`) so the reported loss can be reproduced anywhere.

Objective, one AdamW over all three modules, on the same random 256-byte windows:
- target: next-byte cross-entropy;
- MTP head, recursively at depths 1 and 2 (as it is used when drafting K > 1
  tokens): depth 1 pairs byte p with the target hidden from p - 1 and predicts
  byte p + 1; depth 2 pairs byte p + 1 with the head's own depth-1 output;
- draft: an independent 2-layer LM, next-byte cross-entropy.
All forwards are `fdecode.models.dense.dense_forward`, i.e. the very layers decoding runs.
The weights are saved in bfloat16 in the Hugging Face layout (`mtp.` keys for the head),
and the held-out loss reported is that of the saved bfloat16 weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sysconfig
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from fdecode.models import LlamaModel, ModelConfig, MTPHead, from_hf, save_hf
from fdecode.models.dense import heldout_losses, sequence_losses
from fdecode.tokenizer import ByteTokenizer

ASSETS = Path(__file__).resolve().parents[1] / "fdecode" / "assets"
HOLDOUT_EVERY = 25
HELDOUT_WINDOWS = 64
SEQ = 256
HELDOUT_FILE = "tiny-stdlib-heldout.safetensors"

TARGET = ModelConfig(
    vocab_size=ByteTokenizer.vocab_size,
    hidden_size=256,
    intermediate_size=640,
    num_layers=4,
    num_heads=8,
    num_kv_heads=4,
    head_dim=32,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
)
DRAFT = TARGET.replace(hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=2)


def corpus() -> tuple[bytes, bytes]:
    """(train, held-out) bytes: stdlib sources joined by EOS-free blank lines, split by file."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__"}
    train, held = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if skip & set(Path(rel).parts):
            continue
        text = path.read_bytes()
        bucket = int(hashlib.sha1(rel.encode()).hexdigest(), 16) % HOLDOUT_EVERY
        (held if bucket == 0 else train).append(text)
    return b"\n\n".join(train), b"\n\n".join(held)


def windows(data: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    return data[starts[:, None] + torch.arange(SEQ)].long()  # [N, SEQ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1400)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ASSETS)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    train_bytes, held_bytes = corpus()
    train = torch.frombuffer(bytearray(train_bytes), dtype=torch.uint8)
    held_data = torch.frombuffer(bytearray(held_bytes), dtype=torch.uint8)
    spacing = (len(held_data) - SEQ) // HELDOUT_WINDOWS
    held = windows(held_data, torch.arange(HELDOUT_WINDOWS) * spacing)  # evenly spaced, fixed
    print(f"corpus: {len(train) / 1e6:.1f} MB train, {len(held_data) / 1e6:.2f} MB held out")

    target = LlamaModel.random(TARGET, seed=args.seed, std=0.02)
    target.mtp = MTPHead.random(TARGET, seed=args.seed + 1, std=0.02).bind(target)
    draft = LlamaModel.random(DRAFT, seed=args.seed + 2, std=0.02)
    params = [*target.parameters(), *draft.parameters()]  # target.parameters() includes target.mtp
    for p in params:
        p.requires_grad_(True)
    print(
        f"parameters: target {sum(p.numel() for n, p in target.named_parameters() if not n.startswith('mtp.')):,}"
        f", mtp {sum(p.numel() for p in target.mtp.parameters()):,}, draft {sum(p.numel() for p in draft.parameters()):,}"
    )
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95)
    )
    warmup = max(1, args.steps // 20)

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay to 10 %
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    bar = tqdm(range(args.steps), desc="train", unit="step")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x = windows(train, torch.randint(0, len(train) - SEQ, (args.batch,), generator=gen))
        parts = sequence_losses(target, draft, x)
        loss = parts["target"] + parts["mtp1"] + 0.5 * parts["mtp2"] + parts["draft"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0:
            bar.set_postfix({k: f"{v.item():.3f}" for k, v in parts.items()})
    train_s = time.perf_counter() - start

    # Save in bfloat16 (a few MB), then report the loss of exactly what was saved, reloaded the user's way.
    args.out.mkdir(parents=True, exist_ok=True)
    target_dir, draft_dir = args.out / "tiny-stdlib", args.out / "tiny-stdlib-draft"
    for model, folder in ((target, target_dir), (draft, draft_dir)):
        model.requires_grad_(False)
        save_hf(model.to(torch.bfloat16), folder)
        ByteTokenizer().save_pretrained(folder)
    save_file({"windows": held.to(torch.int16)}, str(args.out / HELDOUT_FILE), metadata={"format": "pt"})
    loaded, loaded_draft = from_hf(target_dir, dtype=torch.float32), from_hf(draft_dir, dtype=torch.float32)
    heldout = heldout_losses(loaded, loaded_draft, held)
    report = {
        "heldout_loss_nats_per_byte": {k: round(v, 5) for k, v in heldout.items()},
        "heldout_windows": HELDOUT_WINDOWS,
        "seq_len": SEQ,
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "seed": args.seed,
        "train_bytes": len(train),
        "train_seconds": round(train_s),
        "torch": torch.__version__,
    }
    (target_dir / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
