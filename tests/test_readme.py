"""The README's example and the user guide's code blocks, run as written, do what their comments say.

The README's example: its checkpoint folders become the bundled model's (the target with its tokenizer,
the draft LM folder as the draft), and the step runs eagerly (`backend="eager"`: no compile in CI). The
guide: every ```python block, in order, in one namespace that holds the bundled `target` and `draft` and
three byte-token `prompts`, with `FDECODE_BACKEND=eager` so its steps compile nothing; its ```py blocks
need hardware, processes or packages CI lacks, and each says which in its first line."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch

from fdecode import DecodeConfig
from fdecode.assets import TINY, TINY_DRAFT
from fdecode.models import from_hf
from fdecode.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide.md"


def blocks(path: Path, fence: str) -> list[str]:
    return re.findall(rf"^```{fence}\n(.*?)^```", path.read_text(), re.S | re.M)


def example() -> str:
    """The README's one python block: the example."""
    (code,) = blocks(README, "python")
    return code


def test_the_readme_fits_a_first_screen() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200
    assert "ruff check && ruff format --check && python -m pytest" in README.read_text()
    assert len(example().splitlines()) <= 16


@pytest.mark.slow
def test_the_readme_example_runs() -> None:
    code = example()
    for old, new in (
        ('"models/Qwen2.5-Coder-1.5B-Instruct"', repr(str(TINY))),
        ('"models/Qwen2.5-Coder-0.5B-Instruct"', repr(str(TINY_DRAFT))),
        ("max_seq_len=1024)", 'max_seq_len=1024, backend="eager")'),
    ):
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    tok, prompts, outs = namespace["tok"], namespace["prompts"], namespace["outs"]
    for new in outs:  # greedy, stopped at the model's EOS or the budget, stop id included
        assert 0 < len(new) <= 96 and (len(new) == 96 or new[-1] == tok.eos_token_id)
    assert len(namespace["samples"]) == len(prompts) and all(len(s) <= 96 for s in namespace["samples"])


def test_every_guide_block_not_run_says_why() -> None:
    skipped = blocks(GUIDE, "py")
    assert len(skipped) <= 4
    for code in skipped:
        assert code.startswith("# "), code


def test_the_guide_groups_decode_configs_fields_as_its_docstring_does() -> None:
    """The guide's table of `DecodeConfig`'s fields by concern holds the docstring's groups, in its order, and
    together they name every field (a group's label may run over two lines, its fields over several)."""
    lines = [line for line in inspect.cleandoc(DecodeConfig.__doc__).split("\n\n", 1)[1].splitlines() if line]
    width = lines[0].index("num_draft_tokens")
    documented: list[tuple[str, list[str]]] = []
    for line in lines:
        label, fields = line[:width].strip(), re.findall(r"\b[a-z][a-z_]+\b", line[width:])
        if documented and (not label or documented[-1][0].endswith(" and")):
            label = f"{documented[-1][0]} {label}".strip()
            documented[-1] = (label, documented[-1][1] + fields)
        else:
            documented.append((label, fields))
    section = GUIDE.read_text().split("**`DecodeConfig`'s fields by concern**", 1)[1].split("\n\n")[1]
    rows = re.findall(r"^\| ([^|`]+?) \| (`.*`[^|]*) \|$", section, re.M)
    assert [(label, re.findall(r"`([a-z_]+)`", fields)) for label, fields in rows] == documented
    declared = {f.name for f in dataclasses.fields(DecodeConfig) if not f.name.startswith("_")}
    assert sorted(name for _, fields in documented for name in fields) == sorted(declared)


@pytest.mark.slow
def test_the_guide_blocks_run_top_to_bottom(monkeypatch) -> None:
    monkeypatch.setenv("FDECODE_BACKEND", "eager")
    tok = ByteTokenizer()
    prompts = [tok.encode("import os\n"), tok.encode("def f(x):\n"), tok.encode("class A:\n")]
    namespace = {
        "target": from_hf(TINY),
        "draft": from_hf(TINY_DRAFT),
        "prompts": prompts,
        "prompt": prompts[0],
    }
    code = "\n".join(blocks(GUIDE, "python"))
    exec(compile(code, str(GUIDE), "exec"), namespace)
    step, lookup, out = namespace["step"], namespace["lookup"], namespace["out"]
    assert step.backend == lookup.backend == "eager"
    assert tuple(out.tokens.shape) == (lookup.config.max_batch, lookup.config.K + 1)  # [B, K+1], -1 padded
    assert all(0 < len(new) <= 32 for new in namespace["texts"])
    assert namespace["engine"].metrics.totals.drafts_proposed > 0  # the Engine's steps drafted
    assert torch.is_tensor(namespace["state"].tokens)
