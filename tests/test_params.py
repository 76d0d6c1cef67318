"""`SamplingParams` and the values users hold: one frozen per-request object beside the keyword shortcuts,
numpy / torch numbers wherever a Python number goes, prompts as tensors and arrays (eager, tiny model)."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch
from support.llama_models import fdecode_target, hf_greedy, independent_draft

import fdecode
from fdecode import SamplingParams
from fdecode.ops.filters import candidate_filter, full_filter
from fdecode.seeds import derived

CFG = dict(num_draft_tokens=2, max_batch=3, max_seq_len=32, block_size=4, backend="eager")
PROMPTS = [[5, 6, 7], [9, 1], [3, 3, 4, 8]]


@pytest.fixture(scope="module")
def step():
    target = fdecode_target(2)
    return fdecode.compile(target, independent_draft("partial", target), fdecode.DecodeConfig(**CFG))


def test_sampling_params_is_frozen_and_holds_python_values():
    p = SamplingParams(
        temperature=np.float32(0.5),
        top_k=np.int64(5),
        top_p=torch.tensor(0.9),
        min_p=np.float64(0.1),
        seed=torch.tensor(3),
        eos_token_id=np.array([2, 7]),
        max_new_tokens=np.int32(4),
    )
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.seed, p.eos_token_id, p.max_new_tokens) == (
        0.5,
        5,
        pytest.approx(0.9),
        pytest.approx(0.1),
        3,
        (2, 7),
        4,
    )
    assert all(type(v) in (int, float, tuple) for v in (p.temperature, p.top_k, p.top_p, p.seed, p.eos_token_id))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 1.0
    assert SamplingParams(eos_token_id=np.int64(3)).eos_token_id == (3,)
    assert hash(p) == hash(SamplingParams(**dataclasses.asdict(p)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1}, r"temperature must be >= 0 \(0 = greedy\), got -1.0"),
        ({"top_p": np.float32(0)}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_k": 2.5}, r"top_k must be an int >= 0 \(0 = off\), got 2.5"),
        ({"seed": 2**63}, r"seed must be an int in \[0, 2\*\*63\)"),
        ({"max_new_tokens": 0}, r"max_new_tokens must be a positive int, got 0"),
        ({"eos_token_id": "x"}, r"eos_token_id must be an id or a list of ids, got 'x'"),
        ({"ignore_eos": True, "eos_token_id": 2}, r"ignore_eos=True and eos_token_id=\[2\] contradict"),
    ],
)
def test_sampling_params_fails_early_with_a_precise_message(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        SamplingParams(**kwargs)


def test_params_give_what_the_keywords_give(step):
    """One SamplingParams for the call = the scalar keywords; one per prompt = the per-prompt lists."""
    keywords = fdecode.generate(step, PROMPTS, max_new_tokens=6, temperature=0.9, top_k=20, seed=5)
    one = fdecode.generate(step, PROMPTS, SamplingParams(temperature=0.9, top_k=20, seed=5, max_new_tokens=6))
    assert one == keywords
    same = [SamplingParams(temperature=t, seed=s, max_new_tokens=5) for t, s in ((0.0, 1), (1.0, 2), (0.7, 3))]
    assert fdecode.generate(step, PROMPTS, same) == fdecode.generate(
        step, PROMPTS, max_new_tokens=5, temperature=[0.0, 1.0, 0.7], seed=[1, 2, 3]
    )
    per = [p.replace(max_new_tokens=n) for p, n in zip(same, (3, 5, 4))]
    got = fdecode.generate(step, PROMPTS, per)
    assert [len(o) for o in got] == [3, 5, 4]  # per-request budgets
    for i, prompt in enumerate(PROMPTS):  # each request decodes as it would alone
        assert got[i] == fdecode.generate(step, [prompt], per[i])[0]
    state = step.prefill(PROMPTS, per)
    assert state.seed.tolist() == [1, 2, 3] and state.remaining.tolist() == [2, 4, 3]
    engine = fdecode.Engine(step)
    rid = engine.add_request(PROMPTS[1], per[1])
    assert engine.run()[rid] == got[1]


def test_params_and_keywords_are_not_mixed(step):
    with pytest.raises(
        TypeError, match=r"either as params= or as keywords, not both \(got params and max_new_tokens\)"
    ):
        fdecode.generate(step, PROMPTS, SamplingParams(), max_new_tokens=4)
    with pytest.raises(ValueError, match=r"^params has 2 values for 3 prompts$"):
        step.prefill(PROMPTS, [SamplingParams()] * 2)
    with pytest.raises(TypeError, match=r"^params must be a SamplingParams, got list$"):
        fdecode.Engine(step).add_request([1, 2], [SamplingParams()])


def test_numpy_and_torch_numbers_wherever_a_number_goes(step):
    plain = fdecode.generate(
        step, PROMPTS, max_new_tokens=5, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, seed=4, eos_token_id=3
    )
    held = fdecode.generate(
        step,
        PROMPTS,
        max_new_tokens=np.int64(5),
        temperature=np.float32(0.7),
        top_k=np.int64(5),
        top_p=torch.tensor(0.9),
        min_p=np.float64(0.05),
        seed=torch.tensor(4),
        eos_token_id=np.int64(3),
    )
    assert held == plain
    lists = fdecode.generate(step, PROMPTS, max_new_tokens=5, temperature=[0.0, 0.5, 1.0], seed=[1, 2, 3])
    arrays = fdecode.generate(
        step, PROMPTS, max_new_tokens=5, temperature=np.array([0.0, 0.5, 1.0]), seed=torch.tensor([1, 2, 3])
    )
    assert arrays == lists
    engine = fdecode.Engine(step)
    rid = engine.add_request(
        np.array(PROMPTS[0]),
        max_new_tokens=np.int64(4),
        temperature=np.float32(0.7),
        top_k=np.int64(5),
        seed=np.int64(9),
        eos_token_id=torch.tensor([3]),
    )
    again = fdecode.Engine(step)
    rid2 = again.add_request(
        PROMPTS[0], max_new_tokens=4, temperature=float(np.float32(0.7)), top_k=5, seed=9, eos_token_id=[3]
    )
    assert engine.run()[rid] == again.run()[rid2]


@pytest.mark.parametrize(
    "prompts",
    [
        torch.tensor([[5, 6, 7], [9, 1, 2]]),
        np.array([[5, 6, 7], [9, 1, 2]]),
        [torch.tensor([5, 6, 7]), np.array([9, 1, 2])],
        [[np.int64(5), np.int32(6), torch.tensor(7)], (9, 1, 2)],
    ],
    ids=["2-D tensor", "2-D array", "1-D tensors and arrays", "numpy and torch ints"],
)
def test_prompts_as_users_hold_them(step, prompts):
    want = fdecode.generate(step, [[5, 6, 7], [9, 1, 2]], max_new_tokens=4)
    assert fdecode.generate(step, prompts, max_new_tokens=4) == want
    state = step.prefill(prompts, max_new_tokens=4)
    assert state.step_output.tokens[:2, 0].tolist() == [w[0] for w in want]


def test_a_one_dimensional_prompt_tensor_is_refused_with_a_hint(step):
    with pytest.raises(TypeError, match=r"got a 1-D Tensor: it is one prompt, pass \[prompt\]$"):
        fdecode.generate(step, torch.tensor([5, 6, 7]), max_new_tokens=4)
    with pytest.raises(TypeError, match=r"prompt 0: expected a 1-D integer tensor, got float64 \(3,\)"):
        step.prefill([np.array([1.0, 2.0, 3.0])])
    with pytest.raises(TypeError, match=r"got dict \(pass its \['input_ids'\]\)$"):  # a tokenizer's whole output
        step.prefill({"input_ids": [[5, 6, 7]]}, max_new_tokens=4)


def test_filters_at_temperature_zero_warn_once_per_call(step):
    with pytest.warns(UserWarning, match=r"^top_k, top_p have no effect at temperature 0") as caught:
        fdecode.generate(step, PROMPTS, max_new_tokens=3, top_p=0.5, top_k=[3, 0, 4])
    assert len([w for w in caught if "no effect" in str(w.message)]) == 1
    assert caught[0].filename == __file__  # it names the caller's line
    with pytest.warns(UserWarning, match="min_p has no effect"):
        step.prefill(PROMPTS, min_p=0.2)
    with pytest.warns(UserWarning, match="top_p has no effect"):
        fdecode.Engine(step).add_request([1, 2], SamplingParams(top_p=0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fdecode.generate(step, PROMPTS, max_new_tokens=3, temperature=[0.0, 0.8, 0.8], top_k=[0, 3, 4])


def test_a_seed_for_the_call_gives_each_prompt_its_own_stream(step):
    """Best-of-n: a scalar seed derives distinct, reproducible per-request seeds; per-prompt seeds stay as given."""
    prompts = [[5, 6, 7]] * 3
    samples = fdecode.generate(step, prompts, max_new_tokens=8, temperature=1.0, seed=3)
    assert len({tuple(s) for s in samples}) == 3  # three different samples
    assert fdecode.generate(step, prompts, max_new_tokens=8, temperature=1.0, seed=3) == samples  # reproducible
    alone = fdecode.generate(step, [[5, 6, 7]], max_new_tokens=8, temperature=1.0, seed=3)[0]
    assert samples[0] == alone  # request 0 keeps the call's seed itself
    engine = fdecode.Engine(step)
    rid = engine.add_request([5, 6, 7], max_new_tokens=8, temperature=1.0, seed=3)
    assert engine.run()[rid] == alone
    same = fdecode.generate(step, prompts, max_new_tokens=8, temperature=1.0, seed=[3, 3, 3])
    assert same == [alone] * 3  # per-prompt seeds are taken as given
    shared = fdecode.generate(step, prompts, fdecode.SamplingParams(temperature=1.0, seed=3, max_new_tokens=8))
    assert shared == samples  # one SamplingParams for the call is a seed for the call too
    seeds = step.prefill(prompts, temperature=1.0, seed=3).seed.tolist()
    assert seeds[0] == 3 and len(set(seeds)) == 3 and all(0 <= s < 2**63 for s in seeds)
    assert seeds == [derived(3, i) for i in range(3)]


def test_decode_config_takes_numpy_and_torch_integers():
    held = fdecode.DecodeConfig(
        num_draft_tokens=np.int64(2),
        max_batch=torch.tensor(3),
        max_seq_len=np.int32(32),
        block_size=4,
        max_stop_ids=np.int64(4),
        eos_token_id=np.int64(2),
        backend="eager",
    )
    plain = fdecode.DecodeConfig(
        num_draft_tokens=2, max_batch=3, max_seq_len=32, block_size=4, eos_token_id=2, backend="eager"
    )
    assert held == plain and hash(held) == hash(plain) and type(held.max_batch) is int


def test_derived_seeds_are_the_same_in_every_process():
    """Tensor-parallel ranks are processes: a call's derived seeds must not depend on anything per process
    (string hashing is randomised per process; the derivation must not use it)."""
    import os
    import subprocess
    import sys

    # fdecode/seeds.py alone (it needs only torch): the package's other imports would triple the start-up.
    code = (
        "import importlib.util as u, sys; spec = u.spec_from_file_location('seeds', sys.argv[1]); "
        "m = u.module_from_spec(spec); spec.loader.exec_module(m); print([m.derived(3, i) for i in range(5)])"
    )
    import fdecode.seeds

    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code, fdecode.seeds.__file__],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        ).stdout
        assert out.strip() == str([derived(3, i) for i in range(5)])


@pytest.mark.parametrize("temperature", [1e-39, 1e-30, 1e-6])
def test_a_temperature_below_1e_5_is_greedy(step, temperature):
    """vLLM's rule: T < 1e-5 decodes greedily (T = 1e-39 made logits / T overflow: NaN rows, token 0 forever)."""
    assert SamplingParams(temperature=temperature).temperature == 0.0
    got = fdecode.generate(step, PROMPTS, max_new_tokens=6, temperature=temperature, seed=3)
    assert got == [hf_greedy(tuple(p), 6) for p in PROMPTS]


def test_the_smallest_sampled_temperature_samples_the_argmax(step):
    assert SamplingParams(temperature=1e-5).temperature == 1e-5  # still a random lane
    got = fdecode.generate(step, PROMPTS, max_new_tokens=6, temperature=1e-5, seed=3)
    assert got == [hf_greedy(tuple(p), 6) for p in PROMPTS]


def test_a_tiny_temperature_in_the_state_never_makes_nan_rows():
    """A lane's temperature tensor set below 1e-5 by hand (the host never writes one) samples near the argmax."""
    logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(0)) * 10
    t = torch.tensor([1e-39, 1e-30])
    off = (torch.zeros(2, dtype=torch.int64), torch.ones(2), torch.zeros(2))
    for probs in (full_filter(logits, t, *off), candidate_filter(logits, t, *off, 8)[0]):
        assert torch.isfinite(probs).all()
    assert torch.equal(full_filter(logits, t, *off).argmax(dim=-1), logits.argmax(dim=-1))
