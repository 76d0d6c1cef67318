"""The grammar pool under churn (`fdecode.state.grammar_pool`): grammars of different sizes arriving and
finishing in any order never crash it; a fragmented pool compacts, moving the running lanes' automaton
states with their grammars' rows; a request waits only while the free room, in total, is too small.

The oracle is independent: each grammar's own tables (hand-written automata, `support.hand_grammar`) and,
for whole requests, transformers' greedy `generate` masked by a Python walk of the same automaton.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import transformers
from support.hand_grammar import HandGrammar, Masked
from support.llama_models import VOCAB, fdecode_target, hf_target

import fdecode
from fdecode import SamplingParams
from fdecode.state.grammar_pool import FREE_KEY, GrammarPool

EOS = VOCAB - 1


def ring(states: int, first: int, *, final: bool = True) -> HandGrammar:
    """`states` states in a ring; state s allows tokens first + 2s and first + 2s + 1, and EOS where `final`
    (in every state; else never: the lane runs to its budget)."""
    moves = {s: {first + 2 * s: (s + 1) % states, first + 2 * s + 1: (s + 1) % states} for s in range(states)}
    return HandGrammar(moves, final=set(range(states)) if final else set(), vocab_size=VOCAB, eos=(EOS,))


# --------------------------------------------------------------------------- the pool alone


def pool_state(cfg: fdecode.DecodeConfig, lanes: int) -> SimpleNamespace:
    """The pool leaves of a state (what `GrammarPool` writes), with garbage in the rows and a lane leaf."""
    return SimpleNamespace(
        grammar_allowed=torch.randint(
            -(2**31), 2**31 - 1, (cfg.max_grammar_states, -(-VOCAB // 32)), dtype=torch.int32
        ),
        grammar_keys=torch.full((cfg.max_grammar_transitions,), FREE_KEY, dtype=torch.int64),
        grammar_next=torch.full((cfg.max_grammar_transitions,), -1, dtype=torch.int64),
        grammar_state=torch.full((lanes,), -1, dtype=torch.int64),
    )


def check_resident(pool: GrammarPool, state, running: dict[int, tuple[HandGrammar, int]]) -> None:
    """Every running lane's grammar reads as its own tables at the lane's offset, and the lane's state
    is the same local state of it as before."""
    for lane, (grammar, local) in running.items():
        offset = int(state.grammar_state[lane]) - local
        tables = grammar.tables()
        assert torch.equal(state.grammar_allowed[offset : offset + grammar.num_states], tables.allowed)
        keys = state.grammar_keys.tolist()
        for key, nxt in zip(tables.keys.tolist(), tables.next.tolist()):
            at = keys.index(key + offset * VOCAB)
            assert int(state.grammar_next[at]) == nxt + offset
    live = state.grammar_keys[state.grammar_keys != FREE_KEY]
    assert bool((live[1:] > live[:-1]).all())  # one ascending key list


@pytest.mark.parametrize("seed", range(6))
def test_the_pool_never_crashes_and_admits_as_soon_as_room_exists(seed):
    """Random arrivals and finishes of grammars of 1 .. 9 states in a 16-row pool: every admission that
    `fits` (total room) allows succeeds, fragmented or not, and every running lane keeps its grammar."""
    rng = random.Random(seed)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=2,
        max_batch=4,
        max_seq_len=32,
        block_size=4,
        backend="eager",
        max_grammar_states=16,
        max_grammar_transitions=40,
    )
    grammars = [ring(n, 0) for n in range(1, 10)] * 2  # twice: distinct objects of the same size
    pool, state = GrammarPool(cfg, VOCAB), pool_state(cfg, 4)
    running: dict[int, tuple[HandGrammar, int]] = {}  # lane -> (grammar, local automaton state)
    compacted = admitted = 0
    for _ in range(300):
        free = [lane for lane in range(4) if lane not in running]
        if running and (not free or rng.random() < 0.4):
            lane = rng.choice(sorted(running))
            pool.release(lane)
            del running[lane]
            continue
        grammar = rng.choice(grammars)
        used = {id(g): g for g, _ in running.values()} | {id(grammar): grammar}
        room = sum(g.num_states for g in used.values()) <= 16 and sum(g.num_transitions for g in used.values()) <= 40
        assert pool.fits([grammar]) == room
        if not room:
            continue
        for lane, (g, local) in running.items():  # the lanes walked on: a local state of their grammar
            offset = int(state.grammar_state[lane]) - local
            running[lane] = (g, rng.randrange(g.num_states))
            state.grammar_state[lane] = offset + running[lane][1]
        before = state.grammar_state.clone()
        result = pool.admit(state, [free[0]], [grammar])
        compacted += result.grammar_state is not state.grammar_state
        state.grammar_state = result.grammar_state.clone()
        state.grammar_state[free[0]] = result.initial[0]
        running[free[0]] = (grammar, 0)
        admitted += 1
        check_resident(pool, state, running)
        assert bool((state.grammar_state[list(running)] >= 0).all()) and before.shape == state.grammar_state.shape
    assert admitted > 100 and compacted > 0  # the churn did fragment the pool


# --------------------------------------------------------------------------- inside the Engine


def hf_masked(prompt: list[int], grammar: HandGrammar, new: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = hf_target(2).generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new,
        do_sample=False,
        eos_token_id=EOS,
        pad_token_id=0,
        logits_processor=transformers.LogitsProcessorList([Masked(grammar, len(prompt))]),
    )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def step():
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=3,
        max_batch=3,
        max_seq_len=64,
        block_size=4,
        backend="eager",
        max_grammar_states=13,
        max_grammar_transitions=64,
    )
    return fdecode.compile(fdecode_target(2), "ngram", cfg)


def test_a_fragmented_pool_compacts_instead_of_crashing(step):
    """The review's repro: grammars of 4, 4 and 4 states in a 13-row pool, the middle one finishes at
    once, then a 5-state grammar: 4 + 1 rows are free but in two gaps. It is admitted (the pool
    compacts, the running lanes' states move with their rows) and every lane equals its reference."""
    engine = fdecode.Engine(step)
    prompt = [5, 17, 33, 2, 9]
    first, middle, last, five = (ring(n, t, final=False) for n, t in ((4, 0), (4, 10), (4, 20), (5, 40)))
    budgets = {first: 12, middle: 1, last: 12, five: 8}
    ids = {
        g: engine.add_request(prompt, SamplingParams(grammar=g, eos_token_id=EOS, max_new_tokens=budgets[g]))
        for g in (first, middle, last)
    }
    results: dict[int, list[int]] = {}
    while ids[middle] not in results or not results[ids[middle]]:
        for event in engine.step():
            results.setdefault(event.request_id, []).extend(event.new_tokens)
    assert engine.num_active == 2  # the first and last still run: their rows stay resident
    ids[five] = engine.add_request(prompt, SamplingParams(grammar=five, eos_token_id=EOS, max_new_tokens=budgets[five]))
    for event in engine.stream():
        results.setdefault(event.request_id, []).extend(event.new_tokens)
    for grammar, rid in ids.items():
        assert results[rid] == hf_masked(prompt, grammar, budgets[grammar])


def test_grammars_churning_through_the_engine_each_equal_their_reference(step):
    """Twelve requests with grammars of 2 .. 6 states and random budgets, more than the lanes: they are
    admitted as lanes and room free up, in arrival order, and each equals transformers under its mask."""
    rng = random.Random(0)
    engine = fdecode.Engine(step)
    grammars = [ring(n, 8 * n, final=n % 2 == 0) for n in (2, 3, 4, 5, 6)]
    requests = []
    for _ in range(12):
        prompt = [rng.randrange(1, EOS) for _ in range(rng.randrange(2, 9))]
        grammar, budget = rng.choice(grammars), rng.randrange(1, 12)
        rid = engine.add_request(prompt, SamplingParams(grammar=grammar, eos_token_id=EOS, max_new_tokens=budget))
        requests.append((rid, prompt, grammar, budget))
    results = engine.run()
    for rid, prompt, grammar, budget in requests:
        assert results[rid] == hf_masked(prompt, grammar, budget)
