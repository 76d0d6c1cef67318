"""Response bodies and server-sent-event chunks in OpenAI's shapes (docs/serving.md, "What is supported").

Chat: `chat.completion` / `chat.completion.chunk` (the first chunk carries the assistant role, the last
the finish reason; with `stream_options.include_usage` one more chunk with no choices carries the usage,
and every other chunk `"usage": null`). Completions: `text_completion` in both cases. Logprobs: chat's
`{"content": [{token, logprob, bytes, top_logprobs}]}`, completions' `{tokens, token_logprobs,
top_logprobs, text_offset}`. A token's text is its own decode (a piece of a multi-byte character shows as
U+FFFD there; `bytes` has its exact bytes where the tokenizer spells them).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from fdecode.runtime.logprobs import TokenLogprob
from fdecode.serve.generation import Delta


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


DONE = sse("[DONE]")


@dataclass
class Reply:
    """What every chunk of one response shares."""

    chat: bool
    model: str
    tokenizer: object
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    # ------------------------------------------------------------------ logprobs

    def _token(self, token: int) -> tuple[str, list[int]]:
        spell = getattr(self.tokenizer, "token_bytes", None)
        if callable(spell):  # the byte tokenizer spells its ids exactly; its special ids have no text
            table = self._table = getattr(self, "_table", None) or spell()
            raw = table[token] if token < len(table) else None
            return ("", []) if raw is None else (raw.decode("utf-8", errors="replace"), list(raw))
        text = self.tokenizer.decode([token], skip_special_tokens=False)
        return text, list(text.encode("utf-8"))

    def chat_logprobs(self, lps: list[TokenLogprob]) -> list[dict]:
        out = []
        for lp in lps:
            text, raw = self._token(lp.token)
            top = []
            for t, v in lp.top.items():
                t_text, t_raw = self._token(t)
                top.append({"token": t_text, "logprob": v, "bytes": t_raw})
            out.append({"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top})
        return out

    def completion_logprobs(self, lps: list[TokenLogprob], offset: int) -> dict:
        tokens, values, tops, offsets = [], [], [], []
        for lp in lps:
            text = self._token(lp.token)[0]
            tokens.append(text)
            values.append(lp.logprob)
            tops.append({self._token(t)[0]: v for t, v in lp.top.items()})
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    # ------------------------------------------------------------------ bodies

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def whole(self, text: str, lps: list[TokenLogprob] | None, finish: str, usage: dict) -> dict:
        """The non-streamed body."""
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None if lps is None else {"content": self.chat_logprobs(lps)},
                "finish_reason": finish,
            }
        else:
            logprobs = None if lps is None else self.completion_logprobs(lps, 0)
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }

    def chunk(self, delta: Delta | None, *, offset: int = 0, first: bool = False, usage: bool = False) -> dict:
        """A streamed chunk of `delta` (None with `first`: chat's role chunk); usage: include `"usage": null`."""
        lps = None if delta is None else delta.logprobs
        finish = None if delta is None else delta.finish_reason
        text = "" if delta is None else delta.text
        if self.chat:
            content = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            choice = {
                "index": 0,
                "delta": content,
                "logprobs": None if lps is None else {"content": self.chat_logprobs(lps)},
                "finish_reason": finish,
            }
        else:
            logprobs = None if lps is None else self.completion_logprobs(lps, offset)
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        body = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if usage:
            body["usage"] = None
        return body

    def usage_chunk(self, usage: dict) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage,
        }
