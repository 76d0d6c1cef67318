"""Token automata written by hand (no tokenizer, no outlines-core), with the tables the step reads and an
independent Python walker: the oracle of tests/test_grammar_step.py.

`HandGrammar(moves, final, vocab_size, eos)`: moves {state: {token: next state}} from state 0; the EOS
ids are allowed exactly in the final states. It quacks like `fdecode.Grammar` (num_states,
num_transitions, vocab_size, tables(), check_capacity()).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import transformers


class Tables(NamedTuple):
    allowed: torch.Tensor
    keys: torch.Tensor
    next: torch.Tensor
    final: torch.Tensor


class HandGrammar:
    def __init__(self, moves: dict[int, dict[int, int]], final: set[int], vocab_size: int, eos: tuple[int, ...]):
        self.moves, self.final, self.vocab_size, self.eos = moves, final, vocab_size, eos
        self.num_states = 1 + max([*moves, *final, *(n for m in moves.values() for n in m.values())])
        self.num_transitions = sum(len(m) for m in moves.values())
        self.eos_ids = tuple(eos)  # as `fdecode.Grammar.eos_ids`

    def allowed(self, state: int) -> set[int]:
        """The tokens that may follow `state` (its moves, and the EOS ids where it is final)."""
        return set(self.moves.get(state, {})) | (set(self.eos) if state in self.final else set())

    def state_after(self, tokens: list[int]) -> int | None:
        """The state after `tokens` from state 0, None once one was not a move."""
        state = 0
        for t in tokens:
            state = self.moves.get(state, {}).get(t)
            if state is None:
                return None
        return state

    def tables(self) -> Tables:
        words = -(-self.vocab_size // 32)
        allowed = torch.zeros(self.num_states, words * 32, dtype=torch.bool)
        for s in range(self.num_states):
            allowed[s, list(self.allowed(s))] = True
        bits = (allowed.view(self.num_states, words, 32).long() << torch.arange(32)).sum(-1)
        allowed = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
        pairs = sorted((s * self.vocab_size + t, n) for s, m in self.moves.items() for t, n in m.items())
        keys = torch.tensor([k for k, _ in pairs], dtype=torch.int64)
        nxt = torch.tensor([n for _, n in pairs], dtype=torch.int64)
        final = torch.tensor([s in self.final for s in range(self.num_states)])
        return Tables(allowed, keys, nxt, final)

    def check_capacity(self, max_states: int, max_transitions: int) -> None:
        if self.num_states > max_states or self.num_transitions > max_transitions:
            raise ValueError(
                f"needs {self.num_states} states / {self.num_transitions} transitions: "
                "DecodeConfig.max_grammar_states / max_grammar_transitions"
            )


def mask_logits(grammar: HandGrammar, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
    """`logits` [V] with every token the grammar does not allow after `generated` at -inf."""
    state = grammar.state_after(generated)
    keep = torch.zeros_like(logits, dtype=torch.bool)
    keep[list(grammar.allowed(state))] = True
    return torch.where(keep, logits, float("-inf"))


class Masked(transformers.LogitsProcessor):
    """transformers' side of a grammar: every row masked by `mask_logits` after the prompt."""

    def __init__(self, grammar: HandGrammar, prompt_length: int) -> None:
        self.grammar, self.start = grammar, prompt_length

    def __call__(self, input_ids, scores):
        return torch.stack(
            [mask_logits(self.grammar, ids[self.start :].tolist(), row) for ids, row in zip(input_ids, scores)]
        )


def parity(vocab: int, eos: int) -> HandGrammar:
    """Even, odd, even, then odd / even alternating (ids below eos); it may stop after an even token from
    the third on."""
    even, odd = range(0, eos, 2), range(1, eos, 2)
    return HandGrammar(
        {0: {t: 1 for t in even}, 1: {t: 2 for t in odd}, 2: {t: 3 for t in even}, 3: {t: 2 for t in odd}},
        final={3},
        vocab_size=vocab,
        eos=(eos,),
    )
