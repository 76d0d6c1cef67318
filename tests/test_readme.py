"""The README's Use section, run top to bottom as a script, does what its comments say.

The placeholders become the bundled checkpoint folders (the target with its tokenizer, the draft LM
folder as the draft checkpoint), and the step runs eagerly (`backend="eager"`: no compile in CI;
`fdecode.inspect` still traces the graph the compiled backends capture)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fdecode.assets import TINY, TINY_DRAFT
from fdecode.tokenizer import ByteTokenizer

README = Path(__file__).resolve().parents[1] / "README.md"


def use_section() -> str:
    """The first ```python block after the '## Use' heading."""
    text = README.read_text()
    use = text[text.index("\n## Use\n") :]
    return re.search(r"```python\n(.*?)```", use, re.S).group(1)


@pytest.mark.slow
def test_the_readme_use_section_runs_top_to_bottom(capsys) -> None:
    code = use_section()
    for old, new in (
        ('"path/to/Qwen3-checkpoint"', repr(str(TINY))),
        ('"path/to/draft"', repr(str(TINY_DRAFT))),
        ("max_seq_len=2048)", 'max_seq_len=2048, backend="eager")'),
    ):
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    tok = ByteTokenizer()
    prompts = [tok.encode("import os\n"), tok.encode("def f(x):\n"), tok.encode("class A:\n")]
    namespace = {"prompts": prompts, "prompt": prompts[0]}
    exec(compile(code, str(README), "exec"), namespace)
    out, cfg = namespace["out"], namespace["cfg"]
    assert tuple(out.tokens.shape) == (cfg.max_batch, cfg.K + 1)  # [B, K+1], -1 padded
    for row, n in zip(out.tokens.tolist(), out.num_tokens.tolist()):
        assert all(t >= 0 for t in row[:n]) and all(t == -1 for t in row[n:])
    eos = tok.eos_token_id  # the model's EOS id: where a greedy continuation stops, stop id included
    for new in namespace["texts"]:
        assert 0 < len(new) <= 128 and (len(new) == 128 or new[-1] == eos) and eos not in new[:-1]
    assert len(namespace["samples"]) == len(prompts)
    assert all(len(s) <= 64 for s in namespace["samples"])  # the SamplingParams' budget
    printed = capsys.readouterr().out
    assert printed.count("Event(") >= 2 and "finished=True" in printed
    assert torch.is_tensor(namespace["state"].tokens)
