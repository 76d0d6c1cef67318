"""Lossless greedy: speculative output == transformers' greedy output, token for token.

Whatever the draft proposes, the committed tokens must be the target's greedy
tokens; the draft only changes how many arrive per step.
"""

from __future__ import annotations

import pytest
import torch
from support import kernel_semantics
from support.hand_grammar import parity
from support.llama_models import VOCAB, fdecode_target, hf_greedy, independent_draft
from support.processor_oracle import hf_processed
from support.runs import NEW, PROMPTS, build, run

import fdecode
from fdecode import SamplingParams
from fdecode.graphs import backends
from fdecode.ops import kv


def check_against_hf(step, layers, eos=None):
    outs, lengths = run(step, eos=eos)
    for prompt, got in zip(PROMPTS, outs):
        assert got == hf_greedy(prompt, NEW, eos, layers)
    return lengths


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("draft_kind", ["model", "mtp"])
@pytest.mark.parametrize("kind", ["self", "partial", "random"])
def test_greedy_equals_transformers_eager(kind, draft_kind, k):
    step, layers = build(kind, draft_kind, k)
    lengths = check_against_hf(step, layers)
    window = k + 1
    mean = sum(lengths) / len(lengths)
    if kind == "self":
        # The last step of a lane is cut by the budget, so allow a little below W.
        assert mean >= 0.85 * window, lengths
    elif kind == "random":
        assert mean <= 1.5, lengths
    else:
        assert len(set(lengths)) >= 2, f"expected a mixture of accepted lengths, got {lengths}"


def test_generate_matches_and_stops_at_eos():
    step, layers = build("partial", "model", 3)
    reference = hf_greedy(PROMPTS[0], NEW, None, layers)
    eos = reference[5]  # a token the target really emits, mid-sequence
    got = fdecode.generate(step, PROMPTS, max_new_tokens=NEW, eos_token_id=eos)
    for prompt, seq in zip(PROMPTS, got):
        assert seq == hf_greedy(prompt, NEW, eos, layers)
    assert got[0][-1] == eos and len(got[0]) <= 6


# Inductor at a capacity that is not a whole number of blocks (57 tokens, 8 blocks of 8 = 64 slots), as users
# pick it (prompt + new tokens), with the one graph of every window: its widest window reads 64 positions,
# more than max_seq_len + K + 1 (an n-gram history of that width failed to compile). K = 1 keeps each
# Inductor compile in CI's budget; the MTP head's Inductor test is DeepSeek's (tests/test_deepseek_v3_step.py).
UNALIGNED = dict(max_seq_len=57, block_size=8, context_buckets=(16, 32), layer_regions=True)
# Greedy lanes beside random ones (top-k): one graph runs both, the sampling plan that serves them all. Each
# asks min_tokens=1, which changes nothing where no stop id is set, so that they run the plan's graph with the
# logit processors: the graph PROCESSED's lanes run below, compiled once for both.
MIXED = dict(
    max_new_tokens=None,
    params=[
        SamplingParams(temperature=t, top_k=k, seed=s, min_tokens=1, max_new_tokens=NEW)
        for t, k, s in ((0.0, 0, 3), (0.9, 20, 42), (0.0, 0, 8))
    ],
)


@pytest.mark.slow
def test_inductor_greedy_lanes_equal_transformers_and_random_lanes_equal_eager():
    """Inductor's code for every phase of a sampling step: its greedy lanes commit transformers' tokens, its
    random lanes the same tokens as the eager step with the same seeds, bit for bit (the counter-based
    PRNG and the filters compile to the same numbers)."""
    step, layers = build("partial", "model", 1, backend="inductor", **UNALIGNED, **FEATURES)
    assert step.backend == "inductor" and step.dynamic_window and step.config.max_seq_len % 8
    assert step.config.layer_regions  # layers run as compile regions (`fdecode.models.regions`)
    outs, lengths = run(step, **MIXED)
    for lane in (0, 2):
        assert outs[lane] == hf_greedy(PROMPTS[lane], NEW, None, layers)
    eager, _ = build("partial", "model", 1, **UNALIGNED, **FEATURES)
    assert run(eager, **MIXED)[0] == outs
    assert outs[1] != hf_greedy(PROMPTS[1], NEW, None, layers)  # the random lane did sample
    assert len(set(lengths)) >= 2
    # The same graphs with each request feature (`fdecode.ops.processors`, logprobs) in a lane of its own:
    # greedy lanes == transformers' processors, the random lane == the eager step's, bit for bit.
    graphs = len(step.graphs)
    with torch._dynamo.config.patch(error_on_recompile=True):
        tokens, logprobs = processed_run(step)
    assert len(step.graphs) == graphs  # the features need no graph of their own and recompile nothing
    assert tokens == processed_run(eager)[0]
    for (prompt, params), got, lps in zip(PROCESSED, tokens, logprobs):
        if params.temperature == 0:
            want, out = hf_processed(prompt, params, params.max_new_tokens, params.eos_token_id, output_logits=True)
            assert got == want, params
            rows = torch.log_softmax(torch.cat(out.logits).float(), dim=-1)
            if params.logprobs is not None:
                assert [lp.logprob for lp in lps] == pytest.approx(
                    [rows[i, t].item() for i, t in enumerate(got)], abs=1e-4
                )


