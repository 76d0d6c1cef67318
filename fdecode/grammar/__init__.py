"""Structured output: regexes and JSON schemas compiled to token automata the decode step can read
(docs/design.md, "Structured output").

    vocabulary.py   each token id's bytes (byte-level BPE, SentencePiece with byte fallback)
    syntax.py       constructs a whole-output DFA cannot take, refused by name
    schema.py       a JSON schema as a regex (outlines-core)
    automaton.py    a regex as a token-level DFA (outlines-core's Index, with an end marker)
    tables.py       the DFA as GrammarTables: allowed-token bitmask, sorted transition keys
    lookup.py       the reference reads of the tables (mask a state, advance by a token)
    length.py       the longest output an automaton allows (min_tokens that can never be met)
    cache.py        compiled grammars by (kind, text, tokenizer identity, EOS ids, vocab size)
    grammar.py      Grammar.from_regex / from_json_schema, tables(), check_capacity()

outlines-core is imported only when a grammar is built (`pip install -e ".[grammar]"`).
"""

from fdecode.grammar.grammar import Grammar
from fdecode.grammar.tables import GrammarTables

__all__ = ["Grammar", "GrammarTables"]
