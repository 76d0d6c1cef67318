"""`SamplingParams`: how one request is decoded, and how a call's arguments become one per request
(docs/design.md, "Priming").

`prefill`, `generate` and `Engine.add_request` take either `params=` (one `SamplingParams` for the
whole call, or one per prompt) or the keyword shortcuts (temperature, top_k, top_p, min_p, seed: a
number for the whole call or one per prompt; max_new_tokens, eos_token_id, ignore_eos: for the whole
call), never both. `request_params` turns either into one resolved `SamplingParams` per request: a
whole-call seed gives request i `seeds.derived(seed, i)`, an unset one comes from the step's
`SeedSource`; an unset eos_token_id means the model's EOS ids, `[]` or `ignore_eos=True` none; an
unset max_new_tokens means up to `max_seq_len` (the budget itself is per prompt, `check_budgets`).
Filters given to greedy requests (temperature 0), which ignore them, are warned about once per call.
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from fdecode.config import DecodeConfig
from fdecode.grammar.length import longest_output
from fdecode.ops.filters import GREEDY_BELOW
from fdecode.scalars import scalar, token_ids, values
from fdecode.seeds import SEED_BITS, SeedSource, derived

PerPrompt = float | int | Sequence[float] | Sequence[int] | None
SHORTCUTS = ("temperature", "top_k", "top_p", "min_p", "seed")  # a number for the call, or one per prompt
CALL_WIDE = ("max_new_tokens", "eos_token_id", "ignore_eos")  # one value for the whole call
FILTERS = (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0))  # (name, value that means off)
GRAMMAR_API = ("tables", "num_states", "num_transitions", "vocab_size", "eos_ids", "check_capacity")  # a Grammar's

T = TypeVar("T")


def _finite(name: str, value: object) -> float:
    value = scalar(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _int(value: object) -> int | None:
    """`value` as an int if it is an integer (Python, numpy or 0-d torch; not a bool), else None."""
    value = scalar(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def stop_ids(value: object) -> tuple[int, ...] | None:
    """An eos_token_id argument (None, an id, or a list / 1-D tensor of ids) as a tuple of ints (None
    stays None: "the model's"). Ranges are checked against the vocabulary by `request_params`."""
    if value is None:
        return None
    ids = token_ids(value)
    if ids is None:
        raise ValueError(f"eos_token_id must be an id or a list of ids, got {value!r}")
    return tuple(dict.fromkeys(ids))  # an id named twice is one stop id


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded. numpy / torch numbers are accepted and stored as Python values.

    temperature: 0 = greedy (the target's argmax), > 0 samples the filtered distribution. Below 1e-5
        (`GREEDY_BELOW`) the request is greedy and `temperature` reads 0.0, as vLLM treats it.
    top_k: keep the k most probable tokens, 0 = off. top_p: the smallest top set of mass >= top_p, 1 = off.
    min_p: keep tokens with p >= min_p * max p, 0 = off. (The filters apply to random requests only.)
    seed: the request's 63-bit PRNG key; None: drawn from the step's seeds (see the module docstring).
        The guarantee: the same request with the same seed decodes the same tokens on the same step under
        the same speculation schedule. Its random numbers are its own (seed, step counter), never another
        lane's; but which draws land on which position depends on how many drafts each step verified, and
        an adaptive Engine (`DecodeConfig.adaptive_depth`, the default) chooses that depth for the whole
        batch, so alone and in a batch a seeded random lane may diverge (bench/seed_batch.py: 6 of 16
        requests at temperature 0.8). With `adaptive_depth=False` and one attention window
        (`context_buckets=(max_seq_len,)`) it decodes the same tokens alone and beside any requests.
        Under `Engine(overcommit=True)` a lane held short of KV blocks drafts into the scratch slot, which
        changes its drafts and so, likewise, its seeded draws (never its distribution). Greedy requests
        are unaffected.
    eos_token_id: ids that end the request (the stop id is emitted); None: the model's EOS ids.
    ignore_eos: stop on no id (the budget and max_seq_len still end the request).
    max_new_tokens: the request's budget; None: up to max_seq_len.

    Features the step must be compiled for (`DecodeConfig`; refused before anything runs where it is not),
    applied at every verified position and to the drafts, exact under speculation (`fdecode.ops.processors`):
    repetition_penalty: > 0, 1 = off; over the prompt and the generated tokens (transformers / vLLM: a seen
        token's logit is divided by it where positive, multiplied where not). `DecodeConfig.penalties`.
    frequency_penalty, presence_penalty: OpenAI's, over the generated tokens: the logit minus frequency x
        count minus presence x (count > 0); 0 = off. `DecodeConfig.penalties`.
    min_tokens: stop ids are masked until the request has this many new tokens (transformers'
        min_new_tokens). `DecodeConfig.min_tokens`.
    logit_bias: {token id: bias} added to the logits (OpenAI's), at most `DecodeConfig.max_logit_bias` ids.
    logprobs: return each committed token's logprob and the top `logprobs` alternatives (0: the token's
        own only; None: none), at most `DecodeConfig.max_logprobs`; raw or processed by
        `DecodeConfig.logprobs_mode`.
    grammar: a `fdecode.Grammar` (`Grammar.from_regex` / `from_json_schema`): the output is masked to its
        language at every verified position and draft, and may stop only where the language accepts.
        The grammar's EOS ids (`Grammar.eos_ids`) always end its lane, whatever eos_token_id and
        ignore_eos say (as vLLM's structured output does): a lane never decodes past its language.
        `DecodeConfig.max_grammar_states` / `max_grammar_transitions` must hold it.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    eos_token_id: int | Sequence[int] | None = None  # stored as a tuple of ints (or None)
    ignore_eos: bool = False
    max_new_tokens: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_tokens: int = 0
    logit_bias: Mapping[int, float] | None = None  # stored as a tuple of (id, bias) pairs, ascending ids
    logprobs: int | None = None
    grammar: object | None = None  # a `fdecode.Grammar`

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)
        temperature, top_p, min_p = (_finite(n, getattr(self, n)) for n in ("temperature", "top_p", "min_p"))
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        if temperature < GREEDY_BELOW:
            temperature = 0.0
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if not 0 <= min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {min_p}")
        top_k = _int(self.top_k)
        if top_k is None or top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {scalar(self.top_k)!r}")
        seed = None if self.seed is None else _int(self.seed)
        if self.seed is not None and (seed is None or not 0 <= seed < 2**SEED_BITS):
            raise ValueError(f"seed must be an int in [0, 2**{SEED_BITS}), got {scalar(self.seed)!r}")
        budget = None if self.max_new_tokens is None else _int(self.max_new_tokens)
        if self.max_new_tokens is not None and (budget is None or budget < 1):
            raise ValueError(f"max_new_tokens must be a positive int, got {scalar(self.max_new_tokens)!r}")
        ignore = scalar(self.ignore_eos)
        if not isinstance(ignore, bool):
            raise ValueError(f"ignore_eos must be a bool, got {ignore!r}")
        eos = stop_ids(self.eos_token_id)
        if ignore and eos is not None:
            raise ValueError(f"ignore_eos=True and eos_token_id={list(eos)} contradict each other: pass one")
        for name, value in (
            ("temperature", temperature),
            ("top_k", top_k),
            ("top_p", top_p),
            ("min_p", min_p),
            ("seed", seed),
            ("eos_token_id", eos),
            ("ignore_eos", ignore),
            ("max_new_tokens", budget),
        ):
            put(name, value)
        rep, freq, pres = (
            _finite(n, getattr(self, n)) for n in ("repetition_penalty", "frequency_penalty", "presence_penalty")
        )
        if rep <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {rep}")
        least = _int(self.min_tokens)
        if least is None or least < 0:
            raise ValueError(f"min_tokens must be an int >= 0, got {scalar(self.min_tokens)!r}")
        if budget is not None and least > budget:
            raise ValueError(f"min_tokens ({least}) is more than max_new_tokens ({budget})")
        top = None if self.logprobs is None else _int(self.logprobs)
        if self.logprobs is not None and (top is None or top < 0):
            raise ValueError(f"logprobs must be an int >= 0 or None, got {scalar(self.logprobs)!r}")
        for name, value in (
            ("repetition_penalty", rep),
            ("frequency_penalty", freq),
            ("presence_penalty", pres),
            ("min_tokens", least),
            ("logit_bias", _bias(self.logit_bias)),
            ("logprobs", top),
        ):
            put(name, value)
        if self.grammar is not None and not all(hasattr(self.grammar, a) for a in GRAMMAR_API):
            raise TypeError(
                f"grammar must be a fdecode.Grammar (fdecode.Grammar.from_regex(pattern, tokenizer) or "
                f"from_json_schema(schema, tokenizer)), got {type(self.grammar).__name__} {self.grammar!r:.60}"
            )

    @property
    def penalized(self) -> bool:
        """Whether the request uses a repetition, frequency or presence penalty."""
        return (self.repetition_penalty, self.frequency_penalty, self.presence_penalty) != (1.0, 0.0, 0.0)

    @property
    def processed(self) -> bool:
        """Whether the request uses a logit processor: a penalty, min_tokens or a logit bias."""
        return self.penalized or self.min_tokens > 0 or bool(self.logit_bias)

    @property
    def plan_inputs(self) -> tuple[float, int, float, bool]:
        """(temperature, top_k, top_p, processed): what the step's sampling plan depends on
        (`fdecode.ops.plan.plan_for`)."""
        return self.temperature, self.top_k, self.top_p, self.processed

    def replace(self, **changes: object) -> SamplingParams:
        return dataclasses.replace(self, **changes)


def _bias(value: object) -> tuple[tuple[int, float], ...] | None:
    """A logit_bias argument ({id: bias}, or pairs) as ascending (id, bias) pairs; None or {} stays None."""
    if value is None:
        return None
    try:
        pairs = value.items() if isinstance(value, Mapping) else list(value)
        pairs = [(_int(t), _finite("logit_bias value", b)) for t, b in pairs]
    except (TypeError, ValueError) as error:
        raise ValueError(f"logit_bias must map token ids to finite numbers, got {value!r} ({error})") from None
    if any(t is None or t < 0 for t, _ in pairs):
        raise ValueError(f"logit_bias keys must be token ids (ints >= 0), got {value!r}")
    if len({t for t, _ in pairs}) != len(pairs):
        raise ValueError(f"logit_bias names an id twice: {value!r}")
    return tuple(sorted(pairs)) or None


def _labelled(label: str | None, build: Callable[[], T]) -> T:
    """`build()`, its ValueError / TypeError prefixed with `label` (once) where the value is per prompt."""
    if label is None:
        return build()
    try:
        return build()
    except (ValueError, TypeError) as error:
        raise type(error)(f"{label}: {error}") from None


def _split(name: str, value: object, count: int, per_prompt: bool) -> tuple[object, list | None]:
    """A shortcut's value as (whole-call value, None) or (None, one value per prompt)."""
    number = scalar(value)
    if isinstance(number, (int, float)) and not isinstance(number, bool):
        return number, None
    many = values(value) if per_prompt else None
    if many is None:
        kinds = "a number or one per prompt" if per_prompt else "a number"
        raise TypeError(f"{name} must be {kinds}, got {type(value).__name__}")
    if len(many) != count:
        raise ValueError(f"{name} has {len(many)} values for {count} prompts")
    return None, many


