"""`fdecode bench --workloads qwen-coder`: the real draft/target pair against transformers, side by side
(docs/design.md, "Benchmarks, assets and tools").

Qwen2.5-Coder-1.5B-Instruct (target) and -0.5B-Instruct (draft) (`fdecode.assets.qwen_coder`), fp32,
greedy, chat prompts (`PROMPTS`). At batch 1, per prompt, round-robin: hf-generate, hf-assisted (its
default schedule), target-only, before (at K), fdecode depth d (`step(state, depth=d)`, d = 1 .. K),
fdecode (an `Engine` as the default config runs it: the depth of each launch chosen, `adaptive_depth`, among
depths 0 .. K, which the workload's warm-up compiles) and "fdecode Engine depth K" (every launch at K). At
batch 4 (`BATCH`): both Engines against transformers' batched greedy `generate` (left padding). Every system decodes exactly
`new_tokens` tokens (no EOS stop); every batch-1 system must commit target-only's tokens, and the Engine
at batch 4 each prompt's batch-1 tokens, else nothing is reported; the row says whether transformers'
batched tokens agreed. The step is compiled once per batch size with `context_buckets=(256,)`
(docs/design.md, "Compile regions: each layer kind compiled once"). Skipped, naming the script that
fetches the pair, where the models are missing.
"""

from __future__ import annotations

import sys
import time

import torch

import fdecode
from fdecode.assets import qwen_coder
from fdecode.baseline import BeforeLoop, TargetOnly
from fdecode.bench.loops import engine_run, fixed_depth
from fdecode.bench.results import timed_result
from fdecode.bench.timing import interleaved_runs, paired_ratio
from fdecode.ops.plan import GREEDY

PROMPTS = {
    "write": "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "edit": "Rename the variable x to counts in this function and reply with the whole function only.\n\n"
    "def tally(words):\n    x = {}\n    for w in words:\n        x[w] = x.get(w, 0) + 1\n"
    "    return x\n",
    "text": "In a short paragraph, explain to a new programmer why version control matters.",
}
# Batch 4: the prompts above and one more.
BATCH = (*PROMPTS.values(), "Write a SQL query that returns the ten customers with the most orders.")
# `fdecode bench --workloads` names: every prompt and batch 4, one prompt at batch 1, or batch 4 alone.
PAIR_WORKLOADS = ("qwen-coder", *(f"qwen-coder-{name}" for name in PROMPTS), "qwen-coder-batch")
SEQ_LEN = 256  # every lane's capacity: the longest prompt + 64 new tokens + a window fit


def chat_ids(tokenizer, text: str) -> list[int]:
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(chat)["input_ids"]


def hf_generate(model, prompts: list[list[int]], new_tokens: int, assistant=None) -> list[list[int]]:
    """transformers' greedy tokens (left-padded where the prompts differ in length)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kwargs = {} if assistant is None else {"assistant_model": assistant}
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
        **kwargs,
    )
    return out[:, width:].tolist()


def _compiled(target, draft, k: int, batch: int, backend: str):
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=k,
        max_batch=batch,
        max_seq_len=SEQ_LEN,
        context_buckets=(SEQ_LEN,),
        dtype=torch.float32,
        backend=backend,
    )
    return fdecode.compile(target, draft, cfg)


def load_pair(*, hf: bool = True) -> tuple | None:
    """(fdecode target, fdecode draft, tokenizer, transformers target, transformers draft) of the real pair in
    float32, every model without an EOS stop; the transformers models are None where hf is False. None, with
    a message, where the pair is missing."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fdecode.models import from_hf

    reason = qwen_coder.missing_reason()
    if reason is not None:
        print(f"... qwen-coder skipped: {reason}", file=sys.stderr, flush=True)
        return None
    target_dir, draft_dir = qwen_coder.safetensors_folders()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target, draft = from_hf(target_dir, dtype=torch.float32), from_hf(draft_dir, dtype=torch.float32)
    hf_target = hf_draft = None
    if hf:
        hf_target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        hf_draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
        for model in (hf_target, hf_draft):  # every system decodes new_tokens tokens: no EOS stop
            model.generation_config.eos_token_id = None
    return target, draft, tokenizer, hf_target, hf_draft


