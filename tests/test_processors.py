"""Logit bias, min_tokens and repetition / frequency / presence penalties under speculation, and logprobs.

Greedy lanes equal transformers' `generate` with its own processors (`repetition_penalty`, `sequence_bias`,
`min_new_tokens`, and a `LogitsProcessor` for OpenAI's frequency / presence penalties), with a draft LM,
an MTP head and n-gram drafts; random lanes follow the processed, filtered target exactly (chi-square over
every three-token outcome of a 5-token vocabulary, the penalties enumerated by an independent reference);
logprobs equal the log_softmax of transformers' logits (raw) or scores (processed).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from support.llama_models import fdecode_target, independent_draft, mtp_head
from support.processor_oracle import TINY_REQUEST, hf_processed, reference_next
from support.stats import ALPHA, chi2_pvalue
from support.tiny_vocab import PROMPT, TINY, V, tiny_draft, tiny_target

import fdecode
from fdecode import SamplingParams

PROMPTS = [(5, 17, 33, 2, 9, 41, 60, 5, 17), (7, 3), (11, 12, 13, 14, 15, 80, 81, 82, 83, 11, 12)]
NEW = 16
FEATURES = dict(penalties=True, min_tokens=True, max_logit_bias=3, max_logprobs=3)


def hf_generate(prompt, params: SamplingParams, eos=None, **extra):
    return hf_processed(prompt, params, NEW, eos, **extra)


REQUESTS = {
    "repetition": SamplingParams(repetition_penalty=1.8),
    "frequency_presence": SamplingParams(frequency_penalty=0.9, presence_penalty=0.6),
    "logit_bias": SamplingParams(logit_bias={3: 2.5, 40: 1.5, 77: -9.0}),
    "all": SamplingParams(repetition_penalty=0.7, frequency_penalty=-0.3, presence_penalty=0.4, logit_bias={17: 1.0}),
}


def build(draft_kind: str, backend: str = "eager", **features):
    target = fdecode_target(2)
    draft = {
        "model": lambda: independent_draft("partial", target),
        "mtp": lambda: mtp_head("partial", target),
        "ngram": lambda: "ngram",
    }[draft_kind]()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=3,
        max_batch=3,
        max_seq_len=64,
        block_size=4,
        backend=backend,
        eos_token_id=None,
        **(features or FEATURES),
    )
    return fdecode.compile(target, draft, cfg)


@pytest.fixture(scope="module", params=["model", "mtp", "ngram"])
def step(request):
    return build(request.param)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_greedy_with_processors_equals_transformers(step, name):
    params = REQUESTS[name].replace(max_new_tokens=NEW)
    got = fdecode.generate(step, [list(p) for p in PROMPTS], params=params)
    want = [hf_generate(p, params)[0] for p in PROMPTS]
    assert got == want
    plain = fdecode.generate(step, [list(p) for p in PROMPTS], max_new_tokens=NEW)
    assert plain != got  # the processors changed what greedy decoding commits


def test_min_tokens_masks_stop_ids_inside_the_window(step):
    """A stop id the target would emit early is masked until min_tokens, then ends the request."""
    prompt = list(PROMPTS[0])
    plain = fdecode.generate(step, [prompt], max_new_tokens=NEW)[0]
    eos = plain[2]  # greedy decoding would stop on its third token
    assert fdecode.generate(step, [prompt], max_new_tokens=NEW, eos_token_id=eos)[0] == plain[:3]
    params = SamplingParams(min_tokens=9, eos_token_id=eos, max_new_tokens=NEW)
    got = fdecode.generate(step, [prompt], params=params)[0]
    want = hf_generate(prompt, params, eos=eos)[0]
    assert got == want and eos not in got[:9]


def test_mixed_lanes_in_the_engine_each_get_their_own_processors(step):
    """Lanes with different features, admitted mid-flight (more requests than lanes), each equal
    transformers for their own request; a lane without features decodes as without processors."""
    engine = fdecode.Engine(step)
    requests = [(p, REQUESTS[name].replace(max_new_tokens=NEW)) for p in PROMPTS for name in ("all", "repetition")]
    requests.append((PROMPTS[1], SamplingParams(max_new_tokens=NEW)))
    ids = [engine.add_request(list(p), params) for p, params in requests]
    results = engine.run()
    for rid, (prompt, params) in zip(ids, requests):
        assert results[rid] == hf_generate(prompt, params)[0], params


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_logprobs_equal_transformers_logits_or_scores(mode):
    step = build("model", **{**FEATURES, "logprobs_mode": mode})
    params = REQUESTS["repetition"].replace(max_new_tokens=NEW, logprobs=2)
    engine = fdecode.Engine(step)
    engine.add_request(list(PROMPTS[0]), params)
    tokens, logprobs = [], []
    for event in engine.stream():
        assert event.logprobs is not None and len(event.logprobs) == len(event.new_tokens)
        tokens += event.new_tokens
        logprobs += event.logprobs
    want, out = hf_generate(PROMPTS[0], params, output_logits=True, output_scores=True)
    assert tokens == want and [lp.token for lp in logprobs] == tokens
    rows = torch.log_softmax(torch.cat(out.logits if mode == "raw" else out.scores).float(), dim=-1)
    for lp, row, t in zip(logprobs, rows, tokens):
        assert lp.logprob == pytest.approx(row[t].item(), abs=1e-4)
        values, top = torch.topk(row, 2)
        assert list(lp.top) == top.tolist()
        assert list(lp.top.values()) == pytest.approx(values.tolist(), abs=1e-4)
    # A request without logprobs gets none; one over the step's maximum is refused before it runs.
    engine.add_request(list(PROMPTS[1]), SamplingParams(max_new_tokens=3))
    assert all(event.logprobs is None for event in engine.stream())
    with pytest.raises(ValueError, match="max_logprobs"):
        engine.add_request(list(PROMPTS[1]), SamplingParams(logprobs=4))


def test_lanes_without_processors_run_the_graph_without_them():
    """A batch none of whose lanes uses a processor runs its plan's twin without them: no counts, bias or
    stop-id passes in the graph, transformers' plain greedy tokens; a lane that uses one brings them back."""
    step = build("model")
    prompts = [list(p) for p in PROMPTS]
    plain = SamplingParams(max_new_tokens=NEW, logprobs=1)
    state = step.prefill(prompts, params=plain)
    assert step.plan_for(state).unprocessed and step.plan_for(state).name == "greedy, no processors"
    report = fdecode.inspect(step, state)
    assert report.graph_count == 1 and report.host_syncs == [] and "aten::scatter_add" not in report.op_counts
    mixed = step.prefill(prompts, params=[plain, REQUESTS["all"].replace(max_new_tokens=NEW), plain])
    assert not step.plan_for(mixed).unprocessed and "aten::scatter_add" in fdecode.inspect(step, mixed).op_counts
    assert fdecode.generate(step, prompts, plain) == [hf_generate(p, plain)[0] for p in PROMPTS]


