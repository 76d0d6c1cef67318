"""Grammars (`fdecode.grammar`): token bytes, tables, cache and errors, against an independent oracle.

The oracle is the `regex` package on decoded text: a token may follow a text where the longer text is
still a prefix of a match (`regex.fullmatch(p, text, partial=True)`), and EOS where the text is a whole
match. Two tokenizers are built here, so CI runs both kinds without downloads: a byte-level BPE (GPT-2's
`Ġ` bytes, 256 byte tokens and a few merges) and a SentencePiece-style BPE (`▁` spaces, `<0x00>`..`<0xFF>`
byte fallback, a few pieces). The Qwen2.5-Coder tokenizer (V = 151,936) and SmolLM2's run where present.
"""

from __future__ import annotations

import codecs
import json

import pytest
import torch

regex = pytest.importorskip("regex", reason='needs regex: pip install -e ".[test]"')
pytest.importorskip("outlines_core", reason='needs outlines-core: pip install -e ".[grammar]"')
transformers = pytest.importorskip("transformers", reason='needs transformers: pip install -e ".[hf]"')
pytest.importorskip("tokenizers", reason='needs transformers: pip install -e ".[hf]"')

from support.tokenizers import byte_bpe, sentencepiece  # noqa: E402

from fdecode.assets import qwen_coder, smollm2  # noqa: E402
from fdecode.grammar import Grammar  # noqa: E402
from fdecode.grammar.cache import CACHE  # noqa: E402
from fdecode.grammar.lookup import allowed_tokens, next_state  # noqa: E402
from fdecode.grammar.vocabulary import token_bytes  # noqa: E402


@pytest.fixture(scope="module")
def qwen():
    folder = qwen_coder.tokenizer_folder()
    if folder is None:
        pytest.skip(
            f"no Qwen2.5-Coder tokenizer in {qwen_coder.folder()}: {qwen_coder.HOW_TO_GET}; "
            "then, for GGUF files, python -m fdecode.assets.qwen_coder"
        )
    return transformers.AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def smol():
    reason = smollm2.missing()
    if reason is not None:
        pytest.skip(reason)
    return smollm2.tokenizer()


TINY = {"byte-bpe": byte_bpe, "sentencepiece": sentencepiece}


# --- the oracle ---------------------------------------------------------------------------------------


