"""Bad input fails with a clear ValueError/TypeError before anything runs."""

from __future__ import annotations

import pytest
import torch
import transformers
from support.llama_models import fdecode_target, independent_draft

import fdecode
from fdecode.drafts import LM
from fdecode.models import LlamaModel, MTPHead
from fdecode.models.parallel import TPGroup
from fdecode.models.sharding import parallelize_pair

CFG = dict(num_draft_tokens=2, max_batch=2, max_seq_len=32, block_size=4, backend="eager")


@pytest.fixture(scope="module")
def step():
    target = fdecode_target(2)
    return fdecode.compile(target, independent_draft("random", target), fdecode.DecodeConfig(**CFG))


@pytest.mark.parametrize(
    ("prompts", "kwargs", "error", "match"),
    [
        ([], {}, ValueError, "empty"),
        ([[1, 2], []], {}, ValueError, "prompt 1.*is empty"),
        ([[1, 96]], {}, ValueError, "outside the vocabulary"),
        ([[1, -3]], {}, ValueError, "outside the vocabulary"),
        ([[1] * 20], {"max_new_tokens": 13}, ValueError, "max_seq_len 32"),
        ([[1] * 32], {}, ValueError, "no room"),
        ([[1, 2]], {"max_new_tokens": 0}, ValueError, "positive"),
        ([[1, 2]], {"eos_token_id": 500}, ValueError, "eos token id"),
        ([[1, 2]], {"eos_token_id": [1, 2, 3, 4, 5]}, ValueError, "max_stop_ids"),
        ("hello", {}, TypeError, r"must be a list of"),  # one text, not a list of prompts
        ([[1.5, 2]], {}, TypeError, "must be ints"),
        ([torch.ones(2, 2, dtype=torch.long)], {}, TypeError, "1-D integer tensor"),
    ],
)
def test_bad_prompts(step, prompts, kwargs, error, match):
    with pytest.raises(error, match=match):
        step.prefill(prompts, **kwargs)
    with pytest.raises(error, match=match):
        fdecode.generate(step, prompts, **{"max_new_tokens": 4, **kwargs})


def test_more_prompts_than_lanes(step):
    with pytest.raises(ValueError, match="max_batch is 2"):
        step.prefill([[1, 2], [3], [4]])
    # generate() queues them instead: three prompts through two lanes.
    assert [len(o) for o in fdecode.generate(step, [[1, 2], [3], [4]], max_new_tokens=3)] == [3, 3, 3]


def test_prompt_tensor_is_accepted(step):
    state = step.prefill([torch.tensor([1, 2, 3])], max_new_tokens=4)
    assert int(state.step_output.num_tokens[0]) == 1


def test_pool_too_small_for_the_prompts():
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(**{**CFG, "num_blocks": 4})
    step = fdecode.compile(target, independent_draft("random", target), cfg)
    with pytest.raises(ValueError, match="KV blocks"):
        step.prefill([[1] * 10, [2] * 10], max_new_tokens=10)


def test_vocabulary_mismatch():
    """A draft LM of another vocabulary size runs (tests/test_draft_vocab.py), but not under tensor
    parallelism, and an MTP head shares the target's embedding: it must have its vocabulary."""
    target = fdecode_target(2)
    other = LlamaModel.random(target.config.replace(vocab_size=48), seed=1)
    with pytest.raises(ValueError, match=r"vocabulary \(48\) differs .* tensor parallelism"):
        parallelize_pair(target, other, LM, TPGroup(None, 0, 2))
    head = MTPHead.random(target.config.replace(vocab_size=48), seed=1)
    with pytest.raises(ValueError, match="vocabulary"):
        fdecode.compile(target, head, fdecode.DecodeConfig(**CFG))


def test_unsupported_model_type():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=96))
    with pytest.raises(ValueError, match="gpt2"):
        fdecode.compile(gpt2, "mtp", fdecode.DecodeConfig(**CFG))


def test_not_a_model():
    with pytest.raises(TypeError, match="target must be"):
        fdecode.compile(42, "mtp", fdecode.DecodeConfig(**CFG))
    with pytest.raises(TypeError, match="DecodeConfig"):
        fdecode.compile(fdecode_target(2), "mtp", {"num_draft_tokens": 2})


