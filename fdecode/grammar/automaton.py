"""A regex compiled to a token-level DFA with outlines-core (docs/design.md, "Structured output").

`outlines_core.Index(regex, Vocabulary(eos_id, {bytes: [ids]}))` walks every token's bytes through the
regex's byte DFA from every reachable state. Two of its rules would lose valid outputs, so the pattern is
compiled as `(?:pattern)` followed by an end marker `END` (U+10FFFF, a noncharacter) that only a token
of our own, id `n`, spells:
- outlines-core drops a token whose last byte follows a complete match unless the text is again a
  complete match (`[0-9]+(\\.[0-9]+)?` after `1` refuses `.`: `1.5` spelled `1`, `.`, `5` is lost);
- its DFA is leftmost-first, so after a match it abandons lower-priority alternatives (`a|ab` refuses `ab`).
With the marker a match can only end at the marker, so neither rule ever fires on real text. A state
accepts where the marker leads to an outlines-core final state; marker and EOS transitions are then
dropped. States are renumbered 0..S-1 from the initial state (breadth first), and only states that are
reachable and can still reach an accepting state are kept, so no allowed token leads to a dead end.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fdecode.grammar.syntax import check_pattern, excerpt
from fdecode.grammar.vocabulary import TokenBytes

END = "\U0010ffff"


class Automaton(NamedTuple):
    """A token-level DFA with local states; transitions sorted by (state, token)."""

    num_states: int  # S; state 0 is the initial state
    src: np.ndarray  # [T] int64, the state each transition leaves
    token: np.ndarray  # [T] int64, its token id (never an EOS id: EOS is no transition)
    dst: np.ndarray  # [T] int64, the state it enters
    final: np.ndarray  # [S] bool, accepting states


def compile_regex(pattern: str, vocab: TokenBytes, eos_ids: tuple[int, ...]) -> Automaton:
    """`pattern` over `vocab`'s token bytes, EOS ids left out of the language. Raises ValueError naming
    the pattern for an unsupported construct or a language the vocabulary cannot spell."""
    check_pattern(pattern)
    outlines = import_outlines()
    n = len(vocab)
    end_id, outlines_eos = n, n + 1  # ids of our own, past the tokenizer's
    by_text: dict[bytes, list[int]] = {END.encode(): [end_id]}
    for i, text in enumerate(vocab.tokens):
        if text is not None and i not in eos_ids:
            by_text.setdefault(text, []).append(i)
    try:
        index = outlines.Index(f"(?:{pattern})" + r"\x{10FFFF}", outlines.Vocabulary(outlines_eos, by_text))
    except (ValueError, TypeError, RuntimeError) as e:
        raise ValueError(
            f"regex {excerpt(pattern)} cannot be compiled over the vocabulary of {vocab.name!r}: {e}"
        ) from None
    outlines_final = index.get_final_states()
    src, tok, dst, accepting, forward = [], [], [], set(), {}
    for state, moves in index.get_transitions().items():
        if moves.get(end_id) in outlines_final:
            accepting.add(state)
        tokens = np.fromiter(moves.keys(), np.int64, len(moves))
        real = tokens < n
        src.append(np.full(int(real.sum()), state, np.int64))
        tok.append(tokens[real])
        dst.append(np.fromiter(moves.values(), np.int64, len(moves))[real])
        forward[state] = set(dst[-1].tolist())
    live = _live_states(index.get_initial_state(), forward, accepting)
    if not live:
        raise ValueError(f"regex {excerpt(pattern)} matches no text the vocabulary of {vocab.name!r} can spell")
    return _renumbered(live, *(np.concatenate(a) for a in (src, tok, dst)), accepting)


def import_outlines():
    """The outlines_core module, or ImportError saying how to install it (an optional dependency)."""
    try:
        import outlines_core
    except ImportError as e:
        raise ImportError('grammars need outlines-core: pip install -e ".[grammar]"') from e
    return outlines_core


def _live_states(initial: int, forward: dict[int, set[int]], accepting: set[int]) -> list[int]:
    """The states reachable from `initial` along `forward` (each state's next states) that can reach an
    accepting state, breadth first from `initial` (so it comes first); empty where `initial` cannot accept."""
    backward: dict[int, list[int]] = {}
    for a, nexts in forward.items():
        for b in nexts:
            backward.setdefault(b, []).append(a)
    coreach = _closure(accepting, backward)
    if initial not in coreach:
        return []
    return list(_closure([initial], forward, keep=coreach))


def _closure(start, edges: dict[int, list[int]], keep=None) -> dict[int, None]:
    """The states reached from `start` along `edges` (within `keep`), in breadth-first order."""
    seen = dict.fromkeys(start)
    frontier = list(seen)
    while frontier:
        nxt = []
        for s in frontier:
            for t in edges.get(s, ()):
                if t not in seen and (keep is None or t in keep):
                    seen[t] = None
                    nxt.append(t)
        frontier = nxt
    return seen


def _renumbered(live: list[int], src, tok, dst, accepting: set[int]) -> Automaton:
    ids = np.array(live, np.int64)
    order = np.argsort(ids)
    sorted_ids, local = ids[order], order  # outlines-core id -> local index, by search

    def to_local(states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = np.clip(np.searchsorted(sorted_ids, states), 0, len(ids) - 1)
        return local[at], sorted_ids[at] == states

    s, s_ok = to_local(src)
    d, d_ok = to_local(dst)
    keep = s_ok & d_ok
    s, t, d = s[keep], tok[keep], d[keep]
    by_key = np.argsort(s * (int(t.max(initial=0)) + 1) + t)
    final = np.array([state in accepting for state in live], bool)
    return Automaton(len(live), s[by_key], t[by_key], d[by_key], final)