def oracle(pattern: str, data: bytes) -> str | None:
    """'full' where `data` decodes to a whole match of `pattern`, 'prefix' where it can still grow into
    one, None where it cannot. A trailing incomplete UTF-8 character stands for the characters it may
    begin: the lowest and highest such, and those of the pattern's own characters that begin with it."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        text = decoder.decode(data, final=False)
    except UnicodeDecodeError:
        return None
    tail = decoder.getstate()[0]
    if not tail:
        m = regex.fullmatch(pattern, text, partial=True)
        return None if m is None else "prefix" if m.partial else "full"
    candidates = {c for c in pattern if c.encode().startswith(tail)} | set(_extreme_chars(tail))
    return "prefix" if any(oracle(pattern, (text + c).encode()) for c in candidates) else None


def _extreme_chars(tail: bytes) -> list[str]:
    """The lowest and highest characters whose UTF-8 begins with `tail` (only a second byte is ever
    constrained beyond 0x80..0xBF, so the rest is filled with 0x80 or 0xBF)."""
    width = 2 if tail[0] < 0xE0 else 3 if tail[0] < 0xF0 else 4
    found = []
    for fill, seconds in ((0x80, range(0x80, 0xC0)), (0xBF, range(0xBF, 0x7F, -1))):
        for head in [tail] if len(tail) > 1 else (tail + bytes([b]) for b in seconds):
            try:
                found.append((head + bytes([fill]) * (width - len(head))).decode())
                break
            except UnicodeDecodeError:
                continue
    return found


def assert_tables_match_oracle(grammar: Grammar, tokenizer, pattern: str, depth: int = 3) -> int:
    """Every token sequence of up to `depth` tokens: the tables allow it exactly where the oracle does.
    Sequences are enumerated as a tree whose nodes are the oracle's valid prefixes: at each node every
    one of the V tokens is checked (allowed bit, next state, EOS), and only allowed ones are extended,
    since a sequence through a refused token is refused by both. Returns the number of nodes checked."""
    tables, V = grammar.tables(), grammar.vocab_size
    texts = token_bytes(tokenizer).tokens
    eos = torch.zeros(V, dtype=torch.bool)
    eos[list(grammar.eos_ids)] = True
    frontier, checked = {b"": 0}, 0
    for level in range(depth + 1):
        states = torch.tensor(list(frontier.values()), dtype=torch.int64)
        allowed = allowed_tokens(tables, states, V)  # [N, V]
        nexts = next_state(tables, states[:, None].expand(-1, V), torch.arange(V).expand(len(states), -1), V)
        grown = {}
        for (text, state), row, nxt in zip(frontier.items(), allowed.tolist(), nexts.tolist()):
            full = oracle(pattern, text) == "full"
            assert bool(tables.final[state]) == full, (pattern, text)
            for v in range(V):
                if eos[v]:
                    assert row[v] == full and nxt[v] == -1, (pattern, text, v)
                    continue
                ok = texts[v] is not None if v < len(texts) else False
                ok = ok and oracle(pattern, text + texts[v]) is not None
                assert row[v] == ok and (nxt[v] >= 0) == ok, (pattern, text, v, texts[v] if v < len(texts) else None)
                if ok and level < depth:
                    assert grown.setdefault(text + texts[v], nxt[v]) == nxt[v]  # one text, one state
            checked += 1
        frontier = grown
    return checked


def walk(grammar: Grammar, ids: list[int]) -> int | None:
    """The state `ids` lead to through the tables' reference reads; None where a token is refused where it
    comes. An EOS id ends the output: allowed in accepting states only, and nothing may follow it."""
    tables, V, state = grammar.tables(), grammar.vocab_size, torch.tensor(0)
    for i, token in enumerate(ids):
        if not allowed_tokens(tables, state, V)[token]:
            return None
        if token in grammar.eos_ids:
            return int(state) if i == len(ids) - 1 else None
        state = next_state(tables, state, torch.tensor(token), V)
        assert state >= 0  # an allowed token that is not EOS is a transition
    return int(state)


def accepts(grammar: Grammar, tokenizer, text: str) -> bool:
    """Whether `text` (encoded without special tokens) walks to an accepting state, where EOS is allowed."""
    state = walk(grammar, tokenizer.encode(text, add_special_tokens=False))
    if state is None:
        return False
    tables = grammar.tables()
    eos_allowed = allowed_tokens(tables, torch.tensor(state), grammar.vocab_size)[list(grammar.eos_ids)]
    assert bool(eos_allowed.all()) == bool(eos_allowed.any()) == bool(tables.final[state])
    return bool(tables.final[state])


# --- tests ------------------------------------------------------------------------------------------------


def test_token_bytes_of_a_byte_level_bpe():
    tok = byte_bpe()
    text = token_bytes(tok).tokens
    ids = tok.convert_tokens_to_ids
    assert text[ids("Ġ")] == b" " and text[ids("Ċ")] == b"\n" and text[ids("Ġa")] == b" a"
    assert text[ids("Ã")] == b"\xc3" and text[ids("Ã©")] == "é".encode()
    assert text[tok.eos_token_id] is None and text[tok.pad_token_id] is None  # specials have no text
    assert text[ids("<tool>")] == b"<tool>"  # an added token that is not special is its text


def test_token_bytes_of_a_sentencepiece_bpe():
    tok = sentencepiece()
    text = token_bytes(tok).tokens
    ids = tok.convert_tokens_to_ids
    assert text[ids("▁")] == b" " and text[ids("▁ab")] == b" ab" and text[ids("é")] == "é".encode()
    assert text[ids("<0x0A>")] == b"\n" and text[ids("<0xC3>")] == b"\xc3" and text[ids("<0xFF>")] == b"\xff"
    assert all(text[i] is None for i in (0, 1, 2))  # <unk>, <s>, </s>


@pytest.mark.parametrize("which", ["qwen", "smol"])
def test_token_bytes_decode_like_the_tokenizer(which, request):
    """Every 11th id with whole UTF-8 text: its bytes are what the tokenizer's own decode gives."""
    tok = request.getfixturevalue(which)
    text = token_bytes(tok).tokens
    checked = 0
    for i in range(0, len(text), 11):
        if text[i] is None:
            continue
        try:
            expected = text[i].decode()
        except UnicodeDecodeError:
            continue
        assert tok.decode([i]) == expected, i
        checked += 1
    assert checked > len(text) // 20


