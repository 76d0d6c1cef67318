"""The seed guarantee (`SamplingParams.seed`): with one speculation schedule for every batch
(`adaptive_depth=False`) and one attention window (`context_buckets=(max_seq_len,)`), a seeded random
request decodes the same tokens alone and beside any other requests: its rows' logits are bit-identical
(fixed shapes) and its random numbers are its own (seed, step counter).

bench/seed_batch.py measures what breaks it (BENCHMARKS.md, "Seeded samples and the batch"): only the
adaptive depth schedule changed tokens there.
"""

from __future__ import annotations

from support.llama_models import fdecode_target, independent_draft

import fdecode
from fdecode import SamplingParams


def test_a_seeded_request_decodes_the_same_alone_and_in_a_batch():
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=3,
        max_batch=4,
        max_seq_len=64,
        block_size=4,
        backend="eager",
        sampling=True,
        adaptive_depth=False,
        context_buckets=(64,),
    )
    step = fdecode.compile(target, independent_draft("partial", target), cfg)
    prompts = [[5, 17, 33, 2, 9, 41, 60, 5, 17, 4, 4, 8, 30, 31, 2, 9, 41], [7, 3], [11, 12, 13, 14, 15, 80], [9] * 9]
    params = [
        SamplingParams(temperature=t, top_p=p, seed=s, max_new_tokens=16, ignore_eos=True)
        for t, p, s in ((0.8, 1.0, 1), (1.0, 0.9, 2), (0.5, 1.0, 3), (1.3, 1.0, 4))
    ]
    alone = []
    for prompt, p in zip(prompts, params):
        engine = fdecode.Engine(step)
        rid = engine.add_request(prompt, p)
        alone.append(engine.run()[rid])
    engine = fdecode.Engine(step)  # together, in the other order, and beside greedy requests that finish early
    rids = [engine.add_request(prompt, p) for prompt, p in reversed(list(zip(prompts, params)))]
    others = [engine.add_request([1, 2, 3], max_new_tokens=n) for n in (3, 5)]
    together = engine.run()
    assert [together[rid] for rid in reversed(rids)] == alone
    assert all(len(together[rid]) for rid in others)
    assert len({tuple(a) for a in alone}) == 4
