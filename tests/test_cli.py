"""The README's main job: `fdecode demo` streams text and reports a lossless compiled step."""

from __future__ import annotations

import shutil

import torch

from fdecode.assets import TINY, TINY_DRAFT
from fdecode.cli import main


def local_checkpoint_example():
    """examples/local_checkpoint.py as a module (the examples folder is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "local_checkpoint.py"
    spec = importlib.util.spec_from_file_location("local_checkpoint", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


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

    with pytest.raises(SystemExit, match="no MTP head; pass --draft ngram"):
        main(["demo", "--model", str(TINY_DRAFT), "--backend", "eager"])


def test_demo_and_the_example_run_a_model_without_mtp_head_with_ngram_drafts(capsys):
    """A user's model with no MTP head (the bundled draft LM stands for one): `--draft ngram` in the demo,
    and n-gram drafts by default in examples/local_checkpoint.py; the demo checks the step's tokens against
    target-only decoding itself (it returns 1 where they differ)."""
    assert (
        main(["demo", "--model", str(TINY_DRAFT), "--draft", "ngram", "--max-new-tokens", "24", "--backend", "eager"])
        == 0
    )
    assert "draft: n-gram prompt lookup" in capsys.readouterr().out
    local_checkpoint_example().main(
        [str(TINY_DRAFT), "--draft", "ngram", "--max-new-tokens", "24", "--backend", "eager"]
    )
    out = capsys.readouterr().out
    assert "draft=ngram" in out and "tok/s" in out


def test_the_example_asked_for_an_mtp_head_the_model_lacks_names_the_ngram_draft():
    """Without --draft the example picks n-gram drafts for such a model; asked for `mtp`, compile's error
    names `draft='ngram'` as the way out."""
    import pytest

    with pytest.raises(ValueError, match="no MTP head.*draft='ngram'"):
        local_checkpoint_example().main([str(TINY_DRAFT), "--draft", "mtp", "--backend", "eager"])


def test_local_checkpoint_example_on_the_bundled_model_shows_code_speed_and_acceptance(capsys):
    """examples/local_checkpoint.py: a prompt the bundled model continues with code (not spaces), an
    announced compile, then speed and mean accepted length."""
    example = local_checkpoint_example()
    example.main([str(TINY), "--max-new-tokens", "40", "--backend", "eager"])
    out = capsys.readouterr().out
    assert "compiling" in out and "tok/s" in out and "mean accepted length" in out
    text = out.split("(summed over windows)\n", 1)[1].split("\n-- ", 1)[0]
    new = text[len(example.DEFAULT_PROMPT) :]
    assert text.startswith(example.DEFAULT_PROMPT) and sum(c.isalpha() for c in new) >= 8  # words, not blanks


def test_demo_shows_target_only_the_decode_steps_mean_and_whole_lines(capsys):
    """The summary has target-only beside the before loop and the step, the mean accepted length over the
    decode steps that ran (not the engine's launches, one more), and the compile time summed over windows;
    the streamed text stops at its last line end."""
    import fdecode
    from fdecode.cli import DEFAULT_PROMPT
    from fdecode.models import from_hf
    from fdecode.tokenizer import load_tokenizer

    assert main(["demo", "--max-new-tokens", "40", "-k", "3", "--backend", "eager"]) == 0
    captured = capsys.readouterr()
    streamed, summary = captured.out.split("\n-- ", 1)
    assert "threads: 1 torch thread (one thread: on a busy machine" in captured.err  # chosen, and said why
    assert "target-only" in summary and "before loop" in summary and "summed over 1 attention window" in summary
    assert "median (min-max) of 9 interleaved rounds" in summary  # the spread shown, the verdict paired:
    assert "x target-only" in summary and "medians of the rounds' ratios" in summary

    tokenizer = load_tokenizer(TINY)
    prompt = tokenizer(DEFAULT_PROMPT)["input_ids"]
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=1, max_seq_len=len(prompt) + 48, backend="eager")
    step = fdecode.compile(from_hf(TINY, dtype=torch.float32), "mtp", cfg)
    state = step.prefill([prompt], max_new_tokens=40, eos_token_id=tokenizer.eos_token_id)
    tokens, steps = state.step_output.tokens[0, :1].tolist(), 0
    while not bool(state.step_output.finished[0]):
        state, out = step(state)
        tokens += out.tokens[0, : int(out.num_tokens[0])].tolist()
        steps += 1
    assert f"mean accepted length: {(len(tokens) - 1) / steps:.2f} tokens per step" in summary
    text = tokenizer.decode(tokens)
    assert streamed == DEFAULT_PROMPT + text[: text.rfind("\n") + 1]


def test_demo_help_shows_the_defaults(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for default in ("default: 3)", "default: 200)", "default: mtp)", "default: auto", "default: the bundled model)"):
        assert default in out
