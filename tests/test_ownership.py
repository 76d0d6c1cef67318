"""KV-pool ownership that ordinary pytree use cannot lose, and state dataclasses that neither raise on
`==` nor sync in `repr` (issue 15, items 4 and 5).

The step knows which pool a state is over from its KV storage; which chain of states may use the
pool is a host-side ticket the state carries through `state.replace`, pytree rebuilds and copies.
"""

from __future__ import annotations

import copy
import dataclasses
import gc

import pytest
import torch
from support.llama_models import fdecode_target, independent_draft
from torch.utils import _pytree as pytree

import fdecode

PROMPTS = [[5, 17, 33, 2, 9], [7, 3, 4, 4, 1, 1, 2, 60, 61], [11, 12]]
OTHER = [[40, 41, 42, 43, 44, 45], [3, 3, 3], [90, 1]]


def make_step(**overrides):
    target = fdecode_target(2)
    cfg = dict(num_draft_tokens=2, max_batch=4, max_seq_len=64, block_size=4, backend="eager")
    return fdecode.compile(target, independent_draft("partial", target), fdecode.DecodeConfig(**{**cfg, **overrides}))


def run(step, state, steps=4):
    tokens = []
    for _ in range(steps):
        state, out = step(state)
        tokens.append(out.tokens.tolist())
    return tokens


def identity(state):
    return pytree.tree_map(lambda t: t, state)


def test_a_pytree_rebuilt_state_keeps_its_chain():
    """The issue's repro: the original is dropped, a `tree_map` rebuild of it lives on, and the next
    prefill must not silently hand that chain's KV to a new chain."""
    step = make_step()
    reference = run(step, step.prefill(PROMPTS, max_new_tokens=20))
    state = step.prefill(PROMPTS, max_new_tokens=20)
    rebuilt = identity(state)
    assert step.schedule.record(rebuilt) == step.schedule.record(state)  # the same tensors: the same host facts
    del state
    gc.collect()
    step.prefill(OTHER, max_new_tokens=20)  # the next chain: it takes the pool over, the old one is stale
    try:
        got = run(step, rebuilt)
    except ValueError as e:
        assert "later step.prefill" in str(e)
    else:
        assert got == reference, "the rebuilt chain read KV a later prefill overwrote"
        pytest.fail("a state whose pool was re-primed was stepped")


def test_a_concurrent_chain_keeps_its_pool_through_a_pytree_rebuild():
    step = make_step()
    reference = run(step, step.prefill(PROMPTS, max_new_tokens=20))
    rebuilt = identity(step.prefill(PROMPTS, max_new_tokens=20, concurrent=True))  # the original is dropped
    gc.collect()
    other = step.prefill(OTHER, max_new_tokens=20)
    assert other.target_kv.data_ptr() != rebuilt.target_kv.data_ptr()
    assert run(step, rebuilt) == reference


def test_stepping_a_pytree_copy_consumes_the_original():
    """Both objects are over the same KV: after one is stepped, the other is stale (donation)."""
    step = make_step()
    state = step.prefill(PROMPTS, max_new_tokens=20)
    step(identity(state))
    with pytest.raises(ValueError, match="donation contract"):
        step(state)


def test_a_dataclasses_replace_over_the_pool_is_refused_not_trusted():
    step = make_step()
    state = step.prefill(PROMPTS, max_new_tokens=20)
    lanes = dataclasses.replace(state.lanes, remaining=state.remaining - 1)
    blind = dataclasses.replace(state, lanes=lanes)  # no KV ticket can follow it
    # What the host knows of the leaves it shares (base_pos, active, sampling) holds (`fdecode.host_record`).
    assert step.schedule.record(blind) == step.schedule.record(state)
    del state
    gc.collect()
    step.prefill(OTHER, max_new_tokens=20)
    with pytest.raises(ValueError, match="state.replace"):
        step(blind)


def test_state_replace_keeps_the_bookkeeping_and_the_chain():
    step = make_step()
    state = step.prefill(PROMPTS, max_new_tokens=20)
    fewer = state.replace(remaining=state.remaining - 1)
    assert step.schedule.record(fewer) == step.schedule.record(state) and fewer.kv_ticket is state.kv_ticket
    step(fewer)
    with pytest.raises(ValueError, match="donation contract"):
        step(state)