def _requests(
    count: int, params: object, given: dict[str, object], per_prompt: bool
) -> tuple[SamplingParams | None, list[SamplingParams | Callable[[], SamplingParams]]]:
    """(whole, requests). `whole`: what every request shares, checked here, named without a prompt label
    (None where params gives one per prompt). `requests`: one per request, a SamplingParams or, where
    per-prompt keyword values are still to be checked, a function building it (so that its error can
    be labelled with the prompt)."""
    if params is not None:
        if given:
            raise TypeError(
                f"pass sampling settings either as params= or as keywords, not both (got params and {', '.join(given)})"
            )
        if isinstance(params, SamplingParams):
            return params, [
                params.replace(seed=None if params.seed is None else derived(params.seed, i)) for i in range(count)
            ]
        many = values(params) if per_prompt else None
        if many is None or not all(isinstance(p, SamplingParams) for p in many):
            kinds = "a SamplingParams or one per prompt" if per_prompt else "a SamplingParams"
            raise TypeError(f"params must be {kinds}, got {type(params).__name__}")
        if len(many) != count:
            raise ValueError(f"params has {len(many)} values for {count} prompts")
        return None, many
    call = {name: value for name, value in given.items() if name in CALL_WIDE}
    lanes: dict[str, list] = {}
    for name in SHORTCUTS:
        if name in given:
            call[name], many = _split(name, given[name], count, per_prompt)
            if many is None:
                continue
            del call[name]
            lanes[name] = many
    whole = SamplingParams(**call)  # whole-call values: checked once, named without a prompt label
    seed = whole.seed

    def request(i: int) -> Callable[[], SamplingParams]:
        own = {name: many[i] for name, many in lanes.items() if many[i] is not None}
        if seed is not None:
            own["seed"] = derived(seed, i)
        return lambda: SamplingParams(**{**call, **own})

    return whole, [request(i) for i in range(count)]


