"""A CPU linear at the row counts a step runs: MKL's `F.linear`, the weight-stationary `(w @ x^T)^T`,
oneDNN (`fdecode::onednn_linear`) on the weight as it lies, and oneDNN on its packed copy
(`fdecode.backends.cpu.onednn_packed`), eagerly.

    python bench/linears.py                       # the real pair's weight shapes and a few small ones
    python bench/linears.py --json bench/results/linears.json

Each call runs the product over `--bytes` worth of distinct copies of the weight (at least two), one after
another, as a step's layers do, so that no cache holds the weight between calls (one weight timed alone
sits in L3 when it fits and reads faster than a step ever sees it); a cell is that call's median over
`--repeats` calls after one warm-up call, the forms in turn (`interleaved_runs`), divided by the copies: in
microseconds per weight, and the weight's bytes over that time (GB/s, the rate at which the call streams
the weight; a one-row product can go no faster than the machine's read bandwidth, printed first). "packed"
runs the packed copy; "step" is what `onednn_linear` runs on a packed weight (the weight as it lies for
fewer rows than `onednn_packed.MIN_ROWS`, else the packed copy). The shapes: Qwen2.5-Coder-1.5B's attention and MLP
projections (1536 wide, MLP 8960), the 0.5B draft's (896, MLP 4864), a quarter of their 151,936-row LM head,
and small weights around `onednn_linear.MIN_BYTES`, below which the step keeps the BLAS call.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from fdecode.backends.cpu import onednn_packed
from fdecode.backends.cpu.onednn_linear import MIN_BYTES, onednn_linear
from fdecode.bench.timing import interleaved_runs, median_run

SHAPES = [
    (256, 256),
    (576, 576),
    (1536, 576),
    (1536, 1536),
    (8960, 1536),
    (1536, 8960),
    (896, 896),
    (4864, 896),
    (151936 // 4, 1536),
]
ROWS = (1, 2, 3, 4, 5, 8, 16, 64)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--bytes", type=float, default=256e6, help="weight copies per call, in bytes")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    data = torch.ones(2**28)  # 1 GiB
    bandwidth = data.numel() * 4 / median_run(data.sum, 5)[0]
    del data
    print(
        f"read bandwidth {bandwidth / 1e9:.1f} GB/s, {torch.get_num_threads()} threads; "
        f"oneDNN from {MIN_BYTES / 2**20:.0f} MiB in the step"
    )
    systems = {
        "F.linear": lambda x, w, p: F.linear(x, w),
        "w @ x^T": lambda x, w, p: (w @ x.T).T.contiguous(),
        "oneDNN": lambda x, w, p: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""),
        "packed": lambda x, w, p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""),
        "step": lambda x, w, p: onednn_linear(x, w, None),
    }
    rows = []
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, k in SHAPES:
            weights = [torch.randn(n, k, generator=gen) for _ in range(max(2, round(args.bytes / (n * k * 4))))]
            for w in weights:
                onednn_packed.pack(w)
            pairs = [(w, onednn_packed.packed(w)) for w in weights]
            mb = n * k * 4 / 1e6
            for m in ROWS:
                x = torch.randn(m, k, generator=gen)
                cell = {
                    name: (lambda f=f, x=x, pairs=pairs: [f(x, w, p) for w, p in pairs]) for name, f in systems.items()
                }
                us = {name: timed[0] * 1e6 / len(pairs) for name, timed in interleaved_runs(cell, args.repeats).items()}
                rows.append({"weight": [n, k], "mb": mb, "rows": m, "copies": len(pairs), "us": us})
                cells = "  ".join(f"{name} {t:7.0f} us {mb / t * 1e3:5.1f}" for name, t in us.items())
                print(
                    f"{n:6d} x {k:5d} ({mb:5.1f} MB) rows {m:3d}: {cells}   step/oneDNN "
                    f"{us['oneDNN'] / us['step']:.2f}x",
                    flush=True,
                )
            del weights, pairs
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "bandwidth_gb_s": bandwidth / 1e9,
                    "threads": torch.get_num_threads(),
                    "min_bytes": MIN_BYTES,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