def test_features_the_step_was_not_compiled_for_are_refused():
    step = build("ngram", penalties=False)
    for params, name in (
        (SamplingParams(repetition_penalty=1.2), "penalties"),
        (SamplingParams(min_tokens=2), "min_tokens"),
        (SamplingParams(logit_bias={1: 1.0}), "max_logit_bias"),
        (SamplingParams(logprobs=0), "max_logprobs"),
    ):
        with pytest.raises(ValueError, match=name):
            fdecode.generate(step, [[1, 2]], params=params)
    with pytest.raises(ValueError, match="not an id"):
        fdecode.generate(build("ngram"), [[1, 2]], params=SamplingParams(logit_bias={10_000: 1.0}))
    with pytest.raises(ValueError, match="max_logit_bias is 3"):
        fdecode.generate(build("ngram"), [[1, 2]], params=SamplingParams(logit_bias={1: 1, 2: 1, 3: 1, 4: 1}))


# --------------------------------------------------------------------------- random lanes: exactness


@pytest.mark.parametrize("kind", ["random", "self"])
def test_random_lanes_with_processors_follow_the_processed_target(kind):
    target = tiny_target()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=2,
        max_batch=64,
        max_seq_len=16,
        block_size=4,
        backend="eager",
        penalties=True,
        min_tokens=True,
        max_logit_bias=2,
    )
    step = fdecode.compile(target, tiny_draft(kind, target), cfg)
    samples = []
    for batch in range(30):
        params = [TINY_REQUEST.replace(seed=1000 * batch + lane) for lane in range(64)]
        samples += fdecode.generate(step, [PROMPT] * 64, params=params)
    assert all(len(s) == 3 and 0 not in s[:2] for s in samples)  # min_tokens: no stop id before the third
    cells = torch.tensor([(a * V + b) * V + c for a, b, c in samples])
    expected = torch.zeros(V, V, V, dtype=torch.float64)
    p1 = reference_next(target, [], TINY_REQUEST)
    for a in range(V):
        p2 = reference_next(target, [a], TINY_REQUEST)
        for b in range(V):
            expected[a, b] = p1[a] * p2[b] * reference_next(target, [a, b], TINY_REQUEST)
    counts = torch.bincount(cells, minlength=V**3)
    assert chi2_pvalue(counts, expected.flatten()) > ALPHA
    assert counts[expected.flatten() == 0].sum() == 0