FEATURES = dict(
    penalties=True, min_tokens=True, max_logit_bias=2, max_logprobs=2, max_grammar_states=8, max_grammar_transitions=192
)
_EOS = 48  # greedy decoding emits it third after PROMPTS[2]: min_tokens masks it
PROCESSED = [
    (
        PROMPTS[0],
        SamplingParams(
            repetition_penalty=0.7,
            frequency_penalty=-0.3,
            presence_penalty=0.4,
            logit_bias={17: 1.0, 41: 2.0},
            logprobs=2,
            max_new_tokens=NEW,
            eos_token_id=[],
        ),
    ),
    (PROMPTS[2], SamplingParams(min_tokens=12, eos_token_id=_EOS, max_new_tokens=NEW, logprobs=0)),
    (PROMPTS[0], SamplingParams(grammar=parity(VOCAB, VOCAB - 1), eos_token_id=VOCAB - 1, max_new_tokens=NEW)),
    (
        PROMPTS[1],
        SamplingParams(
            temperature=0.9,
            top_k=20,
            seed=42,
            repetition_penalty=1.3,
            frequency_penalty=0.2,
            max_new_tokens=45,
            eos_token_id=[],
        ),
    ),  # >= 23 steps, the others <= 20: the plan stays
]


def processed_run(step):
    engine = fdecode.Engine(step)
    ids = [engine.add_request(list(prompt), params) for prompt, params in PROCESSED]
    tokens, logprobs = {rid: [] for rid in ids}, {rid: [] for rid in ids}
    for event in engine.stream():
        tokens[event.request_id] += event.new_tokens
        logprobs[event.request_id] += event.logprobs or []
    return [tokens[rid] for rid in ids], [logprobs[rid] for rid in ids]


@pytest.mark.slow
def test_inductor_ngram_drafts_are_lossless():
    step, layers = build("partial", "ngram", 1, backend="inductor", **UNALIGNED)
    assert step.backend == "inductor" and step.dynamic_window
    check_against_hf(step, layers)  # these prompts repeat nothing to look up: lengths of 1 are expected


def test_greedy_only_step_is_lossless_and_leaner():
    target = fdecode_target(2)
    draft = independent_draft("partial", target)
    # Eager steps: `fdecode.inspect` captures each graph as the backend would (the one capture each).
    base = dict(num_draft_tokens=3, max_batch=4, max_seq_len=64, block_size=4, backend="eager")
    lean = fdecode.compile(target, draft, fdecode.DecodeConfig(**base, sampling=False))
    full = fdecode.compile(target, draft, fdecode.DecodeConfig(**base))
    check_against_hf(lean, 2)
    state = lean.prefill(PROMPTS, max_new_tokens=NEW)
    lean_report, full_report = fdecode.inspect(lean, state), fdecode.inspect(full, state, plan="full+top_k+top_p")
    assert full.plan_for(state).name == "greedy"  # greedy lanes run the greedy graph by default
    assert lean_report.graph_count == 1 and lean_report.host_syncs == []
    assert "aten::cumsum" in full_report.op_counts and "aten::cumsum" not in lean_report.op_counts  # no sampling
    assert sum(lean_report.op_counts.values()) < sum(full_report.op_counts.values()) / 2
    with pytest.raises(ValueError, match="sampling=True"):
        lean.prefill(PROMPTS, max_new_tokens=4, temperature=0.5)


@pytest.mark.parametrize("draft_kind", ["model", "mtp"])
def test_greedy_equals_transformers_with_the_npu_kv_write(draft_kind, monkeypatch):
    """The NPU's KV write (ScatterNdUpdate rows (layer, kind, slot), `fdecode.ops.kv`) taken on CPU:
    the same tokens as transformers, with a mixture of accepted lengths."""
    monkeypatch.setitem(kv.KV_WRITE, "cpu", "scatter_nd")
    step, layers = build("partial", draft_kind, 3)
    assert len(set(check_against_hf(step, layers))) >= 2


@pytest.mark.parametrize("draft_kind", ["model", "mtp"])
@pytest.mark.parametrize("kernel", ["flash_attn", "npu_fused_infer_attention"])
def test_greedy_equals_transformers_through_a_device_kernel_adapter(kernel, draft_kind, monkeypatch):
    """Whole generations through a device kernel's adapter, the kernel being its documented semantics
    (tests/support/kernel_semantics.py): every forward's rows (verify, repair + current, single drafts, prefill)
    see the right keys. For the NPU, with its KV write too: the NPU step, less the device."""
    monkeypatch.setitem(backends.ATTENTION_ELIGIBILITY, kernel, lambda cfg, shapes: None)  # only the device check
    if kernel == "npu_fused_infer_attention":
        monkeypatch.setitem(kv.KV_WRITE, "cpu", "scatter_nd")
    step, layers = build("partial", draft_kind, 3, attention=kernel)
    assert step.config.attention == kernel
    expected = [hf_greedy(prompt, NEW, None, layers) for prompt in PROMPTS]  # before transformers sees the fakes
    kernel_semantics.install(monkeypatch, kernel)
    outs, lengths = run(step)
    assert outs == expected and len(set(lengths)) >= 2
