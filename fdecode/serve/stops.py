"""`StopStrings`: OpenAI's `stop`, matched on the detokenized text, across token boundaries.

A stop string may span several tokens (or end inside one), so it is searched in the text, not the ids.
Text is released as it comes, except for the last `longest - 1` characters, which could be the start
of a stop string still being written; on a match everything from the stop string on is dropped (OpenAI
leaves the stop string out) and the request ends with finish reason "stop". At the end of a request
(`finish`) the held-back tail is released.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStrings:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""  # text received but not released yet
        self.matched: str | None = None  # the stop string found, once found

    def push(self, text: str) -> str:
        """The text that can be released after `text` arrives ('' once a stop string matched)."""
        if self.matched is not None:
            return ""
        self.pending += text
        hits = [(i, s) for s in self.stops if (i := self.pending.find(s)) >= 0]
        if hits:
            cut, self.matched = min(hits)
            out, self.pending = self.pending[:cut], ""
            return out
        keep = len(self.pending) - self.hold
        if keep <= 0:
            return ""
        out, self.pending = self.pending[:keep], self.pending[keep:]
        return out

    def finish(self) -> str:
        """The held-back tail, at the end of a request that matched no stop string."""
        out, self.pending = ("" if self.matched is not None else self.pending), ""
        return out

    def __repr__(self) -> str:
        return f"StopStrings({self.stops!r}, holding {len(self.pending)} chars, matched={self.matched!r})"
