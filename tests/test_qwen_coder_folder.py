"""`fdecode.assets.qwen_coder` finds the real pair where FDECODE_QWEN_CODER says, in either published form
(Hugging Face folders or GGUF files), and says how to get what is missing. Files only: nothing is loaded."""

from __future__ import annotations

import pytest

from fdecode.assets import qwen_coder


@pytest.fixture
def pair_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(qwen_coder.ENV, str(tmp_path))
    return tmp_path


def hf_folder(path):
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "tokenizer.json").write_text("{}")
    return path


def test_an_empty_folder_names_the_download_commands(pair_dir) -> None:
    reason = qwen_coder.missing_reason()
    assert str(pair_dir) in reason and "Qwen2.5-Coder-1.5B-Instruct" in reason
    assert "huggingface-cli download Qwen/Qwen2.5-Coder-1.5B-Instruct" in reason
    with pytest.raises(FileNotFoundError, match="huggingface-cli download"):
        qwen_coder.safetensors_folders()
    assert qwen_coder.tokenizer_folder() is None


def test_the_hugging_face_downloads_are_used_as_they_are(pair_dir) -> None:
    target = hf_folder(pair_dir / "Qwen2.5-Coder-1.5B-Instruct")
    assert "0.5B" in qwen_coder.missing_reason()  # the draft is still missing
    draft = hf_folder(pair_dir / "Qwen2.5-Coder-0.5B-Instruct")
    assert qwen_coder.missing_reason() is None
    assert qwen_coder.safetensors_folders() == (target, draft)
    assert qwen_coder.tokenizer_folder() == draft


def test_gguf_files_count_and_a_converted_folder_is_preferred(pair_dir) -> None:
    (pair_dir / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf").write_bytes(b"")
    (pair_dir / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf").write_bytes(b"")
    assert qwen_coder.missing_reason() is None
    assert qwen_coder.tokenizer_folder() is None  # a GGUF file is not converted just to read its tokenizer
    converted = hf_folder(pair_dir / "qwen2.5-coder-0.5b-instruct-q4_k_m")
    assert qwen_coder.tokenizer_folder() == converted
