"""Writes examples/quickstart.ipynb from the cells below, executed, with its outputs.

    python examples/make_quickstart.py             # write and execute (a few minutes on a CPU)
    python examples/make_quickstart.py --no-run    # write the cells only, without outputs

Edit the cells here, then run this script: the notebook is shipped with its outputs so a
reader who does not run it sees results. CI executes it again (tests/test_notebook.py).
"""

import argparse
import sys
import tempfile
from pathlib import Path

import nbformat

CELLS = [
    (
        "md",
        """# fdecode quickstart

Speculative decoding as one pure, compiled function per decode iteration: validate the drafts with the
target, sample, prepare the next draft's inputs and run the draft, all on the device, with no host round
trip in between.

Every cell uses the **bundled model**: a 4-layer byte-level Llama (2.8 M parameters) trained on the Python
standard library (`examples/train_tiny.py`), drafting with its own jointly trained **MTP head**. It runs on
a CPU in a few minutes. The same calls load any local Hugging Face checkpoint (`from_hf("path/to/Qwen3")`).""",
    ),
    (
        "code",
        """import time

import torch

import fdecode
from fdecode.assets import TINY
from fdecode.models import from_hf
from fdecode.tokenizer import load_tokenizer

target = from_hf(TINY, dtype=torch.float32)   # the same loader as for any local HF checkpoint
tok = load_tokenizer(TINY)                     # bytes 0..255, then BOS 256, EOS 257, PAD 258
print(TINY.name, target.config.model_type, f"{target.config.num_layers} layers, hidden {target.config.hidden_size},",
      "MTP head:", target.mtp is not None)""",
    ),
    (
        "md",
        """## Compile, then warm up

`fdecode.compile` binds the models and the configuration; the graphs compile on their first call, or all at
once with `step.warmup()`. There is one graph per *sampling plan* (greedy lanes run an argmax-only graph;
random lanes whose `top_k` is at most 128 filter within `torch.topk`'s candidates; anything else filters the
whole vocabulary), and each graph serves every attention window (256, 512 tokens here): the window's width is
a symbolic size, so a stream that grows into a wider window compiles nothing. Warm-up shows a progress bar;
a lazy compile prints one line instead. This notebook runs two plans, so it warms up those two.""",
    ),
    (
        "code",
        """cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=2, max_seq_len=512)
step = fdecode.compile(target, "mtp", cfg)    # draft: "mtp", a draft model, or a checkpoint folder
plans = [p for p in step.plans if p.name in ("greedy", "top_k<=128")]
start = time.perf_counter()
step.warmup(plans=plans)
print(f"warm-up: {time.perf_counter() - start:.0f} s for {len(plans)} plans x {len(step.buckets)} windows {step.buckets}")
print("one graph for every window:", step.dynamic_window)
step""",
    ),
    (
        "md",
        """## Prefill, then step by hand

`step.prefill` primes one lane per prompt and already holds the first new token. `step(state)` consumes
`state` (its KV cache is updated in place) and returns the next state and a `StepOutput`:

- `out.tokens` is `[max_batch, K + 1]`: the tokens each lane committed in this step, left-aligned and
  **padded with `-1`**. A running lane commits 1 to K + 1 tokens (the drafts the target accepted, plus one
  token of the target's own); a lane with no request (here lane 1 of 2 after the first prompt finishes, or
  any unused lane) commits none, so its row is all `-1`.
- `out.num_tokens` counts the non-padding entries; `out.finished` says which lanes stopped.""",
    ),
    (
        "code",
        """prompts = ["import os\\n\\ndef ", "class Node:\\n    def __init__(self"]
state = step.prefill([tok.encode(p) for p in prompts], max_new_tokens=64)
print("first tokens:", state.step_output.tokens[:, 0].tolist())
for _ in range(3):
    state, out = step(state)
    print(out.tokens.tolist(), "committed:", out.num_tokens.tolist(), "finished:", out.finished.tolist())
out""",
    ),
    ("md", "## What the step captures\n1 graph, 0 breaks, the fused prepare op once, no host syncs."),
    (
        "code",
        """report = fdecode.inspect(step, state)
assert report.graph_count == 1 and report.graph_break_count == 0 and not report.host_syncs
report""",
    ),
    ("md", "## Generate: greedy, then sampled with per-prompt seeds"),
    (
        "code",
        """outs = fdecode.generate(step, [tok.encode(p) for p in prompts], max_new_tokens=80)
for p, o in zip(prompts, outs):
    print(p + tok.decode(o))
    print("-" * 40)""",
    ),
    (
        "code",
        """outs = fdecode.generate(step, [tok.encode(p) for p in prompts], max_new_tokens=80,
                       temperature=0.8, top_k=50, seed=[1, 2])   # top_k <= 128: the candidate plan
for p, o in zip(prompts, outs):
    print(p + tok.decode(o))
    print("-" * 40)""",
    ),
    (
        "md",
        """## The Engine: requests arrive at any time

`fdecode.Engine` does continuous batching: more requests than lanes wait for a free lane, a finished
request's lane takes the next one without recompiling, and events arrive one step behind the device.
`cancel` ends a request with a final event (`reason="cancelled"`).""",
    ),
    (
        "code",
        """engine = fdecode.Engine(step)
requests = {  # 4 requests, 2 lanes: two wait for a free lane; one samples (top_k <= 128: a warmed plan)
    engine.add_request(tok.encode(p), max_new_tokens=64, **kw): p
    for p, kw in [("class Config:\\n    def get(self", {}), ("import json\\n\\ndef load(", {"temperature": 0.8, "top_k": 50, "seed": 1}),
                  ("class Stack:\\n    def pu", {}), ("while True:\\n", {})]
}
late = list(requests)[-1]
texts = {rid: [] for rid in requests}
for i, event in enumerate(engine.stream()):
    texts[event.request_id] += event.new_tokens
    if i == 2:
        engine.cancel(late)  # still waiting for a lane: it ends at once, with no tokens
    if event.finished:
        print(f"--- request {event.request_id}: {event.reason}, {len(texts[event.request_id])} new tokens")
        print(requests[event.request_id] + tok.decode(texts[event.request_id]))""",
    ),
    (
        "md",
        """## Acceptance and speed

The mean accepted length is the tokens a decode step commits, on average (at most K + 1 = 4). Below, the
same greedy continuation is timed with the compiled step and with target-only decoding (one compiled target
forward per token), and the two must give the same tokens. On this tiny model a CPU step is dominated by
fixed per-forward costs, so the speed-up is close to (mean accepted length) / (1 + K draft forwards' share).""",
    ),
    (
        "code",
        """from fdecode.baseline import TargetOnly

prompt = tok.encode("class LRUCache:\\n    def __init__(self, maxsize=128):\\n")
new = 200

def stream():
    engine = fdecode.Engine(step)
    engine.add_request(prompt, max_new_tokens=new, ignore_eos=True)
    tokens, steps = [], 0
    for event in engine.stream():
        tokens += event.new_tokens
        steps += bool(event.new_tokens)   # the prefill's first token, then one event per decode step
    return tokens, steps

target_only = TargetOnly(step, backend=step.backend)
target_only.generate([prompt], max_new_tokens=new)   # compiles its forward
times = {}
for name, run in (("fdecode", stream), ("target-only", lambda: target_only.generate([prompt], max_new_tokens=new))):
    start = time.perf_counter()
    result = run()
    times[name] = time.perf_counter() - start
    if name == "fdecode":
        tokens, steps = result
    else:
        assert result[0][0] == tokens, "target-only and the step disagree"
print(f"mean accepted length: {(len(tokens) - 1) / (steps - 1):.2f} tokens per step (of {cfg.K + 1})")
for name, s in times.items():
    print(f"{name:12} {len(tokens) / s:7.1f} tok/s")
print(f"speed-up: {times['target-only'] / times['fdecode']:.2f}x target-only")""",
    ),
    (
        "md",
        """## The timeline: before loop vs fdecode step

`fdecode profile` (here its functions, on this notebook's step) records the usual speculative loop, which
reads the target's tokens back to the host and rebuilds the draft inputs there, and the compiled step, the
same iterations of each, with `torch.profiler`, and draws them stacked: the red segments are the host round
trip the before loop pays between validation and drafting.""",
    ),
    (
        "code",
        """from pathlib import Path
from IPython.display import Image
from fdecode.profile import record, render

out_dir = Path("profile"); out_dir.mkdir(exist_ok=True)
before, after, committed = record(6, out_dir, step=step)
gap_ms = render(before, after, out_dir / "timeline.png", tokens=committed)
print(f"mean validate -> draft gap of the before loop: {gap_ms:.2f} ms per iteration")
Image(str(out_dir / "timeline.png"))""",
    ),
]


def build() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src) for kind, src in CELLS
    ]
    return nb


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--no-run", action="store_true", help="write the cells without executing them")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    nb = build()
    if not args.no_run:
        from nbclient import NotebookClient

        with tempfile.TemporaryDirectory() as work:  # the profile's traces go there, not into examples/
            NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": work}}).execute()
    nbformat.write(nb, Path(__file__).with_name("quickstart.ipynb"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
