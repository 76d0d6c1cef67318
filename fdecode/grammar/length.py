"""How long a grammar's output can be: the most tokens its automaton can emit before it must end.

A request's `min_tokens` masks the stop ids until that many tokens are out, and a grammar allows its EOS
only where its language accepts. Where every path through the automaton reaches a state that allows
nothing but EOS within fewer than `min_tokens` tokens, the two masks together leave a row no token:
`fdecode.params.check_features` refuses that request before anything runs (the step stops a lane that
gets there anyway, `fdecode.ops.sampling.cut_at_masked_rows`).
"""

from __future__ import annotations

import weakref

import torch

_LONGEST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # grammar -> its `longest_output`


def longest_output(grammar) -> int | None:
    """The most tokens (EOS not counted) a walk from the initial state can take, None where a cycle is
    reachable (unbounded). From the grammar's tables; cached per grammar object."""
    try:
        return _LONGEST[grammar]
    except (KeyError, TypeError):
        pass
    tables = grammar.tables()
    states, vocab = grammar.num_states, grammar.vocab_size
    pairs = torch.unique((tables.keys // vocab) * states + tables.next)  # state -> state edges, once each
    src, dst = pairs // states, pairs % states
    reach = torch.full((states,), -1, dtype=torch.int64)  # the longest walk to each state, -1: not reached
    reach[0] = 0
    longest = None
    for _ in range(states + 1):  # a walk without a cycle has at most S - 1 edges; one more round sees a cycle
        step = torch.where(reach[src] >= 0, reach[src] + 1, -1)
        grown = reach.scatter_reduce(0, dst, step, reduce="amax")
        if torch.equal(grown, reach):
            longest = int(reach.max())
            break
        reach = grown
    try:
        _LONGEST[grammar] = longest
    except TypeError:  # not weakly referable: not cached
        pass
    return longest