def test_a_deepcopy_is_an_independent_state():
    step = make_step()
    reference = run(step, step.prefill(PROMPTS, max_new_tokens=20))
    state = step.prefill(PROMPTS, max_new_tokens=20)
    copied = copy.deepcopy(state)
    assert step.schedule.record(copied) == step.schedule.record(state)  # read from the copy's tensors
    assert copied.target_kv.data_ptr() != state.target_kv.data_ptr()
    run(step, state, 2)  # stepping the original does not consume the copy: it has KV of its own
    step.prefill(OTHER, max_new_tokens=20)
    assert run(step, copied) == reference


def test_the_readme_loop_reuses_one_pool():
    """`state = step.prefill(...)` keeps the previous chain's last state alive while it runs: the
    prefill takes that chain's pool over (so it is one pool, same addresses every generation)."""
    step = make_step()
    addresses = []
    for prompts in (PROMPTS, OTHER, PROMPTS, OTHER):
        state = step.prefill(prompts, max_new_tokens=12)
        for _ in range(3):
            state, _ = step(state)
        addresses.append((state.target_kv.data_ptr(), state.draft_kv.data_ptr()))
    assert len(set(addresses)) == 1, addresses
    assert len(step.kv_pools) == 1


def test_an_older_prefill_chain_is_refused_after_a_newer_prefill():
    step = make_step()
    first = step.prefill(PROMPTS, max_new_tokens=12)
    first, _ = step(first)
    second = step.prefill(OTHER, max_new_tokens=12)
    with pytest.raises(ValueError, match="later step.prefill"):
        step(first)
    step(second)


def test_a_failed_prefill_never_leaves_the_old_chain_trusted():
    step = make_step()
    state = step.prefill(PROMPTS, max_new_tokens=12)
    with pytest.raises(ValueError):
        step.prefill([[1, 2, 999]], max_new_tokens=4)  # token id outside the vocabulary
    try:
        step(state)
    except ValueError as e:
        assert "later step.prefill" in str(e)


def test_an_engine_pool_is_never_taken_by_a_prefill():
    step = make_step(max_batch=2)
    engine = fdecode.Engine(step)
    engine.add_request(PROMPTS[0], max_new_tokens=30)
    for _ in range(3):
        engine.step()
    engine.state = identity(engine.state)  # any pytree rebuild
    gc.collect()
    other = step.prefill(PROMPTS[2:], max_new_tokens=8)
    assert other.target_kv.data_ptr() != engine.state.target_kv.data_ptr()
    engine.run()


# ---------------------------------------------------------------- item 5: the dataclasses


def test_states_and_outputs_compare_by_identity():
    step = make_step()
    state = step.prefill(PROMPTS, max_new_tokens=8)
    other = state.clone()
    assert state == state and state != other and not (state == other)
    assert state.step_output != other.step_output
    assert len({state, other}) == 2  # hashable


def test_repr_reads_no_tensor_value():
    """Every leaf on the meta device: reading any value (a sum, an item) would raise."""
    step = make_step()
    state = step.prefill(PROMPTS, max_new_tokens=8)
    meta = pytree.tree_map(lambda t: torch.empty_like(t, device="meta"), state)
    text = repr(meta)
    assert "lanes=4" in text and "device=meta" in text
    assert "meta" in repr(meta.step_output)


@pytest.mark.parametrize("how", ["prefill", "concurrent", "empty_state"])
def test_a_state_over_another_steps_pool_is_refused(how):
    """Two steps compiled alike: a state over step A's pool is refused by step B before anything runs (the
    review's repro: B stepped it while an Engine of A took the same storage, and tokens went wrong); a
    clone of it, KV of its own, may be stepped by B, and equals A's own chain."""
    a, b = make_step(), make_step()
    start = {
        "prefill": lambda: a.prefill(PROMPTS, max_new_tokens=20),
        "concurrent": lambda: a.prefill(PROMPTS, max_new_tokens=20, concurrent=True),
        "empty_state": a.empty_state,
    }[how]
    state = start()
    with pytest.raises(ValueError, match="another step's KV pool"):
        b(state)
    if how != "empty_state":
        copy_ = state.clone()
        assert run(b, copy_) == run(a, state)