PATTERNS = [  # small alphabets: the tree of valid prefixes stays small (digits 0..2, not 0..9)
    r"[12]+(\.[12]+)?",  # outlines-core alone refuses '.' after '1' (a token past a complete match)
    r"a|ab|abc",  # outlines-core alone refuses 'ab' (its DFA is leftmost-first)
    r"(ab|b)+é?",  # é spelled whole or as two byte tokens
    r"-?(0|[12][0-2]*)",
    r'"[a-c ]{0,3}"',
    r"(true|false) ?",
    r"[αβ]é",  # two-byte characters only
    r"",  # the empty text alone: no transitions at all
]


@pytest.mark.parametrize("which", TINY)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_tables_equal_the_regex_oracle_on_every_sequence_of_three_tokens(which, pattern):
    tok = TINY[which]()
    grammar = Grammar.from_regex(pattern, tok)
    assert assert_tables_match_oracle(grammar, tok, pattern) >= 1


CASES = [  # pattern, texts it matches, texts it does not
    (r"[0-9]+(\.[0-9]+)?", ["3.14159", "42", "1.5"], ["3.14.1", "3.", ".5", "x"]),
    (r"(yes|no), because [a-z ]+\.", ["yes, because it is.", "no, because no."], ["yes because.", "maybe."]),
    (r"[αβγ]+ é+", ["αβ éé", "γ é"], ["α e", "αé"]),
    (r"a|ab|abc", ["a", "ab", "abc"], ["abcd", "b"]),
]


@pytest.mark.parametrize("which", ["byte-bpe", "sentencepiece", "qwen", "smol"])
def test_encoded_matches_walk_to_an_accepting_state(which, request):
    tok = TINY[which]() if which in TINY else request.getfixturevalue(which)
    for pattern, good, bad in CASES:
        grammar = Grammar.from_regex(pattern, tok)
        for text in good:
            assert accepts(grammar, tok, text), (which, pattern, text, tok.tokenize(text))
        for text in bad:
            assert not accepts(grammar, tok, text), (which, pattern, text)


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["name", "age", "ok"],
}


@pytest.mark.parametrize("which", ["byte-bpe", "sentencepiece", "qwen"])
def test_json_schema_as_dict_or_text_is_one_grammar(which, request):
    tok = TINY[which]() if which in TINY else request.getfixturevalue(which)
    grammar = Grammar.from_json_schema(SCHEMA, tok)
    assert Grammar.from_json_schema(json.dumps(SCHEMA, indent=2), tok) is grammar  # same JSON, same grammar
    good = json.dumps({"name": 'Ann "A" é', "age": -31, "ok": True}, ensure_ascii=False)
    assert accepts(grammar, tok, good) and json.loads(good)["age"] == -31
    assert accepts(grammar, tok, '{"name":"Bo","age":0,"ok":false}')
    for bad in (
        '{"name": "Ann", "ok": true}',
        '{"age": 3, "name": "Ann", "ok": true}',
        '{"name": "A", "age": 01, "ok": true}',
        '{"name": "Ann", "age": 3, "ok": true} x',
    ):
        assert not accepts(grammar, tok, bad), bad
    assert regex.fullmatch(grammar.pattern, good)
    other = dict(SCHEMA, properties=dict(reversed(SCHEMA["properties"].items())))  # key order is the output's
    assert Grammar.from_json_schema(other, tok).pattern != grammar.pattern


def test_building_the_same_grammar_twice_is_free():
    CACHE.clear()
    tok = byte_bpe()
    first = Grammar.from_regex(r"[0-9]+", tok)
    assert (CACHE.hits, CACHE.misses) == (0, 1)
    assert Grammar.from_regex(r"[0-9]+", tok) is first
    # Another load of the same vocabulary is the same tokenizer: same name, same bytes.
    twin = transformers.PreTrainedTokenizerFast(
        tokenizer_object=byte_bpe().backend_tokenizer,
        eos_token="<eos>",
        pad_token="<pad>",
        name_or_path="tiny-byte-bpe",
    )
    twin.add_tokens(["<tool>"])
    assert Grammar.from_regex(r"[0-9]+", twin) is first
    assert (CACHE.hits, CACHE.misses) == (2, 1)
    # What changes the tables is part of the key.
    assert Grammar.from_regex(r"[0-9]*", tok) is not first
    assert Grammar.from_regex(r"[0-9]+", tok, vocab_size=len(tok) + 1) is not first
    assert Grammar.from_regex(r"[0-9]+", tok, eos_token_id=tok.pad_token_id) is not first
    assert Grammar.from_regex(r"[0-9]+", sentencepiece()) is not first
    assert (CACHE.hits, CACHE.misses) == (2, 5)


