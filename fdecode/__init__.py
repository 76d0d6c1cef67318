"""fdecode: speculative decoding as one pure, compiled function per decode iteration (docs/design.md, "Why").

cfg   = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=8, max_seq_len=2048)
step  = fdecode.compile(target, draft, cfg)   # draft: a model, an MTPHead, "mtp" or "ngram"
state = step.prefill(prompts)
state, out = step(state)                      # validate -> sample -> prepare -> draft
texts = fdecode.generate(step, prompts, max_new_tokens=128)   # stops at the model's EOS ids
texts = fdecode.generate(step, prompts, fdecode.SamplingParams(temperature=0.8, seed=1, max_new_tokens=64))
"""

from fdecode import ops  # registers torch.ops.fdecode.*
from fdecode.config import DecodeConfig
from fdecode.drafts import NgramDraft
from fdecode.generate import Completion, generate
from fdecode.grammar import Grammar
from fdecode.graphs import GraphReport, Step, compile, inspect
from fdecode.graphs.cache import load_compile_cache, save_compile_cache
from fdecode.params import SamplingParams
from fdecode.runtime import Engine, Event
from fdecode.runtime.logprobs import TokenLogprob
from fdecode.state import DecodeState, StepOutput

__all__ = [
    "Completion",
    "DecodeConfig",
    "DecodeState",
    "Engine",
    "Event",
    "Grammar",
    "GraphReport",
    "NgramDraft",
    "SamplingParams",
    "Step",
    "StepOutput",
    "TokenLogprob",
    "compile",
    "generate",
    "inspect",
    "load_compile_cache",
    "ops",
    "save_compile_cache",
]
__version__ = "0.1.0"