def test_mtp_requested_without_a_head():
    with pytest.raises(ValueError, match="no MTP head.*pass draft='ngram' \\(prompt lookup"):
        fdecode.compile(fdecode_target(2), "mtp", fdecode.DecodeConfig(**CFG))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"num_draft_tokens": 0}, "num_draft_tokens"),
        ({"max_batch": -1}, "max_batch"),
        ({"block_size": 2.5}, "block_size"),
        ({"backend": "tensorrt"}, "backend"),
        ({"num_blocks": 1}, "num_blocks"),
        ({"draft_catch_up": -1}, "draft_catch_up must be an int >= 0"),
        ({"draft_catch_up": True}, "draft_catch_up must be an int >= 0"),
        ({"top_k_candidates": 2.5}, "top_k_candidates must be an int >= 0"),
    ],
)
def test_bad_config(change, match):
    with pytest.raises(ValueError, match=match):
        fdecode.DecodeConfig(**{**CFG, **change})
    with pytest.raises(TypeError, match="dtype"):
        fdecode.DecodeConfig(**{**CFG, "dtype": torch.int32})


def test_a_consumed_state_is_refused(step):
    state = step.prefill([[1, 2, 3]], max_new_tokens=6)
    keep = state.clone()
    new_state, _ = step(state)
    with pytest.raises(ValueError, match="donation contract"):
        step(state)
    step(new_state)  # the returned state is the live one
    step(keep)  # and a clone taken beforehand is independent


def test_state_from_another_config_is_refused(step):
    target = fdecode_target(2)
    other = fdecode.compile(
        target, independent_draft("random", target), fdecode.DecodeConfig(**{**CFG, "num_draft_tokens": 3})
    )
    state = other.prefill([[1, 2]], max_new_tokens=3)
    with pytest.raises(ValueError, match="another DecodeConfig"):
        step(state)
    with pytest.raises(TypeError, match="DecodeState"):
        step({"tokens": state.tokens})


