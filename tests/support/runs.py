"""Run loops over the tiny Llama pair of support/llama_models.py.

`build` compiles a target with a draft of a kind ("self", "partial", "random"; "mtp" or "ngram" drafts)
and `run` decodes PROMPTS with it, returning the tokens and the per-step accepted lengths (the
lossless tests compare the tokens with transformers' greedy output); `partial_step` and `run_lanes`
are the random-lane runs of the seed tests (run in a subprocess too).
"""

from __future__ import annotations

import fdecode
from support.llama_models import draft_of, fdecode_target, independent_draft

PROMPTS = [(5, 17, 33, 2, 9, 41, 60), (7, 3), (11, 12, 13, 14, 15, 80, 81, 82, 83, 84, 85, 86, 87)]
NEW = 20


def run(step, prompts=PROMPTS, max_new_tokens=NEW, eos=None, **sampling):
    """generate() plus the per-step accepted lengths of the active lanes."""
    lengths = []
    state = step.prefill(prompts, max_new_tokens=max_new_tokens, eos_token_id=eos, **sampling)
    outs = [[] for _ in prompts]
    out, from_step = state.step_output, False
    while True:
        packed = out.packed
        for lane in range(len(prompts)):
            n = int(packed[lane, -2])
            outs[lane] += packed[lane, :n].tolist()
            if n and from_step:
                lengths.append(n)
        if bool(out.finished[: len(prompts)].all()):
            return outs, lengths
        state, out = step(state)
        from_step = True


def over_depths(step, state, schedule, lanes: int, steps: int = 60):
    """Step `state` at the depths of `schedule` in turn (cycled) until its first `lanes` lanes finish: each lane's
    tokens (the prefill's first, then every step's) and the most tokens a lane committed in one step."""
    outs = [state.step_output.tokens[lane, :1].tolist() for lane in range(lanes)]
    longest = 0
    for i in range(steps):
        if bool(state.step_output.finished[:lanes].all()):
            break
        state, out = step(state, depth=schedule[i % len(schedule)])
        for lane in range(lanes):
            outs[lane] += out.tokens[lane, : int(out.num_tokens[lane])].tolist()
        longest = max(longest, int(out.num_tokens[:lanes].max()))
    return outs, longest


def build(kind: str, draft_kind: str, k: int, backend: str = "eager", **changes):
    layers = 1 if (draft_kind == "mtp" and kind == "self") else 2
    target = fdecode_target(layers)
    draft = draft_of(draft_kind, kind, target)
    cfg = fdecode.DecodeConfig(
        **{"num_draft_tokens": k, "max_batch": 4, "max_seq_len": 64, "block_size": 4, "backend": backend, **changes}
    )
    return fdecode.compile(target, draft, cfg), layers


def run_lanes(step, prompts, seeds, temperature=0.9):
    return fdecode.generate(step, prompts, max_new_tokens=12, temperature=temperature, top_k=20, seed=seeds)


def partial_step(backend="eager", k=2):
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=3, max_seq_len=40, block_size=4, backend=backend)
    return fdecode.compile(target, independent_draft("partial", target), cfg)
