"""Prompt-lookup (n-gram) drafts: the in-graph lookup, lossless greedy and random lanes, the Engine.

transformers' greedy `generate` is the oracle for the committed tokens; the host lookup
(`lookup_list`) is the oracle for what the device lookup proposes.
"""

from __future__ import annotations

import random

import pytest
import torch
from support.llama_models import fdecode_target, hf_greedy
from support.ngram_steps import NEW, grounded_prompts, ngram_step
from support.runs import run
from support.tiny_vocab import LANES, PROMPT, check_follows_the_target, tiny_target

import fdecode
from fdecode.ops.ngram import lookup, lookup_list


@pytest.mark.parametrize(("max_n", "min_n"), [(3, 1), (2, 2), (4, 2), (1, 1)])
def test_device_lookup_equals_the_host_lookup(max_n, min_n):
    """Random histories over 3 tokens (many matches, of every length, many running to the last token),
    several lanes at once: the latest match of the longest n wins, proposals stop at the last token."""
    rng = random.Random(max_n * 10 + min_n)
    for _ in range(40):
        lanes = [[rng.randint(0, 2) for _ in range(rng.randint(1, 14))] for _ in range(5)]
        history = torch.full((5, 20), -1)
        for b, seq in enumerate(lanes):
            history[b, : len(seq)] = torch.tensor(seq)
        got = lookup(history, torch.tensor([len(s) - 1 for s in lanes]), 3, max_n, min_n).tolist()
        for seq, row in zip(lanes, got):
            want = lookup_list(seq, 3, max_n, min_n)
            assert row == want + [-1] * (3 - len(want)), (seq, row, want)
    # A match whose continuation runs into the tail: [7, 8, 7, 8] proposes the 2 tokens after the first 7, 8.
    assert lookup_list([7, 8, 7, 8], 3, 2, 1) == [7, 8]


def test_greedy_equals_transformers_with_and_without_matches():
    prompts = grounded_prompts()
    step = ngram_step()
    outs, lengths = run(step, prompts, NEW)
    for prompt, got in zip(prompts, outs):
        assert got == hf_greedy(prompt, NEW)
    assert max(lengths) == step.config.W  # lane 0 copies whole runs out of its prompt
    assert lengths.count(1) > len(lengths) // 3  # lanes without a match commit one token per step


def test_priming_writes_the_history_and_proposes_from_it():
    step = ngram_step(max_batch=2)
    prompts = [[1, 2, 3, 4], [9, 5, 6, 7, 9, 5]]
    state = step.prefill(prompts, max_new_tokens=4)
    first = state.step_output.tokens[:, 0].tolist()
    for lane, prompt in enumerate(prompts):
        committed = prompt + [first[lane]]
        assert state.history[lane, : len(committed) + 1].tolist() == committed + [-1]
        assert state.tokens[lane, 1:].tolist() == (lookup_list(committed, 3, 3, 1) + [-1] * 3)[:3]
    state, out = step(state)  # the step appends what it commits
    for lane, prompt in enumerate(prompts):
        committed = prompt + [first[lane]] + out.tokens[lane, : out.num_tokens[lane]].tolist()
        assert state.history[lane, : len(committed) + 1].tolist() == committed + [-1]


def test_a_stop_id_inside_the_proposal_ends_the_lane():
    prompts = grounded_prompts()
    reference = hf_greedy(prompts[0], NEW)
    at = next(i for i in range(2, NEW) if reference[i] not in reference[:i])
    eos = reference[at]  # first emitted mid-way, inside the continuation lane 0 copies from its prompt
    step = ngram_step()
    state = step.prefill(prompts, max_new_tokens=NEW, eos_token_id=eos)
    outs = [state.step_output.tokens[b, : state.step_output.num_tokens[b]].tolist() for b in range(3)]
    stopped_inside = False
    while not bool(state.step_output.finished[:3].all()):
        drafts = state.tokens[0, 1:].tolist()
        state, out = step(state)
        run0 = out.tokens[0, : out.num_tokens[0]].tolist()
        stopped_inside |= eos in run0 and eos in drafts and len(drafts) > drafts.index(eos) + 1 and run0[-1] == eos
        for b in range(3):
            outs[b] += out.tokens[b, : out.num_tokens[b]].tolist()
    for prompt, got in zip(prompts, outs):
        assert got == hf_greedy(prompt, NEW, eos)
    assert outs[0] == reference[: at + 1]
    assert stopped_inside  # the stop id was a proposed draft with more proposed after it, and cut the run there


