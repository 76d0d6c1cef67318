"""`Generation`: one request's life on the HTTP side, as a stream of `Delta`s (docs/serving.md, "How it runs").

`start` submits the job to the engine loop and waits for its verdict (refused: an `APIError`, before
any byte of the response is sent). `deltas` then turns the Engine's events into text: ids go through a
`Detokenizer` (no broken characters), then through `StopStrings`; a matched stop string cancels the
request in the Engine at once (its lane is freed) and ends the stream with finish reason "stop". If the
consumer goes away (a dropped client cancels the response task) the request is cancelled the same way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fdecode.detokenize import Detokenizer
from fdecode.runtime.logprobs import TokenLogprob
from fdecode.serve.errors import APIError
from fdecode.serve.loop import Job
from fdecode.serve.requests import Prepared
from fdecode.serve.stops import StopStrings

FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "abort"}


@dataclass
class Delta:
    text: str  # new text (may be '' while a character or a possible stop string is held back)
    tokens: list[int]  # the ids this delta commits
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None = None  # on the last delta: "stop", "length" or "abort"


class EngineFailure(Exception):
    """The Engine ended the request with an error (its message is the Event's)."""


class Generation:
    def __init__(self, server, prepared: Prepared) -> None:
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.server = server
        self.prepared = prepared
        self.job = Job(
            prepared.prompt, prepared.params, lambda item: loop.call_soon_threadsafe(self.queue.put_nowait, item)
        )
        self.detokenizer = Detokenizer(server.model.tokenizer, prepared.prompt)
        self.stops = StopStrings(prepared.stops)
        self.completion_tokens = 0
        self.done = False

    @property
    def prompt_tokens(self) -> int:
        return len(self.prepared.prompt)

    async def start(self) -> None:
        """Queue the request; raises APIError where it is refused (full, shutting down, or by the Engine)."""
        self.server.loop.submit(self.job)
        kind, value = await self.queue.get()
        if kind == "error":
            self.done = True
            raise APIError(400, value)
        self.server.metrics.accept(self.prompt_tokens)

    def abandon(self) -> None:
        """Cancel the request unless it ended (a consumer that left; harmless after the end)."""
        if not self.done:
            self.done = True
            self.server.loop.cancel(self.job)

    async def deltas(self):
        """The request's deltas, the last with a finish reason. Raises EngineFailure on an Engine error."""
        try:
            while True:
                _, event = await self.queue.get()
                if event.reason == "error":
                    self.done = True
                    raise EngineFailure(event.error or "the engine stopped the request")
                self.completion_tokens += len(event.new_tokens)
                text = self.detokenizer.push(event.new_tokens)
                if event.finished:
                    text += self.detokenizer.flush()
                out = self.stops.push(text)
                if self.stops.matched is not None:
                    self.server.loop.cancel(self.job)
                    self.done = True
                    yield Delta(out, event.new_tokens, event.logprobs, "stop")
                    return
                if event.finished:
                    self.done = True
                    out += self.stops.finish()
                    yield Delta(out, event.new_tokens, event.logprobs, FINISH_REASONS.get(event.reason, "stop"))
                    return
                yield Delta(out, event.new_tokens, event.logprobs)
        finally:
            self.abandon()  # the consumer left (a dropped client): free the lane
