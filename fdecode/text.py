"""Text in, text out: prompts given as strings or chat messages, through a tokenizer (docs/serving.md).

`generate`, the `Engine` and the server take a prompt as token ids (as always), a string, or a list of
chat messages (`[{"role": "user", "content": "..."}]`). Strings and messages need a tokenizer: the one
passed, else the one saved in the checkpoint folder the step's target was loaded from
(`find_tokenizer`). Messages go through the tokenizer's chat template, with the assistant's turn opened;
a tokenizer without one (the bundled byte-level model's) gets `PLAIN_TEMPLATE`: one `role: content`
line per message, then `assistant: `. Nothing here imports transformers until a folder's tokenizer is
loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fdecode.tokenizer import load_tokenizer

PLAIN_TEMPLATE = "{role}: {content}\n"  # per message, where the tokenizer has no chat template
PLAIN_GENERATION_PROMPT = "assistant: "


def is_messages(prompt: object) -> bool:
    """Whether `prompt` is a chat: a non-empty list of {"role", "content"} mappings."""
    return (
        isinstance(prompt, (list, tuple))
        and len(prompt) > 0
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt)
    )


def is_text(prompt: object) -> bool:
    """Whether `prompt` needs a tokenizer: a string or a chat."""
    return isinstance(prompt, str) or is_messages(prompt)


def find_tokenizer(step, tokenizer=None):
    """`tokenizer`, else the one saved beside the step's target checkpoint; raises ValueError saying how to
    pass one where there is none."""
    if tokenizer is not None:
        return tokenizer
    folder = getattr(step.target, "checkpoint", None)
    if folder is None:
        raise ValueError(
            "text prompts need a tokenizer: pass tokenizer= (a transformers tokenizer), or compile a target "
            "loaded from a checkpoint folder that holds one"
        )
    return load_tokenizer(folder)


def chat_text(tokenizer, messages: Sequence[Mapping]) -> str:
    """The prompt text of a chat, as the tokenizer's template (or `PLAIN_TEMPLATE`) writes it."""
    for i, m in enumerate(messages):
        if not isinstance(m.get("content"), str):
            raise ValueError(f"message {i}: content must be a string, got {type(m.get('content')).__name__}")
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=False)
    return "".join(PLAIN_TEMPLATE.format(role=m["role"], content=m["content"]) for m in messages) + (
        PLAIN_GENERATION_PROMPT
    )


def encode(tokenizer, prompt: str | Sequence[Mapping]) -> list[int]:
    """A string or a chat as the token ids the model reads (the tokenizer's special tokens added once)."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    if not is_messages(prompt):
        raise TypeError(f"expected a string or chat messages, got {type(prompt).__name__}")
    text = chat_text(tokenizer, prompt)
    if getattr(tokenizer, "chat_template", None):  # the template wrote the special tokens it wants
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])


def eos_ids(tokenizer) -> tuple[int, ...]:
    """The tokenizer's EOS id(s), as a tuple (empty where it names none)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(i) for i in eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def stop_ids(step, tokenizer) -> list[int] | None:
    """The ids a text request stops on by default: the model's (`DecodeConfig.eos_token_id`) and the
    tokenizer's (a chat model's end-of-turn token); None where neither names one."""
    own = step.config.eos_token_id if isinstance(step.config.eos_token_id, tuple) else ()
    return list(dict.fromkeys((*own, *eos_ids(tokenizer)))) or None
