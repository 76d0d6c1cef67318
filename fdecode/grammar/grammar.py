"""`Grammar`: a regex or a JSON schema compiled over a tokenizer's vocabulary, with the tables a decode
step masks and advances with (docs/design.md, "Structured output").

    g = Grammar.from_json_schema({"type": "object", ...}, tokenizer, vocab_size=model_vocab)
    g.check_capacity(cfg.max_grammar_states, cfg.max_grammar_transitions)   # before anything runs
    allowed, keys, next, final = g.tables()

Building is cached (`fdecode.grammar.cache.CACHE`): the same grammar on the same vocabulary is built
once. Every error (an unsupported construct, an invalid schema, a language the vocabulary cannot spell,
a grammar larger than the configured pool) is a ValueError raised here, on the host, before a step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fdecode.grammar.automaton import compile_regex
from fdecode.grammar.cache import CACHE
from fdecode.grammar.schema import schema_regex, schema_text
from fdecode.grammar.syntax import excerpt
from fdecode.grammar.tables import GrammarTables, pack
from fdecode.grammar.vocabulary import token_bytes


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Grammar:
    """A regular language over one tokenizer's tokens. Build with `from_regex` or `from_json_schema`."""

    kind: str  # "regex" or "json_schema"
    source: str  # the pattern, or the schema as compact JSON
    pattern: str  # the regex compiled (the source itself for a regex)
    tokenizer: str  # the tokenizer's name_or_path
    vocab_size: int  # V: the model's vocabulary; ids from len(tokenizer) on are never allowed
    eos_ids: tuple[int, ...]  # stop ids: allowed in accepting states only
    _tables: GrammarTables

    initial_state = 0  # local state ids run 0..S-1 from the initial state

    @classmethod
    def from_regex(
        cls, pattern: str, tokenizer, *, eos_token_id: int | Sequence[int] | None = None, vocab_size: int | None = None
    ) -> Grammar:
        """The texts `pattern` (Rust `regex` syntax, matched against the whole output) fully matches.
        `tokenizer` is a transformers tokenizer; `eos_token_id` adds stop ids to its eos_token_id;
        `vocab_size` is the model's vocabulary size when it pads past len(tokenizer)."""
        return cls._build("regex", pattern, tokenizer, eos_token_id, vocab_size, regex=lambda: pattern)

    @classmethod
    def from_json_schema(
        cls,
        schema: str | dict,
        tokenizer,
        *,
        eos_token_id: int | Sequence[int] | None = None,
        vocab_size: int | None = None,
        whitespace_pattern: str | None = None,
    ) -> Grammar:
        """The JSON documents `schema` (a dict, or its JSON text) admits, as outlines-core writes them:
        properties in the schema's order, whitespace per `whitespace_pattern` (default: at most one space)."""
        text = schema_text(schema)
        return cls._build(
            "json_schema",
            text,
            tokenizer,
            eos_token_id,
            vocab_size,
            options=whitespace_pattern,
            regex=lambda: schema_regex(text, whitespace_pattern=whitespace_pattern),
        )

    @classmethod
    def _build(cls, kind, source, tokenizer, eos_token_id, vocab_size, *, regex, options=None) -> Grammar:
        vocab = token_bytes(tokenizer)
        vocab_size = len(vocab) if vocab_size is None else int(vocab_size)
        if vocab_size < len(vocab):
            raise ValueError(
                f"vocab_size={vocab_size} is below the tokenizer's {len(vocab)} ids: pass the "
                "model's vocabulary size (at least len(tokenizer))"
            )
        eos_ids = _eos_ids(tokenizer, eos_token_id, vocab_size)
        key = (kind, source, options, vocab.name, vocab.digest, eos_ids, vocab_size)

        def build() -> Grammar:
            pattern = regex()
            try:
                automaton = compile_regex(pattern, vocab, eos_ids)
            except ValueError as e:
                if kind == "regex":
                    raise
                raise ValueError(f"JSON schema {excerpt(source)}: {e}") from None  # name what the user wrote
            tables = pack(automaton, vocab_size=vocab_size, eos_ids=eos_ids)
            return cls(kind, source, pattern, vocab.name, vocab_size, eos_ids, tables)

        return CACHE.get(key, build)

    @property
    def num_states(self) -> int:
        """S: the automaton's states (reachable, and able to reach an accepting state)."""
        return self._tables.final.numel()

    @property
    def num_transitions(self) -> int:
        """T: (state, token) pairs that advance the automaton; EOS ids are not among them."""
        return self._tables.keys.numel()

    def tables(self) -> GrammarTables:
        """The CPU tables (shared by every user of this grammar: copy before writing to them)."""
        return self._tables

    def check_capacity(self, max_states: int, max_transitions: int) -> None:
        """Raise ValueError where this grammar does not fit a pool of `max_states` states and
        `max_transitions` transitions, naming the DecodeConfig field to raise."""
        over = []
        if self.num_states > max_states:
            over.append(f"{self.num_states:,} states (DecodeConfig.max_grammar_states is {max_states:,})")
        if self.num_transitions > max_transitions:
            over.append(
                f"{self.num_transitions:,} transitions (DecodeConfig.max_grammar_transitions is {max_transitions:,})"
            )
        if over:
            raise ValueError(
                f"{self.kind} {excerpt(self.source)} does not fit the grammar pool: it has "
                f"{' and '.join(over)}; raise the limit or simplify the grammar"
            )

    def __repr__(self) -> str:
        mb = self._tables.nbytes() / 2**20
        return (
            f"Grammar({self.kind} {excerpt(self.source, 40)}, {self.num_states:,} states, "
            f"{self.num_transitions:,} transitions, vocab {self.vocab_size:,} of {self.tokenizer!r}, "
            f"eos {list(self.eos_ids)}, {mb:.2f} MB)"
        )


def _eos_ids(tokenizer, extra: int | Sequence[int] | None, vocab_size: int) -> tuple[int, ...]:
    """The tokenizer's eos_token_id and `extra`, sorted, each checked against `vocab_size`."""
    ids = set() if tokenizer.eos_token_id is None else {int(tokenizer.eos_token_id)}
    ids |= set() if extra is None else {int(extra)} if isinstance(extra, int) else {int(i) for i in extra}
    if not ids:
        raise ValueError("the tokenizer has no eos_token_id: pass eos_token_id= (a grammar's output must end)")
    bad = [i for i in sorted(ids) if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"EOS ids {bad} are outside the vocabulary [0, {vocab_size})")
    return tuple(sorted(ids))
