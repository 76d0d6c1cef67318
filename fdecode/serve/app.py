"""The FastAPI app: OpenAI's routes over a `Server` (docs/serving.md).

    POST /v1/chat/completions, POST /v1/completions   streamed (SSE) or not
    GET  /v1/models, GET /health (503 until warm-up ends), GET /metrics (Prometheus text)

Bodies are checked by pydantic (`schemas.py`) and against the model (`requests.prepare`, in a worker
thread: building a grammar may take a while); every refusal is an OpenAI error body (`errors.py`).
A streamed response's status is decided before its first byte: the request is accepted by the engine
loop first, so a refused request is a 4xx, never a 200 with an error inside. Errors after that (the
Engine failing the request) end the stream with an error event.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from fdecode.serve.errors import APIError, validation_error
from fdecode.serve.generation import EngineFailure, Generation
from fdecode.serve.requests import prepare
from fdecode.serve.responses import DONE, Reply, sse
from fdecode.serve.schemas import ChatRequest, CompletionRequest

DISCONNECT_POLL = 0.5  # seconds between checks that a non-streaming client is still there


def build_app(server) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await run_in_threadpool(server.shutdown)  # uvicorn drained the connections: stop the loop

    app = FastAPI(title="fdecode", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        server.metrics.reject(error.status)
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return await api_error(request, validation_error(list(error.errors())))

    @app.get("/health")
    async def health() -> JSONResponse:
        if not server.ready.is_set():
            return JSONResponse({"status": "warming up"}, status_code=503)
        return JSONResponse({"status": "ok", "in_flight": server.loop.in_flight})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.page(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict:
        model = server.model
        card = {"id": model.name, "object": "model", "created": server.started, "owned_by": "fdecode",
                "max_model_len": model.max_seq_len}  # fmt: skip
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        return await complete(body, request, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await complete(body, request, chat=False)

    async def complete(body, request: Request, *, chat: bool):
        prepared = await run_in_threadpool(prepare, server.model, body)
        generation = Generation(server, prepared)
        try:
            await generation.start()
        except asyncio.CancelledError:  # the client left while the request was being queued
            generation.abandon()
            raise
        reply = Reply(chat, server.model.name, server.model.tokenizer)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(stream(generation, reply, usage), media_type="text/event-stream")
        return await whole(generation, reply, request)

    async def stream(generation: Generation, reply: Reply, usage: bool):
        offset = 0
        deltas = generation.deltas()
        try:
            if reply.chat:
                yield sse(reply.chunk(None, first=True, usage=usage))
            async for delta in deltas:
                if delta.text or delta.finish_reason or delta.logprobs:
                    yield sse(reply.chunk(delta, offset=offset, usage=usage))
                offset += len(delta.text)
            if usage:
                yield sse(reply.usage_chunk(reply.usage(generation.prompt_tokens, generation.completion_tokens)))
        except EngineFailure as error:
            yield sse(APIError(500, str(error), code="engine_error").body())
        finally:
            await deltas.aclose()
            generation.abandon()  # a dropped client: cancels the request
        yield DONE

    async def whole(generation: Generation, reply: Reply, request: Request) -> JSONResponse:
        async def collect() -> JSONResponse:
            text, lps, finish = "", None, "stop"
            try:
                async for delta in generation.deltas():
                    text += delta.text
                    if delta.logprobs is not None:
                        lps = (lps or []) + delta.logprobs
                    finish = delta.finish_reason or finish
            except EngineFailure as error:
                raise APIError(500, str(error), code="engine_error") from None
            usage = reply.usage(generation.prompt_tokens, generation.completion_tokens)
            if lps is None and generation.prepared.logprobs is not None:
                lps = []
            return JSONResponse(reply.whole(text, lps, finish, usage))

        task = asyncio.ensure_future(collect())
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=DISCONNECT_POLL)
                if not task.done() and await request.is_disconnected():
                    task.cancel()  # the client left: its request is cancelled (`Generation.deltas`)
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    return JSONResponse({}, status_code=499)
            return task.result()
        finally:
            generation.abandon()

    return app
