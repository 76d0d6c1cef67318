"""One workload of `fdecode bench`: every system on the same target, draft and prompts, in one process
(docs/design.md, "Benchmarks, assets and tools").

`run_workload` builds the fdecode step (eager and compiled) for a batch size and K, the baselines
over the compiled step's models (target-only and the host-round-trip `before` loop), and at batch 1
the transformers systems (`generate`, assisted generation or prompt lookup), then times them together
(`fdecode.bench.timing.interleaved_runs`). Target-only's figure is shared through `baseline` by every
row over the same target, batch and prompts. The workload refuses to report when any system's greedy
tokens differ from target-only's. Its rows (`fdecode.bench.results.Result`) carry the backend that
ran each system, and the compiled step's compute floor and overhead (`fdecode.bench.floor`).
"""

from __future__ import annotations

import torch

import fdecode
from fdecode.baseline import BeforeLoop, TargetOnly
from fdecode.bench.floor import compute_floor
from fdecode.bench.loops import fdecode_loop
from fdecode.bench.results import Result
from fdecode.bench.timing import interleaved_runs
from fdecode.runtime.gate import DraftGate


def run_workload(
    name,
    target,
    draft,
    batch,
    k,
    new_tokens,
    reps,
    hf_pair,
    prompt_len=24,
    prompts=None,
    *,
    device="cpu",
    dtype=torch.float32,
    backend="auto",
    baseline: dict | None = None,
    max_seq_len: int | None = None,
):
    """prompts: a pool of real prompts (the first `batch` are used); None: random tokens.
    backend: what compiles the fdecode step and the baselines ("auto": cudagraphs on CUDA, else inductor).
    max_seq_len: the lanes' capacity (None: the longest prompt + new_tokens + 2(K + 1)); one value for
    several prompt pools keeps the graphs' shapes, so their compiles are reused.
    baseline: the target-only measurements of this target, shared by the rows that use it (one figure in
    every row of a batch and its prompts, whatever K or the draft); filled where it has none."""
    if prompts is None:
        gen = torch.Generator().manual_seed(0)
        prompts = [
            torch.randint(0, target.config.vocab_size, (prompt_len + 3 * i,), generator=gen).tolist()
            for i in range(batch)
        ]
    prompts = prompts[:batch]
    max_seq_len = max_seq_len or max(len(p) for p in prompts) + new_tokens + 2 * (k + 1)
    # The default DecodeConfig users get (sampling allowed): greedy lanes run its greedy plan's graph.
    base = dict(num_draft_tokens=k, max_batch=batch, max_seq_len=max_seq_len, device=device, dtype=dtype)
    eager = fdecode.compile(target, draft, fdecode.DecodeConfig(**base, backend="eager"))
    compiled = fdecode.compile(target, draft, fdecode.DecodeConfig(**base, backend=backend))
    _, needed = fdecode_loop(compiled, prompts, new_tokens)  # compiles, and counts the steps a run takes
    target_only, before = TargetOnly(compiled, backend=compiled.backend), BeforeLoop(compiled, backend=compiled.backend)
    systems = {
        "target-only": lambda: target_only.generate(prompts, max_new_tokens=new_tokens),
        "before": lambda: before.generate(prompts, max_new_tokens=new_tokens),
        "fdecode-eager": lambda: fdecode_loop(eager, prompts, new_tokens, needed),
        "fdecode": lambda: fdecode_loop(compiled, prompts, new_tokens, needed),
    }
    if compiled.gated:  # n-gram drafts: what an Engine runs (the gate), beside every step verified
        systems["fdecode-ungated"] = systems.pop("fdecode")
        systems["fdecode"] = lambda: fdecode_loop(compiled, prompts, new_tokens, gate=DraftGate(k))
    if hf_pair is not None and batch == 1:
        hf_target, hf_draft = hf_pair
        ids = torch.tensor(prompts)

        def hf(assistant=None, lookup=False):
            kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            if lookup:  # transformers' prompt lookup with the step's K and longest n
                kwargs.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=compiled.draft.max_n)
            if assistant is not None:
                assistant.generation_config.num_assistant_tokens = k
                assistant.generation_config.num_assistant_tokens_schedule = "constant"
                assistant.generation_config.assistant_confidence_threshold = 0.0
                kwargs["assistant_model"] = assistant
            out = hf_target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            return [out[0, ids.shape[1] :].tolist()], None

        systems["hf-generate"] = lambda: hf()
        if not compiled.drafter.forwards:  # prompt lookup: transformers' own
            systems["hf-prompt-lookup"] = lambda: hf(lookup=True)
        else:
            systems["hf-assisted"] = lambda: hf(hf_draft)

    baseline = {} if baseline is None else baseline
    key = (batch, new_tokens, tuple(map(tuple, prompts)))  # what target-only's tokens and time depend on
    results, outputs = [], {}
    with torch.no_grad():
        timed = interleaved_runs(
            {s: fn for s, fn in systems.items() if s != "target-only" or key not in baseline}, reps
        )
    if "target-only" in timed:
        baseline[key] = timed["target-only"]
    timed["target-only"] = baseline[key]
    for system in systems:
        med, lo, hi, (outs, steps) = timed[system]
        outputs[system] = outs
        total = sum(len(o) for o in outs)
        steps = steps or new_tokens
        results.append(
            Result(
                name,
                system,
                batch,
                k,
                total / med,
                total / hi,
                total / lo,
                med / steps * 1e3,
                total / (steps * batch),
            )
        )
    reference = outputs["target-only"]
    wrong = [s for s, o in outputs.items() if o != reference]
    if wrong:
        raise RuntimeError(
            f"{name} B={batch} K={k}: {wrong} disagree with target-only greedy tokens; no numbers reported"
        )
    floor = compute_floor(compiled, reps)
    for r in results:
        r.extra["backend"] = {"fdecode-eager": "eager"}.get(
            r.system, "transformers" if r.system.startswith("hf") else compiled.backend
        )
        if r.system == "fdecode":
            r.floor_ms = floor * 1e3
            r.overhead = 1 - floor * 1e3 / r.step_ms
    return results
