"""`ServedModel`: the step a server runs, its tokenizer and names; `load` builds one from a folder.

`load(folder, draft=...)` reads a local Hugging Face checkpoint folder (weights, config, tokenizer with its
chat template; None: the bundled model, `fdecode.assets.TINY`) and compiles it with every per-request
feature a server needs switched on (`server_config`): logprobs (up to OpenAI's 20 alternatives), the
penalties, min_tokens, logit_bias, and a grammar pool for response_format and guided_regex. The draft is
the target's MTP head where it has one, else n-gram prompt lookup, or a draft checkpoint folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import fdecode
from fdecode.models.loading.pair import load_pair
from fdecode.text import stop_ids
from fdecode.tokenizer import load_tokenizer


@dataclass(frozen=True)
class ServedModel:
    step: object  # a compiled fdecode `Step`
    tokenizer: object  # a transformers tokenizer, or fdecode's byte tokenizer
    name: str  # what /v1/models lists and requests name
    aliases: tuple[str, ...] = ()  # other names requests may use (the folder's path)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def config(self):
        return self.step.config

    @property
    def vocab_size(self) -> int:
        return self.step.target.config.vocab_size

    @property
    def max_seq_len(self) -> int:
        return self.step.config.max_seq_len

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return tuple(stop_ids(self.step, self.tokenizer) or ())

    def __repr__(self) -> str:
        return f"ServedModel({self.name!r}, {self.step!r})"


def server_config(
    *,
    num_draft_tokens: int = 3,
    max_batch: int = 8,
    max_seq_len: int = 2048,
    backend: str = "auto",
    max_logprobs: int = 20,
    max_logit_bias: int = 64,
    max_grammar_states: int = 4096,
    max_grammar_transitions: int = 1 << 20,
    **more,
) -> fdecode.DecodeConfig:
    """A DecodeConfig with every feature a request can ask for switched on."""
    return fdecode.DecodeConfig(
        num_draft_tokens=num_draft_tokens,
        max_batch=max_batch,
        max_seq_len=max_seq_len,
        backend=backend,
        penalties=True,
        min_tokens=True,
        max_logit_bias=max_logit_bias,
        max_logprobs=max_logprobs,
        max_stop_ids=8,
        max_grammar_states=max_grammar_states,
        max_grammar_transitions=max_grammar_transitions,
        **more,
    )


def load(
    folder: str | Path | None = None, draft: str | None = None, *, name: str | None = None, **config
) -> ServedModel:
    """Compile a checkpoint folder (None: the bundled model) with `server_config(**config)`, which refuses a
    config that cannot be (a tree's shape, say) before any weight loads.
    draft: None (its MTP head, else n-gram prompt lookup), "mtp", "ngram" or a draft checkpoint folder."""
    cfg = server_config(**config)
    target, draft, path = load_pair(folder, draft)
    step = fdecode.compile(target, draft, cfg)
    served = name or ("fdecode-tiny" if folder is None else path.name)
    return ServedModel(step, load_tokenizer(path), served, aliases=(str(path),))
