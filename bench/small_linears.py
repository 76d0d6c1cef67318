"""The CPU matmul pass's forms of a small linear, side by side in compiled graphs (docs/host-time.md).

    python bench/small_linears.py            # widths 32, 64, 128, 256; rows 1, 4, 32
    python bench/small_linears.py --quick    # width 32, rows 4, a few calls

Each case compiles one graph (Inductor, one thread) of four `linear(rms_norm(x), w_i)` + SiLU layers at width
d (square weights of 4 d^2 bytes) over `rows` rows, three times, with `fdecode.backends.cpu.matmul`
forcing one form for every linear: `mm` (Inductor's extern BLAS call, as traced), `stationary`
((w @ x^T)^T: the BLAS call, then the extern copy back to row-major order) and `fused` (the sum over k of
x[:, None] * w[None], a reduction in Inductor's C++ kernels). Then it times the three graphs in
alternating rounds and reports the median CPU time per call of the thread (`time.thread_time`: the figure
other jobs on a shared machine disturb least), wrapper and kernels together. What it decides:
`matmul.FUSED_BYTES` and `matmul.STATIONARY_BYTES`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from fdecode.backends.cpu import matmul
from fdecode.graphs.pure import fresh_code

FORMS = {  # (FUSED_BYTES, STATIONARY_BYTES) forcing one form for every weight below oneDNN's size
    "mm": (0, 1 << 62),
    "stationary": (0, 0),
    "fused": (1 << 62, 1 << 62),
}
LAYERS = 4


def layers(x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
    for w in weights:
        x = torch.nn.functional.silu(torch.nn.functional.linear(torch.nn.functional.rms_norm(x, x.shape[-1:]), w))
    return x


def compiled(form: str):
    """`layers` compiled with every linear in `form` (the pass reads the thresholds as it runs: at the first call)."""
    fused, stationary = FORMS[form]
    matmul.FUSED_BYTES, matmul.STATIONARY_BYTES = fused, stationary
    return torch.compile(
        fresh_code(layers, f"layers_{form}"),  # a code object of its own: no form's graph replaces another's
        backend="inductor",
        fullgraph=True,
        dynamic=False,
        options={"post_grad_custom_pre_pass": matmul.WeightStationary()},
    )


def per_call(fn, args, calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        fn(*args)
    return (time.thread_time() - start) / calls


def case(width: int, rows: int, rounds: int, calls: int) -> dict[str, float]:
    """Median CPU us per call of each form's graph at `width` and `rows`."""
    gen = torch.Generator().manual_seed(width * 1000 + rows)
    x = torch.randn(rows, width, generator=gen)
    weights = [torch.randn(width, width, generator=gen) / width**0.5 for _ in range(LAYERS)]
    saved = matmul.FUSED_BYTES, matmul.STATIONARY_BYTES
    fns = {}
    try:
        with torch.no_grad():
            want = layers(x, *weights)
            for form in FORMS:
                fn = compiled(form)
                torch.testing.assert_close(fn(x, *weights), want, rtol=1e-4, atol=1e-4)  # compiles, checks
                fns[form] = fn
            matmul.FUSED_BYTES, matmul.STATIONARY_BYTES = saved
            times: dict[str, list[float]] = {form: [] for form in FORMS}
            for _ in range(rounds):
                for form, fn in fns.items():
                    times[form].append(per_call(fn, (x, *weights), calls))
    finally:
        matmul.FUSED_BYTES, matmul.STATIONARY_BYTES = saved
    return {form: 1e6 * statistics.median(ts) for form, ts in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 32])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="width 32, 4 rows, 2 rounds of 20 calls")
    args = parser.parse_args()
    if args.quick:
        args.widths, args.rows, args.rounds, args.calls = [32], [4], 2, 20
    torch.set_num_threads(1)
    print(f"| width (weight KiB) | rows | {' | '.join(f'{f} us' for f in FORMS)} | fused / mm | stationary / mm |")
    print(f"|---|---|{'---|' * len(FORMS)}---|---|")
    for width in args.widths:
        for rows in args.rows:
            us = case(width, rows, args.rounds, args.calls)
            cells = " | ".join(f"{us[f]:.1f}" for f in FORMS)
            print(
                f"| {width} ({width * width * 4 // 1024}) | {rows} | {cells} | {us['fused'] / us['mm']:.2f} | "
                f"{us['stationary'] / us['mm']:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