def test_ineligible_backend_raises_or_falls_back(monkeypatch):
    from fdecode.graphs import backends

    monkeypatch.setitem(backends.ELIGIBILITY, "inductor", lambda cfg, target, draft, kind: "no compiler in this test")
    cfg = fdecode.DecodeConfig(**{**CFG, "backend": "inductor"})
    target = fdecode_target(2)
    with pytest.raises(ValueError, match="no compiler in this test"):
        fdecode.compile(target, independent_draft("random", target), cfg)
    step = fdecode.compile(target, independent_draft("random", target), cfg, fallback=True)
    assert step.backend == "eager" and "no compiler in this test" in step.fallback_reason
    auto = fdecode.compile(
        target, independent_draft("random", target), fdecode.DecodeConfig(**{**CFG, "backend": "auto"})
    )
    assert auto.backend == "eager" and "inductor: no compiler" in auto.fallback_reason


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"temperature": float("nan")}, "finite"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -1}, "top_k must be an int >= 0"),
        ({"top_k": 2.5}, "top_k must be an int >= 0"),
        ({"min_p": 2.0}, r"min_p must be in \[0, 1\]"),
        ({"seed": -1}, "seed must be an int"),
        ({"temperature": [0.5, 0.5, 0.5]}, "3 values for 1 prompts"),
        ({"temperature": "hot"}, "must be a number or one per prompt"),
    ],
)
def test_bad_sampling_parameters(step, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        step.prefill([[1, 2]], max_new_tokens=3, **kwargs)


# One label per message: a prompt's errors name it once ("prompt 1: ..." in a batch, "prompt: ..." for
# Engine.add_request's single prompt); whole-call arguments (max_new_tokens, eos_token_id) name none.
BATCH_MESSAGES = [
    ([[1, 2], [1, 99]], {}, ValueError, r"prompt 1: token id 99 is outside the vocabulary \[0, 96\)"),
    ([[1, 2], []], {}, ValueError, r"prompt 1 is empty"),
    ([[1, 2], [1.5]], {}, TypeError, r"prompt 1: token ids must be ints, got 1\.5"),
    (
        [[1, 2], {"input_ids": [3]}],
        {},
        TypeError,
        r"prompt 1: expected a sequence of token ids, got dict \(pass its \['input_ids'\]\)",
    ),
    (
        [[1, 2], [1] * 20],
        {"max_new_tokens": 13},
        ValueError,
        r"prompt 1: 20 tokens \+ max_new_tokens 13 exceed max_seq_len 32",
    ),
    ([[1, 2], [1] * 32], {}, ValueError, r"prompt 1 has 32 tokens; max_seq_len 32 leaves no room to generate"),
    ([[1, 2], [1] * 32], {"max_new_tokens": 0}, ValueError, r"max_new_tokens must be a positive int, got 0"),
    ([[1, 2]], {"max_new_tokens": 2.0}, ValueError, r"max_new_tokens must be a positive int, got 2\.0"),
    ([[1, 2]], {"eos_token_id": 500}, ValueError, r"eos token id 500 is not an id in \[0, 96\)"),
    ([[1, 2]], {"eos_token_id": [1, 2, 3, 4, 5]}, ValueError, r"5 eos ids but DecodeConfig.max_stop_ids is 4"),
    # Whole-call sampling values name only the argument; one per prompt names the prompt once.
    ([[1, 2], [3]], {"temperature": -1.0}, ValueError, r"temperature must be >= 0 \(0 = greedy\), got -1.0"),
    ([[1, 2], [3]], {"top_k": 2.5}, ValueError, r"top_k must be an int >= 0 \(0 = off\), got 2.5"),
    ([[1, 2], [3]], {"seed": -1}, ValueError, r"seed must be an int in \[0, 2\*\*63\), got -1"),
    ([[1, 2], [3]], {"top_p": [0.5, 1.5]}, ValueError, r"prompt 1: top_p must be in \(0, 1\], got 1.5"),
    ([[1, 2], [3]], {"min_p": [0.5]}, ValueError, r"min_p has 1 values for 2 prompts"),
]


@pytest.mark.parametrize(("prompts", "kwargs", "error", "message"), BATCH_MESSAGES)
def test_batch_error_messages_carry_one_label(step, prompts, kwargs, error, message):
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(error, match=f"^{message}$"):
        fdecode.generate(step, prompts, progress=False, **kwargs)
    with pytest.raises(error, match=f"^{message}$"):
        step.prefill(prompts, **kwargs)


def test_a_text_prompt_needs_a_tokenizer_and_prefill_takes_token_ids_only(step):
    """generate takes text where it has a tokenizer (`fdecode.text`): this step's target has none, so it says
    how to give one; `Step.prefill` takes token ids only, and names the prompt that is not."""
    with pytest.raises(ValueError, match=r"^text prompts need a tokenizer: pass tokenizer="):
        fdecode.generate(step, [[1, 2], "ab"], max_new_tokens=4, progress=False)
    with pytest.raises(TypeError, match=r"^prompt 1: expected a sequence of token ids, got str$"):
        step.prefill([[1, 2], "ab"], max_new_tokens=4)


@pytest.mark.parametrize(
    ("prompt", "kwargs", "error", "message"),
    [
        ([1, 99], {}, ValueError, r"prompt: token id 99 is outside the vocabulary \[0, 96\)"),
        ([], {}, ValueError, r"prompt is empty"),
        ([1] * 20, {"max_new_tokens": 13}, ValueError, r"prompt: 20 tokens \+ max_new_tokens 13 exceed max_seq_len 32"),
        ([1] * 32, {}, ValueError, r"prompt has 32 tokens; max_seq_len 32 leaves no room to generate"),
        ([1] * 32, {"max_new_tokens": -1}, ValueError, r"max_new_tokens must be a positive int, got -1"),
        ([1, 2], {"eos_token_id": 500}, ValueError, r"eos token id 500 is not an id in \[0, 96\)"),
        ([1, 2], {"temperature": -1}, ValueError, r"temperature must be >= 0 \(0 = greedy\), got -1.0"),
        ([1, 2], {"temperature": [0.5]}, TypeError, r"temperature must be a number, got list"),
    ],
)
def test_add_request_error_messages_carry_one_label(step, prompt, kwargs, error, message):
    engine = fdecode.Engine(step)
    with pytest.raises(error, match=f"^{message}$"):
        engine.add_request(prompt, **{"max_new_tokens": 4, **kwargs})


def test_a_request_the_pool_can_never_hold_names_its_prompt_once():
    target = fdecode_target(2)
    small = fdecode.compile(
        target, independent_draft("random", target), fdecode.DecodeConfig(**{**CFG, "num_blocks": 4})
    )
    capacity = r"needs 5 KV blocks \(10 tokens \+ max_new_tokens 10\) but the pool has 3: it could never be admitted"
    with pytest.raises(ValueError, match=f"^prompt 1 {capacity}$"):
        fdecode.generate(small, [[1, 2], [1] * 10], max_new_tokens=10, progress=False)
    with pytest.raises(ValueError, match=f"^prompt {capacity}$"):
        fdecode.Engine(small).add_request([1] * 10, max_new_tokens=10)


def test_compile_names_the_argument_that_is_wrong():
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(**CFG)
    with pytest.raises(
        TypeError,
        match=r"^draft must be .*an MTPHead, 'mtp' \(the target's own MTP head\), 'ngram' or an NgramDraft \(prompt lookup\), got NoneType$",
    ):
        fdecode.compile(target, None, cfg)
    with pytest.raises(
        FileNotFoundError, match=r"^draft 'nonsense' is not a checkpoint folder \(no such folder\); .*'mtp'"
    ):
        fdecode.compile(target, "nonsense", cfg)
    with pytest.raises(FileNotFoundError, match=r"^target 'nowhere' is not a checkpoint folder"):
        fdecode.compile("nowhere", "mtp", cfg)


# --------------------------------------------------------------------------- review round 4, item 8


@pytest.mark.parametrize("grammar", ["[0-9]+", {"type": "object"}])
def test_a_grammar_that_is_not_a_grammar_says_how_to_build_one(grammar):
    with pytest.raises(TypeError, match=r"grammar must be a fdecode.Grammar \(fdecode.Grammar.from_regex"):
        fdecode.SamplingParams(grammar=grammar)


def test_min_tokens_past_the_room_max_seq_len_leaves_is_refused():
    target = fdecode_target(2)
    step = fdecode.compile(target, "ngram", fdecode.DecodeConfig(**CFG, min_tokens=True))
    with pytest.raises(ValueError, match="prompt 0: min_tokens 40 is more than the 30 tokens max_seq_len 32 leaves"):
        fdecode.generate(step, [[1, 2]], fdecode.SamplingParams(min_tokens=40))
    with pytest.raises(ValueError, match="min_tokens 31 is more than the 30 tokens"):
        fdecode.Engine(step).add_request([1, 2], fdecode.SamplingParams(min_tokens=31))
    assert len(fdecode.generate(step, [[1, 2]], fdecode.SamplingParams(min_tokens=30, eos_token_id=5))[0]) == 30


def test_a_ragged_numpy_batch_is_a_batch_and_a_flat_array_one_prompt(step):
    np = pytest.importorskip("numpy", reason='needs numpy (transformers brings it): pip install -e ".[test]"')
    ragged = np.array([[1, 2], [3]], dtype=object)
    assert fdecode.generate(step, ragged, max_new_tokens=3) == fdecode.generate(step, [[1, 2], [3]], max_new_tokens=3)
    with pytest.raises(TypeError, match="it is one prompt"):
        fdecode.generate(step, np.array([1, 2, 3]), max_new_tokens=3)


def test_a_stop_id_named_twice_counts_once(step):
    state = step.prefill([[1, 2]], max_new_tokens=3, eos_token_id=[7, 7, 7, 7, 7, 9])  # 2 ids, max_stop_ids 4
    assert sorted(state.stop_ids[0].tolist()) == [-1, -1, 7, 9]


def test_a_depth_a_recurrent_step_does_not_run_names_step_depths():
    from support.hybrid_models import hybrid_target

    step = fdecode.compile(hybrid_target(), "ngram", fdecode.DecodeConfig(**CFG))
    assert step.depths == (0, 2)
    with pytest.raises(ValueError, match=r"runs depth 0 or K = 2, got 1 \(step.depths lists"):
        step.warmup(depths=range(3))
