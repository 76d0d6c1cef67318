"""The README's main job: `fdecode demo` streams text and reports a lossless compiled step."""

from __future__ import annotations

import shutil

from fdecode.assets import TINY, TINY_DRAFT
from fdecode.cli import main


def test_demo_on_a_local_checkpoint_with_a_draft_folder(tmp_path, capsys):
    folder = tmp_path / "ckpt"
    shutil.copytree(TINY, folder)  # a user's local folder: config, safetensors, tokenizer files
    prompt = "import os\n"
    args = ["demo", "--model", str(folder), "--draft", str(TINY_DRAFT), "--prompt", prompt, "--max-new-tokens", "16"]
    assert main([*args, "-k", "2", "--backend", "eager"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(prompt)
    assert "mean accepted length" in out and f"draft: {TINY_DRAFT}" in out


def test_demo_refuses_a_checkpoint_without_mtp_head_when_asked_for_mtp(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit, match="no MTP head"):
        main(["demo", "--model", str(TINY_DRAFT), "--backend", "eager"])


def test_local_checkpoint_example_on_the_bundled_model_shows_code_speed_and_acceptance(capsys):
    """examples/local_checkpoint.py: a prompt the bundled model continues with code (not spaces), an
    announced compile, then speed and mean accepted length."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "local_checkpoint.py"
    spec = importlib.util.spec_from_file_location("local_checkpoint", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main([str(TINY), "--max-new-tokens", "40", "--backend", "eager"])
    out = capsys.readouterr().out
    assert "compiling" in out and "tok/s" in out and "mean accepted length" in out
    text = out.split("(summed over windows)\n", 1)[1].split("\n-- ", 1)[0]
    new = text[len(example.DEFAULT_PROMPT):]
    assert text.startswith(example.DEFAULT_PROMPT) and sum(c.isalpha() for c in new) >= 8  # words, not blanks