def pair_with_prompts() -> tuple | None:
    """(fdecode target, fdecode draft, {name: chat ids} of the bench's three prompts) of the real pair in float32;
    None, with a message, where the pair is missing."""
    loaded = load_pair(hf=False)
    if loaded is None:
        return None
    target, draft, tokenizer, _, _ = loaded
    return target, draft, {name: chat_ids(tokenizer, text) for name, text in PROMPTS.items()}


def compiled_pair(k: int) -> tuple | None:
    """(the real pair's step at K = k, B = 1, its tokenizer) for the bench scripts; None, with a message, where
    the pair is missing."""
    loaded = load_pair(hf=False)
    if loaded is None:
        return None
    target, draft, tokenizer, _, _ = loaded
    return _compiled(target, draft, k, 1, "auto"), tokenizer


def run_pair_workload(
    pair: tuple,
    k: int,
    new_tokens: int,
    reps: int,
    *,
    batch4: bool = True,
    backend: str = "auto",
    prompts: tuple[str, ...] | None = None,
) -> list:
    """The rows of the workload (`fdecode.bench.results.Result`) for `pair` (`load_pair`'s five; the
    transformers models may be None: no transformers rows). prompts: names in `PROMPTS` (None: all; (): none,
    batch 4 alone, whose B = 1 step then runs depth K only, for each prompt's tokens alone)."""
    target, draft, tokenizer, hf_target, hf_draft = pair
    hf = hf_target is not None
    depths = [k] if prompts == () else list(range(k + 1))
    print(f"... qwen-coder: compiling the B=1 step's depths {depths}", file=sys.stderr, flush=True)
    step = _compiled(target, draft, k, 1, backend)
    start = time.perf_counter()
    step.warmup(plans=[GREEDY], depths=depths)
    compile_s = time.perf_counter() - start
    target_only, before = TargetOnly(step, backend=step.backend), BeforeLoop(step, backend=step.backend)
    if prompts != ():
        warm = chat_ids(tokenizer, PROMPTS["write"])
        target_only.generate([warm], max_new_tokens=4)  # compiles the baselines' graphs
        before.generate([warm], max_new_tokens=2 * (k + 1))

    rows = []
    for name, text in PROMPTS.items():
        if prompts is not None and name not in prompts:
            continue
        prompt = chat_ids(tokenizer, text)
        systems = {
            "target-only": lambda: _one((*target_only.generate([prompt], max_new_tokens=new_tokens), None)),
            "before": lambda: _one((*before.generate([prompt], max_new_tokens=new_tokens), None)),
            **{
                f"fdecode depth {d}": (lambda d=d: _one((*fixed_depth(step, [prompt], d, new_tokens), None)))
                for d in range(1, k + 1)
            },
            "fdecode": lambda: _one(engine_run(step, [prompt], new_tokens, adaptive=True)),
            f"fdecode Engine depth {k}": lambda: _one(engine_run(step, [prompt], new_tokens, adaptive=False)),
        }
        if hf:
            systems["hf-generate"] = lambda: (hf_generate(hf_target, [prompt], new_tokens)[0], None, None)
            systems["hf-assisted"] = lambda: (hf_generate(hf_target, [prompt], new_tokens, hf_draft)[0], None, None)
        print(f"... qwen-coder[{name}] B=1 K={k}", file=sys.stderr, flush=True)
        rounds: dict[str, list[float]] = {}
        with torch.no_grad():
            timed = interleaved_runs(systems, reps, warm_up=False, announce="...   ", rounds=rounds)
        reference = timed["target-only"][3][0]
        wrong = [s for s, (*_, (tokens, _, _)) in timed.items() if tokens != reference]
        if wrong:
            raise RuntimeError(f"qwen-coder[{name}]: {wrong} disagree with target-only's greedy tokens; no numbers")
        for system, (*seconds, (_tokens, steps, info)) in timed.items():
            extra = {
                "prompt": text,
                "compile_s": compile_s if system.startswith("fdecode") else None,
                "round_seconds": [round(t, 4) for t in rounds[system]],
            }
            extra.update(info or {})
            rows.append(timed_result(f"qwen-coder[{name}]", system, 1, k, new_tokens, seconds, steps, extra))
    if batch4:
        rows += _batch4(target, draft, tokenizer, hf_target, k, new_tokens, reps, step, backend)
    return rows