def check_features(p: SamplingParams, cfg: DecodeConfig, vocab: int) -> None:
    """Refuse a request asking for a feature the step was not compiled for, or more than it has room for."""
    if p.penalized and not cfg.penalties:
        raise ValueError(
            "repetition / frequency / presence penalties need a step compiled with DecodeConfig(penalties=True)"
        )
    if p.min_tokens and not cfg.min_tokens:
        raise ValueError("min_tokens needs a step compiled with DecodeConfig(min_tokens=True)")
    if p.logit_bias is not None:
        if len(p.logit_bias) > cfg.max_logit_bias:
            raise ValueError(
                f"logit_bias has {len(p.logit_bias)} ids but DecodeConfig.max_logit_bias is {cfg.max_logit_bias}"
            )
        for t, _ in p.logit_bias:
            if t >= vocab:
                raise ValueError(f"logit_bias id {t} is not an id in [0, {vocab})")
    if p.grammar is not None:
        if not cfg.grammars:
            raise ValueError(
                "grammar needs a step compiled with DecodeConfig(max_grammar_states=..., max_grammar_transitions=...)"
            )
        if p.grammar.vocab_size != vocab:
            raise ValueError(
                f"the grammar was built for {p.grammar.vocab_size} token ids but the model has {vocab}: "
                f"pass vocab_size={vocab} to Grammar.from_regex / from_json_schema"
            )
        p.grammar.check_capacity(cfg.max_grammar_states, cfg.max_grammar_transitions)
        longest = longest_output(p.grammar) if p.min_tokens else None
        if longest is not None and longest < p.min_tokens:
            raise ValueError(
                f"min_tokens={p.min_tokens} can never be met: the grammar's longest output is {longest} tokens "
                "before its EOS, which min_tokens masks, so a row would allow no token"
            )
    if p.logprobs is not None and (cfg.max_logprobs is None or p.logprobs > cfg.max_logprobs):
        have = "computes no logprobs" if cfg.max_logprobs is None else f"has max_logprobs={cfg.max_logprobs}"
        raise ValueError(f"logprobs={p.logprobs} needs DecodeConfig(max_logprobs >= {p.logprobs}); the step {have}")


