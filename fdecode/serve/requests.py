"""A request body as what the Engine runs: prompt ids, a `SamplingParams`, the stop strings (docs/serving.md).

Everything a request can get wrong is found here, before the Engine sees it, and raised as a 400/404
`APIError`: an unknown model, n > 1, a prompt longer than the context, max_tokens past it, a logit_bias
key that is not a token id, a grammar the compiler refuses or that does not fit the pool, a feature the
step was not compiled with. OpenAI's defaults: temperature 1, top_p 1; completions stop after 16 tokens
unless max_tokens says otherwise, chat at the end of the context. `top_k=-1` (vLLM) means off. A request
stops at the model's EOS ids and the tokenizer's (a chat model's end-of-turn token).
"""

from __future__ import annotations

from dataclasses import dataclass

from fdecode.grammar import Grammar
from fdecode.params import SamplingParams, check_features
from fdecode.serve.errors import APIError
from fdecode.serve.schemas import ChatRequest, CompletionRequest, ResponseFormat
from fdecode.text import encode

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOPS = 16
# `response_format: json_object`: an object of string, number, boolean and null values (the whole of JSON
# compiles to an automaton far larger than a server's grammar pool).
JSON_OBJECT = {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean", "null"]}}


@dataclass(frozen=True)
class Prepared:
    prompt: list[int]
    params: SamplingParams
    stops: tuple[str, ...]
    logprobs: int | None  # alternatives per token, where asked


def _unsupported(param: str, why: str) -> APIError:
    return APIError(400, f"{param}: {why}", param=param, code="unsupported")


def _grammar(model, response_format: ResponseFormat | None, regex: str | None) -> Grammar | None:
    kinds = [k for k in (response_format and response_format.type != "text", regex is not None) if k]
    if len(kinds) > 1:
        raise _unsupported("guided_regex", "pass either response_format or guided_regex, not both")
    try:
        if regex is not None:
            return Grammar.from_regex(regex, model.tokenizer, vocab_size=model.vocab_size)
        if response_format is None or response_format.type == "text":
            return None
        if response_format.type == "json_object":
            return Grammar.from_json_schema(JSON_OBJECT, model.tokenizer, vocab_size=model.vocab_size)
        if response_format.json_schema is None:
            raise APIError(400, "response_format json_schema needs a json_schema object", param="response_format")
        schema = response_format.json_schema.schema_
        return Grammar.from_json_schema(schema, model.tokenizer, vocab_size=model.vocab_size)
    except ValueError as error:
        raise APIError(400, f"the grammar was refused: {error}", param="response_format", code="bad_grammar") from None


def _bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if not bias:
        return None
    try:
        return {int(k): float(v) for k, v in bias.items()}
    except ValueError:
        raise APIError(400, f"logit_bias keys must be token ids, got {list(bias)!r}", param="logit_bias") from None


def prepare(model, body: ChatRequest | CompletionRequest) -> Prepared:
    """Check `body` against the served model (`model`: a `ServedModel`) and build what the loop runs."""
    if body.model is not None and body.model not in model.names:
        raise APIError(404, f"the model {body.model!r} does not exist; this server has {model.name!r}",
                       param="model", code="model_not_found")  # fmt: skip
    if body.n != 1:
        raise _unsupported("n", f"n={body.n}: this server returns one choice per request (send n requests)")
    chat = isinstance(body, ChatRequest)
    if chat:
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            prompt = encode(model.tokenizer, messages)
        except Exception as error:  # a template may refuse a conversation (roles out of order)
            raise APIError(400, f"messages: the chat template refused them: {error}", param="messages") from None
        budget = body.max_completion_tokens or body.max_tokens
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
    else:
        if body.echo:
            raise _unsupported("echo", "echo is not supported")
        if body.suffix:
            raise _unsupported("suffix", "suffix is not supported")
        if body.best_of not in (None, 1):
            raise _unsupported("best_of", "best_of > 1 is not supported")
        prompt = _completion_prompt(model, body.prompt)
        budget = body.max_tokens or COMPLETION_MAX_TOKENS
        logprobs = body.logprobs
    room = model.max_seq_len - len(prompt)
    if room < 1:
        raise APIError(400, f"the prompt has {len(prompt)} tokens; the context is {model.max_seq_len} tokens",
                       param="messages" if chat else "prompt", code="context_length_exceeded")  # fmt: skip
    if budget is not None and budget > room:
        raise APIError(400, f"max_tokens={budget} is more than the {room} tokens the context ({model.max_seq_len}) "
                       f"leaves after the prompt's {len(prompt)}", param="max_tokens",
                       code="context_length_exceeded")  # fmt: skip
    stops = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if len(stops) > MAX_STOPS:
        raise APIError(400, f"stop has {len(stops)} strings; at most {MAX_STOPS}", param="stop")
    fmt = body.response_format
    grammar = _grammar(model, fmt, body.guided_regex)
    try:
        params = SamplingParams(
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            top_k=0 if body.top_k in (None, -1) else body.top_k,
            min_p=body.min_p or 0.0,
            seed=body.seed,
            max_new_tokens=budget,
            eos_token_id=None if body.ignore_eos else model.eos_ids,
            ignore_eos=body.ignore_eos,
            repetition_penalty=body.repetition_penalty or 1.0,
            frequency_penalty=body.frequency_penalty,
            presence_penalty=body.presence_penalty,
            min_tokens=body.min_tokens,
            logit_bias=_bias(body.logit_bias),
            logprobs=logprobs,
            grammar=grammar,
        )
        check_features(params, model.config, model.vocab_size)
    except (ValueError, TypeError) as error:
        raise APIError(400, str(error)) from None
    return Prepared(prompt, params, stops, logprobs)


def _completion_prompt(model, prompt) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise _unsupported("prompt", f"{len(prompt)} prompts in one request: send one request per prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = encode(model.tokenizer, prompt)
    else:
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < model.vocab_size]
        if bad:
            raise APIError(400, f"prompt: token ids {bad[:5]} are outside [0, {model.vocab_size})", param="prompt")
    if not ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    return ids