def test_counts_memory_scales_with_the_vocabulary():
    """The penalty counts are 5 bytes per token per lane ([B, V] int32 counts + bool prompt marks)."""
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=1, max_batch=2, max_seq_len=16, block_size=4, backend="eager", penalties=True
    )
    state = fdecode.compile(tiny_target(), "ngram", cfg).empty_state()
    assert state.counts.shape == state.seen.shape == (2, TINY.vocab_size)
    assert state.counts.element_size() + state.seen.element_size() == 5
    plain = fdecode.compile(tiny_target(), "ngram", dataclasses.replace(cfg, penalties=False)).empty_state()
    assert plain.counts is plain.seen is plain.penalties is None  # absent, not [B, 0] (`fdecode.state.parts`)


def test_every_feature_stays_in_the_one_graph():
    """With every feature compiled and used: one graph, no break, no host sync, one prepare op."""
    step = build("model", **FEATURES)
    params = [
        REQUESTS["all"].replace(max_new_tokens=NEW, logprobs=3, min_tokens=4),
        SamplingParams(temperature=0.8, top_k=5, seed=1, repetition_penalty=1.2, logprobs=1, max_new_tokens=NEW),
    ]
    state = step.prefill([list(p) for p in PROMPTS[:2]], params=params)
    report = fdecode.inspect(step, state)
    assert (report.graph_count, report.graph_break_count, report.host_syncs) == (1, 0, [])
    assert report.op_counts["fdecode::prepare_next_draft"] == 1
    assert "aten::scatter_add" in report.op_counts and "aten::topk" in report.op_counts


def test_generate_with_details_returns_logprobs_reasons_and_metrics(step):
    """`generate(..., details=True)`: the same tokens, with what the Engine's events carried."""
    prompts = [list(p) for p in PROMPTS]
    params = [
        REQUESTS["repetition"].replace(max_new_tokens=NEW, logprobs=1),
        SamplingParams(max_new_tokens=5),
        SamplingParams(max_new_tokens=NEW, eos_token_id=fdecode.generate(step, [prompts[2]], max_new_tokens=4)[0][3]),
    ]
    done = fdecode.generate(step, prompts, params, details=True)
    assert [c.tokens for c in done] == fdecode.generate(step, prompts, params)
    assert [lp.token for lp in done[0].logprobs] == done[0].tokens and all(len(lp.top) == 1 for lp in done[0].logprobs)
    assert done[1].logprobs is None and [c.reason for c in done] == ["length", "length", "stop"]
    for c in done:  # every token but the first came from a verified or first-row step
        m = c.metrics
        assert len(c.tokens) <= 1 + m.drafts_accepted + m.verified_steps + m.first_row_steps
        assert m.verified_steps + m.first_row_steps >= 1


def test_processed_logprobs_of_random_lanes_are_those_of_the_distribution_sampled_from():
    """A random lane's processed logprob is log p of the processed, filtered distribution (-inf outside it)."""
    target = tiny_target()
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=2,
        max_batch=8,
        max_seq_len=16,
        block_size=4,
        backend="eager",
        penalties=True,
        min_tokens=True,
        max_logit_bias=2,
        max_logprobs=V,
        logprobs_mode="processed",
    )
    step = fdecode.compile(target, tiny_draft("random", target), cfg)
    request = TINY_REQUEST.replace(top_k=3, logprobs=V)
    done = fdecode.generate(step, [PROMPT] * 8, [request.replace(seed=s) for s in range(8)], details=True)
    for completion in done:
        for i, lp in enumerate(completion.logprobs):
            want = reference_next(target, completion.tokens[:i], request).log()
            assert lp.logprob == pytest.approx(want[lp.token].item(), abs=1e-4)
            assert sorted(lp.top) == sorted(range(V)) and all(
                lp.top[t] == pytest.approx(want[t].item(), abs=1e-4) or want[t] == -math.inf for t in range(V)
            )
