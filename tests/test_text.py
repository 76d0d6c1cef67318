"""Text in, text out: the incremental detokenizer, stop strings, and strings / chats in generate and the Engine."""

from __future__ import annotations

import functools

import pytest
import torch
from support.tokenizers import byte_bpe, sentencepiece

import fdecode
from fdecode.assets import TINY
from fdecode.detokenize import Detokenizer
from fdecode.models import from_hf
from fdecode.text import PLAIN_GENERATION_PROMPT, chat_text, encode
from fdecode.tokenizer import ByteTokenizer

TEXT = "Grüße, 日本語 naïve café — ok 🙂 ab abc 12.2 true"


def pieces(tokenizer, ids: list[int], chunk: int) -> list[str]:
    detok = Detokenizer(tokenizer)
    out = [detok.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return out + [detok.flush()]


@pytest.mark.parametrize("which", ["byte", "byte-bpe", "sentencepiece"])
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_pieces_are_whole_characters_and_join_to_the_tokenizers_decode(which, chunk):
    """Against each tokenizer's own decode of the whole sequence (transformers' for two of them): the
    streamed pieces concatenate to it, and no piece holds a broken character."""
    tokenizer = {"byte": ByteTokenizer, "byte-bpe": byte_bpe, "sentencepiece": sentencepiece}[which]()
    ids = list(tokenizer.encode(TEXT, add_bos=False)) if which == "byte" else tokenizer(TEXT)["input_ids"]
    assert any(len(ch.encode()) > 1 for ch in TEXT)
    out = pieces(tokenizer, ids, chunk)
    assert "".join(out) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in p for p in out)


def test_a_character_cut_by_the_end_is_flushed_as_a_replacement():
    tokenizer = ByteTokenizer()
    detok = Detokenizer(tokenizer)
    assert detok.push(list("aé".encode())[:2]) == ""  # 'a' and the first byte of 'é': held back together
    assert detok.flush() == "a\ufffd"


def test_chat_without_a_template_uses_the_plain_one_and_with_one_the_tokenizers():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    plain = chat_text(ByteTokenizer(), messages)
    assert plain == f"system: be brief\nuser: hi\n{PLAIN_GENERATION_PROMPT}"
    tok = byte_bpe()
    tok.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    try:
        assert chat_text(tok, messages) == "<system>be brief<user>hi<assistant>"
        assert (
            encode(tok, messages) == tok("<system>be brief<user>hi<assistant>", add_special_tokens=False)["input_ids"]
        )
    finally:
        tok.chat_template = None


@functools.cache
def tiny_step():
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=2, max_seq_len=96, backend="eager")
    return fdecode.compile(from_hf(TINY, dtype=torch.float32), "mtp", cfg)


def test_generate_takes_strings_and_chats_and_gives_text():
    """A text prompt's result is the text of the tokens an id prompt gets; ids still give ids."""
    step, tok = tiny_step(), ByteTokenizer()
    chat = [{"role": "user", "content": "def f(x):"}]
    texts = fdecode.generate(step, ["import os\n", chat], max_new_tokens=10)  # tokenizer found beside the weights
    ids = [encode(tok, "import os\n"), encode(tok, chat)]
    tokens = fdecode.generate(step, ids, max_new_tokens=10, eos_token_id=tok.eos_token_id)
    assert texts == [tok.decode(t) for t in tokens]
    assert all(isinstance(t, int) for t in tokens[0])
    with pytest.raises(TypeError, match="list of prompts"):
        fdecode.generate(step, "import os\n")


def test_engine_events_carry_text_for_text_prompts_only():
    step, tok = tiny_step(), ByteTokenizer()
    engine = fdecode.Engine(step, tokenizer=tok)
    text_id = engine.add_request("class A:\n", max_new_tokens=9)
    ids_id = engine.add_request(encode(tok, "class A:\n"), max_new_tokens=9)
    got: dict[int, list] = {text_id: [], ids_id: []}
    texts = []
    for event in engine.stream():
        got[event.request_id] += event.new_tokens
        if event.request_id == text_id:
            texts.append(event.text)
        else:
            assert event.text is None
    assert got[text_id] == got[ids_id]
    assert "".join(texts) == tok.decode(got[text_id])


def test_generate_command_streams_the_text_generate_returns(capsys):
    from fdecode.generate_cli import main

    assert main(["--backend", "eager", "--max-new-tokens", "8", "--max-seq-len", "96", "import os\n"]) == 0
    out = capsys.readouterr()
    want = fdecode.generate(tiny_step(), ["import os\n"], max_new_tokens=8)[0]
    assert out.out == "import os\n" + want + "\n"
    assert "8 tokens" in out.err and "mtp" in out.err


def test_generate_command_drafts_trees_and_refuses_one_that_cannot_be(capsys, monkeypatch):
    """`fdecode generate -k 4 --draft-topk 2 --draft-depth 2 --no-adaptive-depth`: the bundled model's MTP head
    drafts a tree of 4 nodes over 2 levels at every step, and the greedy text is the chain's; a tree its levels
    cannot hold is refused before any weight is read, one the model cannot run (more children than its
    vocabulary) before anything compiles."""
    from fdecode import generate_cli

    made, compile_step = [], fdecode.compile
    monkeypatch.setattr(fdecode, "compile", lambda *a, **kw: made.append(compile_step(*a, **kw)) or made[-1])
    args = ["--backend", "eager", "--max-new-tokens", "8", "--max-seq-len", "96", "-k", "4", "import os\n"]
    assert generate_cli.main(["--draft-topk", "2", "--draft-depth", "2", "--no-adaptive-depth", *args]) == 0
    out = capsys.readouterr()
    assert made[0].config.tree and (made[0].config.K, made[0].config.levels) == (4, 2)
    assert not made[0].config.adaptive_depth
    want = fdecode.generate(tiny_step(), ["import os\n"], max_new_tokens=8)[0]
    assert out.out == "import os\n" + want + "\n"
    assert "8 tokens" in out.err
    assert generate_cli.main(["--draft-topk", "300", "--draft-depth", "2", *args]) == 2
    assert "draft_topk=300 exceeds the vocabulary" in capsys.readouterr().err
    monkeypatch.setattr(generate_cli, "load_pair", lambda *a: pytest.fail("loaded weights for a config it refuses"))
    assert generate_cli.main(["--draft-topk", "2", "--draft-depth", "5", *args]) == 2
    assert "draft_depth=5 needs at least one node a level" in capsys.readouterr().err
    assert generate_cli.main(["--draft-topk", "2", *args]) == 2  # 4 levels of 4 nodes: the chain alone
    assert "needs draft_depth < num_draft_tokens" in capsys.readouterr().err


def test_import_fdecode_loads_no_server_or_transformers_module():
    """The library keeps its small dependency list: the server's packages load only with `fdecode.serve`."""
    import subprocess
    import sys

    code = (
        "import sys, fdecode\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('fastapi', 'uvicorn', 'prometheus_client', "
        "'transformers', 'starlette', 'httpx', 'openai')]\n"
        "assert not heavy, heavy\n"
        "import fdecode.serve\n"
        "assert 'fastapi' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": ":".join(sys.path)})