def _stops(p: SamplingParams, cfg: DecodeConfig, vocab: int) -> tuple[int, ...]:
    """The ids the request's lane stops on: its eos_token_id (none with ignore_eos; the model's where unset),
    and always its grammar's EOS ids (a lane that went on past one would leave the language)."""
    ids = () if p.ignore_eos else p.eos_token_id
    if ids is None:  # the model's ("auto" where no compile resolved it: none known)
        ids = cfg.eos_token_id if isinstance(cfg.eos_token_id, tuple) else ()
    grammar = () if p.grammar is None else tuple(p.grammar.eos_ids)
    ids = tuple(dict.fromkeys((*ids, *grammar)))
    if len(ids) > cfg.max_stop_ids:
        with_grammar = f" (with the grammar's EOS ids {list(grammar)})" if grammar else ""
        raise ValueError(f"{len(ids)} eos ids{with_grammar} but DecodeConfig.max_stop_ids is {cfg.max_stop_ids}")
    for t in ids:
        if not 0 <= t < vocab:
            raise ValueError(f"eos token id {t!r} is not an id in [0, {vocab})")
    return ids


def request_params(
    count: int,
    cfg: DecodeConfig,
    vocab: int,
    *,
    params: SamplingParams | Sequence[SamplingParams] | None = None,
    seeds: SeedSource | None = None,
    labels: Sequence[str | None] | None = None,
    per_prompt: bool = True,
    **given: object,
) -> list[SamplingParams]:
    """One resolved `SamplingParams` per request (seed an int, eos_token_id the tuple of ids the
    request stops on, ignore_eos False), from `params` or the keyword shortcuts `given` (None, and
    ignore_eos=False, mean not given). See the module docstring for the rules. labels: the requests'
    names in messages (default "prompt 0", ...; None: unnamed); per_prompt=False refuses one-value-per-prompt lists
    (a single request)."""
    labels = [f"prompt {i}" for i in range(count)] if labels is None else labels
    given = {k: v for k, v in given.items() if v is not None and not (k == "ignore_eos" and v is False)}
    unknown = set(given) - set(SHORTCUTS) - set(CALL_WIDE)
    if unknown:
        raise TypeError(f"unexpected sampling arguments {sorted(unknown)}")
    whole, requests = _requests(count, params, given, per_prompt)
    if whole is not None:
        _stops(whole, cfg, vocab)  # a whole-call stop id is named without a prompt label
    draw = seeds.draw if seeds is not None else lambda: secrets.randbits(SEED_BITS)
    resolved = []
    for label, request in zip(labels, requests, strict=True):

        def resolve(request=request) -> SamplingParams:
            p = request() if callable(request) else request
            check_features(p, cfg, vocab)
            return p.replace(
                eos_token_id=_stops(p, cfg, vocab), ignore_eos=False, seed=draw() if p.seed is None else p.seed
            )

        resolved.append(_labelled(label, resolve))
    if not cfg.sampling and any(p.temperature > 0 for p in resolved):
        raise ValueError("temperature > 0 needs a step compiled with DecodeConfig(sampling=True)")
    _warn_ignored_filters(resolved)
    return resolved


def _warn_ignored_filters(requests: list[SamplingParams]) -> None:
    """One warning per call where a greedy request was given filters it ignores."""
    names = [name for name, off in FILTERS if any(p.temperature == 0 and getattr(p, name) != off for p in requests)]
    if names:
        warnings.warn(
            f"{', '.join(names)} {'has' if len(names) == 1 else 'have'} no effect at temperature 0 (greedy decoding "
            "commits the target's argmax): pass temperature > 0 to sample",
            UserWarning,
            stacklevel=_user_stacklevel(),
        )


def _user_stacklevel() -> int:
    """The stacklevel of the first caller outside the fdecode package, so a warning names the user's line."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level
