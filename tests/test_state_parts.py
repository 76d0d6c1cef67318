"""`DecodeState` in parts (issue 52, item 3): kv, lanes, sampling, and the optional processors, grammar and draft
parts, absent (None, no pytree leaf) where the step is compiled without the feature; flat names read and
`replace` the leaves of every part."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.llama_models import fdecode_target, independent_draft
from torch.utils import _pytree as pytree

import fdecode
from fdecode.state import DecodeState
from fdecode.state.decode_state import LEAVES, leaves_of
from fdecode.state.parts import KV, PARTS, ROUTES, Draft, Grammar, Lanes, Processors, Sampling

PROMPTS = [[5, 17, 33, 2, 9], [7, 3, 4]]
PLAIN = dict(num_draft_tokens=2, max_batch=2, max_seq_len=64, block_size=4, backend="eager", draft_catch_up=0)
FEATURES = dict(penalties=True, max_logit_bias=2)  # the processors part: penalties and logit bias
GRAMMARS = dict(max_grammar_states=8, max_grammar_transitions=64)


def make_step(draft: object = None, **changes):
    target = fdecode_target(2)
    draft = independent_draft("partial", target) if draft is None else draft
    return fdecode.compile(target, draft, fdecode.DecodeConfig(**{**PLAIN, **changes}))


def test_a_plain_step_has_the_three_required_parts_only():
    state = make_step().prefill(PROMPTS, max_new_tokens=8)
    assert (type(state.kv), type(state.lanes), type(state.sampling)) == (KV, Lanes, Sampling)
    assert state.processors is state.grammar is state.draft is None
    absent = ("penalties", "counts", "seen", "bias_ids", "bias", "grammar_state", "grammar_keys", "history", "missed")
    assert all(getattr(state, name) is None for name in (*absent, "tree_parents", "target_conv", "draft_rec"))
    assert repr(state).endswith(f"draft_kv={tuple(state.draft_kv.shape)}>")


def test_each_feature_brings_its_part():
    state = make_step(**FEATURES, **GRAMMARS, draft_catch_up=2).prefill(PROMPTS, max_new_tokens=8)
    vocab = state.draft_probs.shape[-1]
    assert isinstance(state.processors, Processors) and isinstance(state.grammar, Grammar)
    assert isinstance(state.draft, Draft) and state.draft.missed.shape == (2, 2) and state.draft.history is None
    assert state.processors.counts.shape == (2, vocab) and state.processors.bias.shape == (2, 2)
    assert state.grammar.allowed.shape == (8, -(-vocab // 32)) and state.grammar.state.tolist() == [-1, -1]
    assert repr(state).endswith(" with processors, grammar, draft>")
    penalties_only = make_step(penalties=True).prefill(PROMPTS, max_new_tokens=8).processors
    assert penalties_only.counts is not None and penalties_only.bias_ids is penalties_only.bias is None
    ngram = make_step("ngram")
    history = (2, ngram.config.blocks_per_lane * 4 + 3)
    assert ngram.empty_state().draft.history.shape == history and ngram.empty_state().draft.missed is None


def test_an_absent_feature_adds_no_leaf():
    plain = make_step().prefill(PROMPTS, max_new_tokens=8)
    full = make_step(**FEATURES, **GRAMMARS).prefill(PROMPTS, max_new_tokens=8)
    plain_leaves, spec = pytree.tree_flatten(plain)
    full_leaves, full_spec = pytree.tree_flatten(full)
    assert len(full_leaves) - len(plain_leaves) == 5 + 4  # processors' 5 leaves, grammar's 4
    assert spec != full_spec  # which parts (and fields) are present is structure
    assert not any(leaf is None for leaf in plain_leaves)
    # The leaves in the state's order (`LEAVES`, the flat names), the absent ones left out.
    assert [id(t) for t in full_leaves] == [id(getattr(full, n)) for n in LEAVES if getattr(full, n) is not None]
    # A map keeps the parts, the KV chain and the fields present.
    copied = pytree.tree_map(lambda t: t, full)
    assert copied.kv_ticket is full.kv_ticket and copied.draft is None
    assert [id(t) for t in pytree.tree_leaves(copied)] == [id(t) for t in full_leaves]
    assert pytree.tree_structure(copied) == full_spec


def test_flat_names_read_the_parts_fields():
    state = make_step(**FEATURES, **GRAMMARS).prefill(PROMPTS, max_new_tokens=8)
    assert LEAVES == tuple(ROUTES) and len(ROUTES) == sum(len(dataclasses.fields(cls)) for cls in PARTS.values()) == 33
    for flat, (part, field) in ROUTES.items():
        holder = getattr(state, part)
        assert getattr(state, flat) is (None if holder is None else getattr(holder, field)), flat
    assert state.grammar_keys is state.grammar.keys and state.tokens is state.lanes.tokens
    with pytest.raises(AttributeError):
        state.tokens = state.tokens  # read-only
    # All leaves in one read (what a Step reads each call), absent ones None.
    for subject in (state, state.replace(processors=None, grammar=None)):
        read = leaves_of(subject)
        assert len(read) == len(LEAVES) and all(a is getattr(subject, n) for a, n in zip(read, LEAVES))


def test_replace_routes_each_name_to_its_part():
    state = make_step(penalties=True).prefill(PROMPTS, max_new_tokens=8)
    counts, remaining = torch.zeros_like(state.counts), state.remaining - 1
    new = state.replace(counts=counts, remaining=remaining, top_k=state.top_k + 1)
    assert new.counts is counts and new.remaining is remaining and new.processors.penalties is state.penalties
    assert new.kv is state.kv and new.tokens is state.tokens  # untouched parts are the same objects
    assert new.kv_ticket is state.kv_ticket  # the KV was kept: the chain goes on
    assert new.sampling.top_k.tolist() == (state.top_k + 1).tolist()
    # A part by its name; the last leaf of an optional part taken: the part is absent.
    assert state.replace(processors=None).processors is None
    assert state.replace(penalties=None, counts=None, seen=None).processors is None


def test_replace_and_of_refuse_a_name_no_part_holds():
    state = make_step().prefill(PROMPTS, max_new_tokens=8)
    with pytest.raises(TypeError, match="DecodeState has no leaf 'remaining_tokens'; its leaves are target_kv, "):
        state.replace(remaining_tokens=state.remaining)
    with pytest.raises(TypeError, match="no leaf 'kv_pool'"):
        DecodeState.of(kv_pool=state.target_kv)


def test_a_state_of_other_features_is_refused_before_the_step_runs():
    with_penalties = make_step(penalties=True).prefill(PROMPTS, max_new_tokens=8)
    plain = make_step()
    with pytest.raises(ValueError, match="state.penalties is present, this step .* has none"):
        plain(with_penalties)
    with pytest.raises(ValueError, match="state.grammar_state is absent, this step .* holds it"):
        make_step(**GRAMMARS)(plain.prefill(PROMPTS, max_new_tokens=8))
