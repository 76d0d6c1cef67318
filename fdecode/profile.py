"""`fdecode profile`: timelines of the before loop and the compiled step, side by side
(docs/design.md, "Benchmarks, assets and tools").

    fdecode profile [--out profile/] [--iterations 8] [--model DIR] [-k 3]

Decodes one prompt greedily with the bundled model and its MTP head (real speculation), records the
same number of iterations of each system with `torch.profiler`, writes one Chrome trace per system
(open them in Perfetto), and renders `timeline.png`: the before loop on top, with each iteration's
validate / host round trip / draft segments, and the fdecode step below it. It prints the time per
iteration and per committed token of each, and the mean validate-to-draft gap, which is the time the
host round trip keeps the draft from starting. On a CPU-only machine the host and the device are the
same cores, so there is a single row per system; on an accelerator, the device-kernel rows come from
the traces.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import fdecode
from fdecode.assets import TINY
from fdecode.baseline import BeforeLoop
from fdecode.models import from_hf
from fdecode.ops.plan import GREEDY
from fdecode.tokenizer import load_tokenizer

COLORS = {"validate": "#4C72B0", "host round trip": "#C44E52", "draft": "#55A868", "step": "#8172B2"}
PROMPT = "class LRUCache:\n    def __init__(self, maxsize=128):\n"
Span = tuple[str, float, float]  # (label, start us, end us)


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Nothing written to the process's stderr (fd 2) gets out: the profiler's C++ start/stop lines
    ("USDT: ... profiler_start", "STAGE: ... Completed Stage") ignore KINETO_LOG_LEVEL."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def profiled() -> Iterator[profile]:
    """A CPU `torch.profiler` session whose start and stop print nothing."""
    prof = profile(activities=[ProfilerActivity.CPU])
    with quiet_stderr():
        prof.start()
    try:
        yield prof
    finally:
        with quiet_stderr():
            prof.stop()


def _spans(prof, prefix: str) -> list[Span]:
    """(label, start_us, end_us) of the record_function ranges whose name starts with `prefix`."""
    spans = []
    for event in prof.events():
        if event.name.startswith(prefix):
            spans.append((event.name[len(prefix) :], event.time_range.start, event.time_range.end))
    return sorted(spans, key=lambda s: s[1])


def record(
    iterations: int, out: Path, *, model: Path | str = TINY, k: int = 3, step=None, backend: str = "inductor"
) -> tuple[list[Span], list[Span], int]:
    """Profile `iterations` iterations of the before loop and of the step on `model` with its MTP head.

    step: an already compiled step of `model` with its MTP head to profile (its K), instead of compiling one.
    backend: what compiles the step and the before loop's forwards when `step` is None.
    Returns (before spans, step spans, tokens committed by each), both over the same iterations of the
    same greedy decode (the two systems commit the same tokens step for step)."""
    prompt = [load_tokenizer(model)(PROMPT)["input_ids"]]
    if step is None:
        target = from_hf(model, dtype=torch.float32)
        if target.mtp is None:
            raise ValueError(
                f"{model} has no MTP head (mtp.* weights): fdecode profile draws real speculation with one"
            )
        cfg = fdecode.DecodeConfig(
            num_draft_tokens=k,
            max_batch=1,
            max_seq_len=len(prompt[0]) + iterations * (k + 1) + 2 * k + 2,
            sampling=False,
            backend=backend,
        )
        step = fdecode.compile(target, "mtp", cfg)
    budget = iterations * (step.config.K + 1)  # at most K + 1 tokens per iteration: at least `iterations` of them
    step.warmup(plans=(GREEDY,))
    before = BeforeLoop(step, backend=step.backend)
    before.generate(prompt, max_new_tokens=budget)  # warm-up: compiles the before loop's forwards

    # Both rows show `iterations` iterations: the before loop stops there, and so does the step.
    with profiled() as prof_before:
        outputs, ran = before.generate(prompt, max_new_tokens=budget, max_iterations=iterations)
    # The same tokens, so the same iterations (an EOS would stop the step's lane, not the before loop).
    state = step.prefill(prompt, max_new_tokens=budget, ignore_eos=True)
    prof_before.export_chrome_trace(str(out / "before.json"))
    with profiled() as prof_after:
        for _ in range(ran):
            with record_function("fdecode/step"):
                state, _ = step(state)
    prof_after.export_chrome_trace(str(out / "fdecode.json"))
    return _spans(prof_before, "before/"), _spans(prof_after, "fdecode/"), len(outputs[0]) - 1


def per_iteration(spans: list[Span]) -> float:
    """Milliseconds from the first span's start to the last one's end, per iteration."""
    iterations = sum(label in ("validate", "step") for label, _, _ in spans)
    return (spans[-1][2] - spans[0][1]) / 1e3 / max(iterations, 1)


def render(before: list[Span], after: list[Span], path: Path, *, tokens: int | None = None) -> float:
    """Draw both timelines; returns the mean validate -> draft gap of the before loop (ms).
    tokens: tokens committed over the drawn iterations (each system), for the per-token figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gaps = [s[2] - s[1] for s in before if s[0] == "host round trip"]
    iterations = sum(label == "step" for label, _, _ in after)
    fig, ax = plt.subplots(figsize=(12, 3.2))
    labels = []
    for row, spans, name in ((1, before, "before loop"), (0, after, "fdecode step")):
        if not spans:
            labels.append(name)
            continue
        t0 = spans[0][1]
        for label, start, end in spans:
            ax.barh(
                row, (end - start) / 1e3, left=(start - t0) / 1e3, color=COLORS[label], edgecolor="white", height=0.6
            )
            if label == "host round trip":
                ax.text(
                    (start - t0 + (end - start) / 2) / 1e3,
                    row + 0.38,
                    f"{(end - start) / 1e3:.2f}",
                    ha="center",
                    fontsize=7,
                )
        ms = per_iteration(spans)
        token = f", {ms * iterations / tokens:.2f} ms/token" if tokens else ""
        labels.append(f"{name}\n{ms:.2f} ms/iteration{token}")
    ax.set_yticks([1, 0], labels)
    ax.set_ylim(-0.6, 1.75)
    ax.set_xlabel("ms (host = device: the CPU)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    # Below the axes, outside the data.
    ax.legend(
        handles, COLORS.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.32), fontsize=8, ncol=4, frameon=False
    )
    mean_gap = statistics.mean(gaps) / 1e3 if gaps else 0.0
    ax.set_title(
        f"{iterations} iterations each; validate -> draft gap of the before loop (red, ms): mean {mean_gap:.2f} "
        "per iteration",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return mean_gap


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="fdecode profile", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--out", type=Path, default=Path("profile"), help="folder for the traces and the picture (default: %(default)s)"
    )
    p.add_argument("--iterations", type=int, default=8, help="iterations of each system (default: %(default)s)")
    p.add_argument(
        "--model",
        type=Path,
        default=TINY,
        help="checkpoint folder with an MTP head and its tokenizer (default: the bundled model)",
    )
    p.add_argument("-k", type=int, default=3, help="draft tokens per step (default: %(default)s)")
    p.add_argument(
        "--backend",
        default="inductor",
        help="compiles the step and the before loop's forwards "
        "(default: %(default)s; aot_eager: capture without codegen)",
    )
    args = p.parse_args(argv)
    if args.iterations < 1:
        p.error("--iterations must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    before, after, tokens = record(args.iterations, args.out, model=args.model, k=args.k, backend=args.backend)
    gap = render(before, after, args.out / "timeline.png", tokens=tokens)
    mean = lambda spans, label: statistics.mean([(e - s) / 1e3 for lab, s, e in spans if lab == label] or [0.0])
    print(f"traces: {args.out / 'before.json'}, {args.out / 'fdecode.json'}; picture: {args.out / 'timeline.png'}")
    print(f"{args.iterations} iterations each, {tokens} tokens committed by each (greedy, K = {args.k}, MTP head)")
    print(
        f"before loop: validate {mean(before, 'validate'):.2f} ms, host round trip {gap:.2f} ms, "
        f"draft {mean(before, 'draft'):.2f} ms; {per_iteration(before):.2f} ms per iteration, "
        f"{per_iteration(before) * args.iterations / tokens:.2f} ms per token"
    )
    print(
        f"fdecode step: {per_iteration(after):.2f} ms per iteration, "
        f"{per_iteration(after) * args.iterations / tokens:.2f} ms per token"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
