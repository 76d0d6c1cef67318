"""The README's main job: `fdecode demo` runs end to end and reports a lossless compiled step."""

from __future__ import annotations

from fdecode.cli import main


def test_demo_random_model(capsys):
    assert main(["demo", "--batch", "1", "--max-new-tokens", "12", "-k", "2", "--backend", "aot_eager"]) == 0
    out = capsys.readouterr().out
    assert "mean accepted length" in out
    assert "1 graph, 0 breaks, 1 fused prepare op, host syncs: none" in out


def test_demo_local_checkpoint_with_mtp(tmp_path, capsys):
    from conftest import fdecode_target, mtp_head
    from fdecode.models import save_hf

    target = fdecode_target(2)
    target.mtp = mtp_head("partial", target)
    save_hf(target, tmp_path / "ckpt")
    assert main(["demo", "--model", str(tmp_path / "ckpt"), "--max-new-tokens", "6", "--backend", "eager"]) == 0
    assert "draft: mtp" in capsys.readouterr().out
