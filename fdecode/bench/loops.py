"""The decoding loops `fdecode bench` times the fdecode step with, and its mean accepted length
(docs/design.md, "Benchmarks, assets and tools").

`fdecode_loop` prefills, then runs a step until every lane finished (reading each output) or for a
given number of steps device-resident (the outputs read once at the end, as an async host loop would
overlap them); with a `DraftGate` it decides per step whether to verify the drafts, from the outputs
read one step behind, as an `Engine` on a gated step does. It copies each output, since a CUDA-graph
replay reuses its output buffer. `fixed_depth` runs every step at one depth, reading each output at once;
`engine_run` decodes through an `Engine`, choosing each launch's depth as the default config does or at K.
`mean_accepted_length` is the mean number of tokens a lane commits per step while it keeps running (greedy):
the acceptance figure of a draft on given prompts, without timing anything.
"""

from __future__ import annotations

import torch

import fdecode
from fdecode.runtime.depth_graphs import DepthGraphs
from fdecode.runtime.gate import DraftGate
from fdecode.runtime.policy import FixedDepth


def fdecode_loop(step, prompts, new_tokens, steps: int | None = None, gate: DraftGate | None = None):
    """Prefill, then `steps` steps (None: until every lane finished, reading each output);
    returns outputs and the number of steps. With `steps` given the loop is device-resident:
    the outputs are read once at the end, as an async host loop would overlap them.
    gate: decide per step whether to verify the drafts, from the outputs read one step behind, as an
    `Engine` on a gated step does (`fdecode.runtime.gate`)."""
    state = step.prefill(prompts, max_new_tokens=new_tokens)
    outs = [[] for _ in prompts]
    packed = [state.output]
    done, pending = 0, None  # pending: the previous step's output, if it verified its drafts
    while (steps is None and not bool(state.step_output.finished[: len(prompts)].all())) or (
        steps is not None and done < steps
    ):
        if gate is None:
            state, out = step(state)
        else:
            speculate = gate.speculate()
            state, out = step(state, speculate=speculate)
            if pending is not None:  # read one step behind, as the Engine does
                gate.observe_output(pending.cpu())
            pending = out.packed if speculate else None
        packed.append(out.packed.clone())  # a CUDA-graph replay reuses its output buffer: keep a copy (no sync)
        done += 1
    steps = done
    for p in torch.stack(packed).cpu().tolist():
        for lane in range(len(prompts)):
            outs[lane] += p[lane][: p[lane][-2]]
    return outs, steps


def fixed_depth(step, prompts: list[list[int]], depth: int, new_tokens: int) -> tuple[list[list[int]], int]:
    """Tokens of each lane (its first from the prefill included) and the steps taken, every step at `depth`
    (`step(state, depth=depth)`; 0: the target alone), `new_tokens` a lane with no EOS stop, each output read
    at once."""
    state = step.prefill(prompts, max_new_tokens=new_tokens, ignore_eos=True)
    n = len(prompts)
    tokens, steps = state.step_output.tokens[:n, :1].tolist(), 0
    while not bool(state.step_output.finished[:n].all()):
        state, out = step(state, depth=depth)
        for lane, (row, count) in enumerate(zip(out.tokens[:n].tolist(), out.num_tokens[:n].tolist())):
            tokens[lane] += row[:count]
        steps += 1
    return tokens, steps


def engine_run(step, prompts: list[list[int]], new_tokens: int, *, adaptive: bool) -> tuple[list[list[int]], int, dict]:
    """Tokens of each prompt through an `Engine` (which reads one step behind), its steps and the depths it
    launched. adaptive=False: every launch at depth K, an n-gram draft's too (its gate never pauses), and no
    other depth's graph asked for (True: as the default `DecodeConfig` runs, choosing)."""
    engine = fdecode.Engine(step)
    if not adaptive:  # the Engine of an `adaptive_depth=False` step, on this step's graphs
        engine.policy = FixedDepth(step.config.K)
        engine.depth_graphs = DepthGraphs(step, engine.policy)
    ids = [engine.add_request(p, max_new_tokens=new_tokens, ignore_eos=True) for p in prompts]
    got = engine.run()
    info = {"depths_launched": {d: n for d, n in engine.policy.launches.items() if n}}
    if adaptive:  # the seconds per depth it weighed at the end (warm-up timings, then its own launches)
        info["depth_costs_s"] = [round(c, 4) for c in engine.policy.costs]
    return [got[i] for i in ids], engine.steps, info


def mean_accepted_length(step, prompts, new_tokens: int) -> float:
    """Mean tokens a lane commits per step (greedy), over the steps in which it keeps running.

    A lane's last step is left out: a budget cut there would count as a rejection."""
    state = step.prefill(prompts, max_new_tokens=new_tokens)
    counts = []
    while not bool(state.step_output.finished[: len(prompts)].all()):
        state, out = step(state)
        packed = out.packed[: len(prompts)]
        running = (packed[:, -2] > 0) & (packed[:, -1] == 0)
        counts += packed[running, -2].tolist()
    return sum(counts) / max(len(counts), 1)
