"""Compiled grammars, kept by what determines them (docs/design.md, "Structured output").

Compiling walks every token from every state (seconds at V = 151,936), and requests repeat a few
grammars. The key holds everything the tables depend on: the kind and its text (the pattern, or the
schema as JSON), the tokenizer's identity (its name_or_path and the sha256 of every token's bytes, so
two loads of one tokenizer share entries and an edited vocabulary does not), the EOS ids, the vocabulary
size and the kind's options. Past `max_entries` the least recently used grammar goes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


class GrammarCache:
    """A bounded least-recently-used map from a grammar's key to the grammar; counts hits and misses."""

    def __init__(self, max_entries: int = 64) -> None:
        self.max_entries = max_entries
        self.hits = self.misses = 0
        self._entries: OrderedDict[Hashable, object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """The entry at `key`, built (outside the lock: compiling takes seconds) when absent."""
        with self._lock:
            if key in self._entries:
                self.hits += 1
                self._entries.move_to_end(key)
                return self._entries[key]
            self.misses += 1
        value = build()
        with self._lock:
            self._entries[key] = value
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"GrammarCache({len(self)}/{self.max_entries} grammars, {self.hits} hits, {self.misses} misses)"


CACHE = GrammarCache()
