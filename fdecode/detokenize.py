"""`Detokenizer`: token ids to text, one piece at a time, never a broken character (docs/serving.md).

A token may end inside a multi-byte character (byte-level BPE, byte fallback, fdecode's byte tokenizer),
and SentencePiece-style tokenizers drop or add a leading space depending on what precedes a token, so
decoding each token alone gives wrong text. Instead the detokenizer keeps two offsets into the ids seen:
`prefix` (where the last decoded window starts) and `read` (the end of what was already turned into
text). Each `push` decodes `ids[prefix:]` and `ids[prefix:read]` and emits the difference, unless the
window ends in U+FFFD (a character still incomplete): then it waits for more ids. `flush` emits whatever
is left, replacement character included, at the end of a request. Concatenating every piece gives
`tokenizer.decode(ids)` wherever that text has no U+FFFD of its own in the middle of a stream.
"""

from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT = "\ufffd"


class Detokenizer:
    """Incremental decoding of one request's new tokens (special tokens skipped)."""

    def __init__(self, tokenizer, prompt: Sequence[int] = ()) -> None:
        """prompt: the ids before the first new token (their last few set the context of the first piece)."""
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt[-4:])  # a little context: a leading space is decoded as in the stream
        self.prefix = 0
        self.read = len(self.ids)
        self.text = ""  # everything emitted so far

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def push(self, new_ids: Sequence[int]) -> str:
        """Add tokens; returns the text they complete ('' while a character is still split)."""
        self.ids += [int(i) for i in new_ids]
        before = self._decode(self.ids[self.prefix : self.read])
        window = self._decode(self.ids[self.prefix :])
        if len(window) <= len(before) or window.endswith(REPLACEMENT):
            return ""  # nothing new yet, or a character is cut at the end: wait for its next bytes
        piece = window[len(before) :]
        self.prefix, self.read = self.read, len(self.ids)
        self.text += piece
        return piece

    def flush(self) -> str:
        """The text still held back (a character cut by the end of the request decodes as U+FFFD)."""
        before = self._decode(self.ids[self.prefix : self.read])
        window = self._decode(self.ids[self.prefix :])
        piece = window[len(before) :] if window.startswith(before) else ""
        self.prefix = self.read = len(self.ids)
        self.text += piece
        return piece

    def __repr__(self) -> str:
        return f"Detokenizer({len(self.ids)} ids, {len(self.text)} chars emitted, {len(self.ids) - self.read} held)"
