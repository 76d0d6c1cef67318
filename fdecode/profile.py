"""`fdecode profile`: timelines of the before loop and the compiled step, side by side.

    fdecode profile [--out profile/] [--iterations 6]

Records a few iterations of each with `torch.profiler`, writes one Chrome trace per
system (open them in Perfetto), and renders `timeline.png`: the before loop on top,
with each iteration's validate / host round trip / draft segments, and the fdecode
step below it. It also reports the mean validate-to-draft gap, which is the time
the host round trip keeps the draft from starting.

On a CPU-only machine the host and the device are the same cores, so there is a
single row per system. On an accelerator, the device-kernel rows come from the
traces.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import fdecode
from fdecode.baseline import BeforeLoop
from fdecode.bench import llama

COLORS = {"validate": "#4C72B0", "host round trip": "#C44E52", "draft": "#55A868", "step": "#8172B2"}


def _spans(prof, prefix: str) -> list[tuple[str, float, float]]:
    """(label, start_us, end_us) of the record_function ranges whose name starts with `prefix`."""
    spans = []
    for event in prof.events():
        if event.name.startswith(prefix):
            spans.append((event.name[len(prefix):], event.time_range.start, event.time_range.end))
    return sorted(spans, key=lambda s: s[1])


def record(iterations: int, out: Path, *, hidden: int, layers: int, vocab: int, k: int):
    target = llama(vocab, hidden, layers, seed=1)
    draft = llama(vocab, hidden, 1, seed=2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=1, max_seq_len=256, sampling=False, backend="inductor")
    step = fdecode.compile(target, draft, cfg)
    before = BeforeLoop(step)
    prompt = [list(range(1, 33))]
    budget = iterations * (k + 1)
    before.generate(prompt, max_new_tokens=budget)  # warm-up: compiles
    state = step.prefill(prompt, max_new_tokens=budget)
    state, _ = step(state)

    with profile(activities=[ProfilerActivity.CPU]) as prof_before:
        before.generate(prompt, max_new_tokens=iterations)
    prof_before.export_chrome_trace(str(out / "before.json"))
    state = step.prefill(prompt, max_new_tokens=budget)
    with profile(activities=[ProfilerActivity.CPU]) as prof_after:
        for _ in range(iterations):
            with record_function("fdecode/step"):
                state, _ = step(state)
    prof_after.export_chrome_trace(str(out / "fdecode.json"))
    return _spans(prof_before, "before/"), _spans(prof_after, "fdecode/")


def render(before, after, path: Path) -> float:
    """Draw both timelines; returns the mean validate -> draft gap of the before loop (ms)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gaps = [s[2] - s[1] for s in before if s[0] == "host round trip"]
    fig, ax = plt.subplots(figsize=(12, 2.8))
    for row, spans in ((1, before), (0, after)):
        if not spans:
            continue
        t0 = spans[0][1]
        for label, start, end in spans:
            ax.barh(row, (end - start) / 1e3, left=(start - t0) / 1e3, color=COLORS[label], edgecolor="white", height=0.6)
            if label == "host round trip":
                ax.text((start - t0 + (end - start) / 2) / 1e3, row + 0.38, f"{(end - start) / 1e3:.2f}", ha="center", fontsize=7)
    ax.set_yticks([1, 0], ["before loop", "fdecode step"])
    ax.set_xlabel("ms (host = device: CPU only)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, COLORS.keys(), loc="upper right", fontsize=8, ncol=4)
    mean_gap = statistics.mean(gaps) / 1e3 if gaps else 0.0
    ax.set_title(f"validate -> draft gap of the before loop (red): mean {mean_gap:.2f} ms per iteration")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return mean_gap


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fdecode profile", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("profile"))
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--target", default="256x4", help="HIDDENxLAYERS of the random target")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("-k", type=int, default=3)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    hidden, layers = map(int, args.target.split("x"))
    before, after = record(args.iterations, args.out, hidden=hidden, layers=layers, vocab=args.vocab, k=args.k)
    gap = render(before, after, args.out / "timeline.png")
    mean = lambda spans, label: statistics.mean([(e - s) / 1e3 for lab, s, e in spans if lab == label] or [0.0])  # noqa: E731
    print(f"traces: {args.out / 'before.json'}, {args.out / 'fdecode.json'}; picture: {args.out / 'timeline.png'}")
    print(
        f"before loop: validate {mean(before, 'validate'):.2f} ms, host round trip {gap:.2f} ms, "
        f"draft {mean(before, 'draft'):.2f} ms per iteration; fdecode step {mean(after, 'step'):.2f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
