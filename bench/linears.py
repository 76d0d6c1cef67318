"""A CPU linear at the row counts a step runs: MKL's `F.linear`, the weight-stationary `(w @ x^T)^T` and
oneDNN (`fdecode::onednn_linear`), eagerly, one weight at a time.

    python bench/linears.py                       # the real pair's weight shapes and a few small ones
    python bench/linears.py --json bench/results/linears.json

Each cell is the median of `--repeats` calls after one warm-up call, the three forms in turn
(`interleaved_runs`), in microseconds, and the weight's
bytes over that time (GB/s, the rate at which the call streams the weight; a one-row product can go no
faster than the machine's read bandwidth, printed first). The shapes: Qwen2.5-Coder-1.5B's attention and
MLP projections (1536 wide, MLP 8960), the 0.5B draft's (896, MLP 4864), a quarter of their 151,936-row
LM head, and small weights around `onednn_linear.MIN_BYTES`, below which the step keeps the BLAS call.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from fdecode.bench.timing import interleaved_runs, median_run
from fdecode.ops.onednn_linear import MIN_BYTES, onednn_linear

SHAPES = [(256, 256), (576, 576), (1536, 576), (1536, 1536), (8960, 1536), (1536, 8960), (896, 896), (4864, 896),
          (151936 // 4, 1536)]
ROWS = (1, 2, 5, 9, 20, 64)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    data = torch.ones(2**28)  # 1 GiB
    bandwidth = data.numel() * 4 / median_run(data.sum, 5)[0]
    del data
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s, {torch.get_num_threads()} threads; "
          f"oneDNN from {MIN_BYTES / 2**20:.0f} MiB in the step")
    systems = {"F.linear": lambda x, w: F.linear(x, w),
               "w @ x^T": lambda x, w: (w @ x.T).T.contiguous(),
               "oneDNN": lambda x, w: onednn_linear(x, w, None)}
    rows = []
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, k in SHAPES:
            w = torch.randn(n, k, generator=gen)
            mb = w.numel() * 4 / 1e6
            for m in ROWS:
                x = torch.randn(m, k, generator=gen)
                cell = {name: (lambda f=f: f(x, w)) for name, f in systems.items()}
                us = {name: timed[0] * 1e6 for name, timed in interleaved_runs(cell, args.repeats).items()}
                rows.append({"weight": [n, k], "mb": mb, "rows": m, "us": us})
                cells = "  ".join(f"{name} {t:8.0f} us {mb / t * 1e3:5.1f} GB/s" for name, t in us.items())
                best = min(us["F.linear"], us["w @ x^T"])
                print(f"{n:6d} x {k:5d} ({mb:5.1f} MB) rows {m:3d}: {cells}   oneDNN {best / us['oneDNN']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bandwidth_gb_s": bandwidth / 1e9, "threads": torch.get_num_threads(),
                       "min_bytes": MIN_BYTES, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