def test_padding_ids_past_the_tokenizer_are_never_allowed():
    tok = sentencepiece()
    n, V = len(tok), len(tok) + 45
    grammar = Grammar.from_regex(r".{0,3}", tok, vocab_size=V)
    tables = grammar.tables()
    assert grammar.vocab_size == V and tuple(tables.allowed.shape) == (grammar.num_states, -(-V // 32))
    allowed = allowed_tokens(tables, torch.arange(grammar.num_states), V)
    assert allowed[:, 3:n].any() and not allowed[:, n:].any()
    assert bool((tables.keys % V < n).all()) and bool((tables.keys // V < grammar.num_states).all())
    assert bool((tables.keys[1:] > tables.keys[:-1]).all())  # sorted ascending, one key per transition
    assert tables.allowed.dtype == torch.int32 and bool((tables.allowed == -1).any())  # all 32 bits: -1
    with pytest.raises(ValueError, match="vocab_size=10 is below"):
        Grammar.from_regex("a", tok, vocab_size=10)


def test_eos_is_allowed_in_accepting_states_only():
    tok = byte_bpe()
    extra = tok.convert_tokens_to_ids("Ġ")  # a stop id that is also text: it leaves the language
    grammar = Grammar.from_regex(r"a( a)*", tok, eos_token_id=[extra])
    assert grammar.eos_ids == tuple(sorted((tok.eos_token_id, extra)))
    tables = grammar.tables()
    allowed = allowed_tokens(tables, torch.arange(grammar.num_states), grammar.vocab_size)
    for eos in grammar.eos_ids:
        assert torch.equal(allowed[:, eos], tables.final)
    assert not bool(torch.isin(tables.keys % grammar.vocab_size, torch.tensor(grammar.eos_ids)).any())
    assert tok.tokenize("a a  a") == ["a", "Ġa", "Ġ", "Ġa"]
    assert accepts(grammar, tok, "a a") and not accepts(grammar, tok, "a a  a")  # `Ġ` (EOS) ends the output


def test_a_real_json_schema_fits_in_megabytes(qwen):
    """Qwen2.5 (V = 151,936): a dense [S, V] int32 table would be S * 0.6 MB; the bitmask is V / 8 bytes
    per state and the sorted list 16 bytes per transition."""
    grammar = Grammar.from_json_schema(SCHEMA, qwen)
    tables = grammar.tables()
    assert tables.allowed.shape == (grammar.num_states, 4748)
    assert tables.nbytes() < grammar.num_states * qwen.vocab_size * 4 / 2
    assert accepts(grammar, qwen, '{"name": "Zoë", "age": 7, "ok": true}')
    assert "states" in repr(grammar) and "151,936" in repr(grammar)


@pytest.mark.parametrize(
    "pattern, why",
    [
        (r"a(?=b)", "lookaround"),
        (r"(a)\1", "backreference"),
        (r"^ab", "anchor"),
        (r"ab$", "anchor"),
        (r"a)|(b", "unbalanced"),
        (r"(ab", "unclosed"),
        (r"[ab", "unclosed"),
        ("ab\\", "lone backslash"),
        (r"\bab", "word boundaries"),
    ],
)
def test_unsupported_constructs_are_named_before_compiling(pattern, why):
    with pytest.raises(ValueError, match=why) as e:
        Grammar.from_regex(pattern, byte_bpe())
    assert repr(pattern) in str(e.value)


def test_invalid_schemas_and_full_pools_are_errors():
    tok = byte_bpe()
    anchored = {"type": "string", "pattern": "^a"}  # outlines-core drops a ^...$ pair, not a lone ^
    for schema, why in (
        ("{", "not valid JSON"),
        ('{"type": "frob"}', "not supported"),
        ("[1]", "a JSON object"),
        (anchored, "anchor"),
    ):
        with pytest.raises(ValueError, match=why) as e:
            Grammar.from_json_schema(schema, tok)
        assert "JSON schema" in str(e.value)
    grammar = Grammar.from_json_schema(SCHEMA, tok)
    grammar.check_capacity(grammar.num_states, grammar.num_transitions)
    with pytest.raises(ValueError, match="DecodeConfig.max_grammar_states") as e:
        grammar.check_capacity(grammar.num_states - 1, grammar.num_transitions)
    assert "max_grammar_transitions" not in str(e.value)
    with pytest.raises(ValueError, match="DecodeConfig.max_grammar_transitions"):
        grammar.check_capacity(grammar.num_states, grammar.num_transitions - 1)
    with pytest.raises(ValueError, match="no eos_token_id"):
        Grammar.from_regex("a", transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer))