def _batch4(target, draft, tokenizer, hf_target, k, new_tokens, reps, step1, backend) -> list:
    prompts = [chat_ids(tokenizer, text) for text in BATCH]
    print(f"... qwen-coder: compiling the B=4 step (depths 0 .. {k})", file=sys.stderr, flush=True)
    step = _compiled(target, draft, k, len(prompts), backend)
    start = time.perf_counter()
    step.warmup(plans=[GREEDY], depths=list(range(k + 1)))  # the adaptive Engine's depths, timed
    compile_s = time.perf_counter() - start
    alone = [fixed_depth(step1, [p], k, new_tokens)[0][0] for p in prompts]  # each prompt's batch-1 tokens
    systems = {
        "fdecode": lambda: engine_run(step, prompts, new_tokens, adaptive=True),
        f"fdecode Engine depth {k}": lambda: engine_run(step, prompts, new_tokens, adaptive=False),
    }
    if hf_target is not None:
        systems["hf-generate"] = lambda: (hf_generate(hf_target, prompts, new_tokens), None, None)
    print(f"... qwen-coder[batch] B=4 K={k}", file=sys.stderr, flush=True)
    with torch.no_grad():
        timed = interleaved_runs(systems, reps, warm_up=False, announce="...   ")
    if timed["fdecode"][3][0] != alone or timed[f"fdecode Engine depth {k}"][3][0] != alone:
        raise RuntimeError("qwen-coder[batch]: the Engine's lanes disagree with batch 1's tokens; no numbers")
    rows = []
    for system, (*seconds, (tokens, steps, info)) in timed.items():
        extra = {"prompts": list(BATCH)}
        if system.startswith("fdecode"):
            extra.update(compile_s=compile_s, **info)
        else:  # transformers' padded batch against each prompt alone
            extra["tokens_equal_batch_1"] = [t == a for t, a in zip(tokens, alone)]
        rows.append(timed_result("qwen-coder[batch]", system, len(prompts), k, new_tokens, seconds, steps, extra))
    return rows


def _one(run):
    tokens, steps, info = run
    return tokens[0], steps, info


def goal_markdown(rows: list) -> str:
    """The workload's goal ratios for each batch-1 prompt of `rows` (`run_pair_workload`'s): the default (`fdecode`)
    against assisted generation, target-only and the best fixed depth, each as the ratio of the medians and,
    where the rows carry their rounds, as the median of the rounds' ratios (`paired_ratio`). Empty without
    such rows."""
    by_prompt: dict[str, dict] = {}
    for r in rows:
        if r.batch == 1 and r.workload.startswith("qwen-coder["):
            by_prompt.setdefault(r.workload, {})[r.system] = r
    lines = []
    for workload, systems in by_prompt.items():
        if "fdecode" not in systems:
            continue
        fixed = {s: r for s, r in systems.items() if s.startswith("fdecode depth ")}
        best = max(fixed, key=lambda s: fixed[s].tokens_per_s) if fixed else None
        cells = []
        for other in ("hf-assisted", "target-only", best):
            if other not in systems:
                cells.append("")
                continue
            ratio = systems["fdecode"].tokens_per_s / systems[other].tokens_per_s
            mine, theirs = (systems[s].extra.get("round_seconds") for s in ("fdecode", other))
            paired = f" ({paired_ratio(mine, theirs):.3f}x)" if mine and theirs else ""
            cells.append(f"{ratio:.3f}x{paired}")
        lines.append(f"| {workload} | {' | '.join(cells)} | {best or ''} |")
    if not lines:
        return ""
    head = (
        "| prompt | default vs hf-assisted | vs target-only | vs best fixed depth | best fixed depth |\n"
        "|---|---|---|---|---|\n"
    )
    return "Ratios of medians (and the median of the rounds' ratios):\n\n" + head + "\n".join(lines)