def test_ngram_settings_and_bad_ones():
    step = ngram_step(draft=fdecode.NgramDraft(max_n=2, min_n=2))
    assert (step.draft.max_n, step.draft.min_n, step.draft_kind) == (2, 2, "ngram")
    outs, _ = run(step, grounded_prompts(), NEW)
    assert outs == [hf_greedy(p, NEW) for p in grounded_prompts()]
    with pytest.raises(ValueError, match="min_n <= max_n"):
        fdecode.NgramDraft(max_n=2, min_n=3)
    with pytest.raises(ValueError, match="max_n must be a positive int"):
        fdecode.NgramDraft(max_n=0)
    other = fdecode.compile(
        fdecode_target(2),
        "ngram",
        fdecode.DecodeConfig(num_draft_tokens=3, max_batch=4, max_seq_len=64, block_size=4, backend="eager"),
    )
    with pytest.raises(ValueError, match="state.history is"):
        other(step.prefill([[1, 2]], max_new_tokens=2))


def test_engine_admissions_prime_the_history():
    step = ngram_step(k=2, max_batch=2, backend="dynamo")
    engine = fdecode.Engine(step)
    prompts = grounded_prompts()
    want, got, pending, tick = {}, {}, list(enumerate(prompts)), 0
    while pending or engine.has_work():
        if pending and tick % 3 == 0:  # arrivals while other lanes decode
            _, prompt = pending.pop(0)
            want[engine.add_request(list(prompt), max_new_tokens=NEW)] = hf_greedy(prompt, NEW)
        for event in engine.step():
            got[event.request_id] = got.get(event.request_id, []) + event.new_tokens
        tick += 1
        assert tick < 200
    assert got == want


def test_one_graph_without_host_syncs():
    step = ngram_step()
    state = step.prefill(grounded_prompts(), max_new_tokens=NEW)
    for plan in (None, step.plans[1]):  # the plan this state runs (greedy) and the candidate plan (random lanes)
        report = fdecode.inspect(step, state, plan=plan)
        assert report.graph_count == 1 and report.graph_break_count == 0, report
        assert not report.host_syncs, report.host_syncs


CASES = [  # (K, sampling parameters): the full-vocabulary plan and the candidate plan
    (2, dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)),
    (3, dict(temperature=0.8, top_k=4, top_p=0.9, min_p=0.0)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("k", "params"), CASES)
def test_random_lanes_follow_the_filtered_target(k, params):
    """Point-mass proposals out of each lane's history (the prompt repeats tokens of V = 5, so most
    steps propose something): the three new tokens follow the target's filtered distribution."""
    target = tiny_target()
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=LANES, max_seq_len=12, block_size=4, backend="eager")
    step = fdecode.compile(target, fdecode.NgramDraft(max_n=2, min_n=1), cfg)
    state = step.prefill([PROMPT] * LANES, max_new_tokens=3, seed=list(range(LANES)), **params)
    proposed = (state.tokens[:, 1] >= 0).float().mean()
    _, out = step(state)
    assert 0.2 < proposed < 1 and (out.num_tokens > 1).any()  # proposals, some accepted, and lanes without
    check_follows_the_target(step, target, params)


def test_the_before_loop_looks_up_on_the_host_and_matches():
    """The bench's before loop with an n-gram draft (host lookup between its read and its upload) commits
    transformers' greedy tokens in as many iterations as the step takes steps."""
    from fdecode.baseline import BeforeLoop

    prompts = grounded_prompts()
    step = ngram_step(max_batch=3)
    got, iterations = BeforeLoop(step, backend="eager").generate(prompts, max_new_tokens=NEW)
    assert got == [hf_greedy(p, NEW) for p in prompts]
    state, steps = step.prefill(prompts, max_new_tokens=NEW), 0
    while not bool(state.step_output.finished[:3].all()):
        state, _ = step(state)
        steps += 1
    assert iterations == steps


def test_a_hybrid_target_with_ngram_drafts_equals_transformers():
    """Qwen3.5 (Gated DeltaNet + gated attention): the verify's recurrent rollback works with lookup drafts
    (a prompt that repeats itself, so drafts are accepted and rejected)."""
    from support import hybrid_models

    first = hybrid_models.hf_greedy(hybrid_models.PROMPTS[0])
    prompts = [hybrid_models.PROMPTS[0] + tuple(first) + hybrid_models.PROMPTS[0], hybrid_models.PROMPTS[2]]
    step = hybrid_models.compiled(hybrid_models.hybrid_target(), "ngram", 3)
    outs, lengths, _ = hybrid_models.run(step, prompts)
    assert outs == [hybrid_models.hf_greedy(p) for p in prompts]
    assert max(lengths) > 1 and min(lengths) == 1
