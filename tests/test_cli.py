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
