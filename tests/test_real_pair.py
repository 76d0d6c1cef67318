"""The real draft/target pair (Qwen2.5-Coder 1.5B target, 0.5B draft; `fdecode.assets.qwen_coder`), cut to its
first two decoder layers each so CI can afford it: real weights, a real vocabulary (151,936) and a real tied
head, in eager mode. Greedy tokens equal transformers' `generate` on the same truncated target. The
truncated draft proposes other tokens than the truncated target would: verification rejects them.
Skipped, naming the script that fetches the pair, where its files are absent (they are not downloaded here).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from support.hybrid_models import run  # (tokens per prompt, accepted length per live lane-step, last state)

import fdecode
from fdecode.assets import qwen_coder

pytestmark = pytest.mark.skipif(qwen_coder.missing_reason() is not None, reason=str(qwen_coder.missing_reason()))

NEW = 12
LAYERS = 2


@pytest.fixture(scope="module")
def pair():
    target_dir, draft_dir = qwen_coder.safetensors_folders()

    def load(folder):
        return transformers.AutoModelForCausalLM.from_pretrained(
            folder, num_hidden_layers=LAYERS, dtype=torch.float32
        ).eval()

    tokenizer = transformers.AutoTokenizer.from_pretrained(target_dir)
    return load(target_dir), load(draft_dir), tokenizer


def test_truncated_real_pair_is_lossless_at_its_real_vocabulary(pair):
    target, draft, tokenizer = pair
    assert target.config.vocab_size == draft.config.vocab_size == 151936 and target.config.hidden_size == 1536
    prompts = [tokenizer(text)["input_ids"] for text in ("def fibonacci(n):\n", "for i in range(10):\n    print(")]
    step = fdecode.compile(
        target,
        draft,
        fdecode.DecodeConfig(
            num_draft_tokens=3,
            max_batch=2,
            max_seq_len=64,
            backend="eager",
            eos_token_id=None,
        ),
    )
    outs, lengths, _ = run(step, prompts, NEW)
    for prompt, got in zip(prompts, outs):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            want = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        assert got == want, (tokenizer.decode(got), tokenizer.decode(want))
    assert lengths and all(1 <= n <= 4 for n in lengths), lengths


def test_the_bench_workload_runs_every_system_on_the_truncated_pair(pair):
    """`fdecode bench --workloads qwen-coder-write` end to end (eager, K = 2, 6 tokens): every system commits
    target-only's tokens (the workload refuses otherwise) and the rows say what each ran; then
    `--workloads qwen-coder-batch`, batch 4 alone. One prompt: the others run the same code, and each costs
    CI a minute at this vocabulary."""
    from fdecode.bench.pair import run_pair_workload

    target, draft, tokenizer = pair
    for model in (target, draft):
        model.generation_config.eos_token_id = None
    rows = run_pair_workload(
        (target, draft, tokenizer, target, draft), 2, 6, 1, backend="eager", prompts=("write",), batch4=False
    )
    one = {r.system for r in rows}
    assert one == {
        "hf-generate",
        "hf-assisted",
        "target-only",
        "before",
        "fdecode depth 1",
        "fdecode depth 2",
        "fdecode",
        "fdecode Engine depth 2",
    }
    assert len(rows) == len(one) and all(r.batch == 1 and r.tokens_per_s > 0 for r in rows)
    assert all(len(r.extra["round_seconds"]) == 1 for r in rows)  # for `goal_markdown`'s round-by-round ratios
    adaptive = [r for r in rows if r.system == "fdecode"]  # the default config: the Engine chooses depths
    assert all(
        sum(r.extra["depths_launched"].values()) >= 1 and set(r.extra["depths_launched"]) <= {0, 1, 2} for r in adaptive
    )
    alone = run_pair_workload((target, draft, tokenizer, target, draft), 2, 6, 1, backend="eager", prompts=())
    batch = {r.system: r for r in alone}
    assert {(r.batch, r.system) for r in alone} == {(4, "fdecode"), (4, "fdecode Engine depth 2"), (4, "hf-generate")}
    assert batch["fdecode Engine depth 2"].extra["depths_launched"].keys() == {2}
    assert set(batch["fdecode"].extra["depths_launched"]) <= {0, 1, 2}
