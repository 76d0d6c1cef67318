"""Draft trees (`fdecode.tree`) on DeepSeek-V3: tree attention over the MLA latent cache, the accepted path's
latents moved at commit.

Greedy lanes commit transformers' greedy tokens; after several tree steps the target's and the draft's latent
caches equal a from-scratch forward's.
"""

from __future__ import annotations

import torch
from support.deepseek_models import NEW, PROMPTS, compiled, deepseek_target, hf_greedy
from support.hybrid_models import run
from support.llama_models import fresh_forward

from fdecode.ops import slot_of

TREE = dict(draft_topk=2, draft_depth=3)  # with num_draft_tokens=6: 6 of the 10 nodes three levels of top-2 make


def test_greedy_tree_over_latent_caches_equals_transformers() -> None:
    """The target as its own draft LM: both forwards read their latent caches through the tree mask."""
    target = deepseek_target()
    outs, lengths, _ = run(compiled(target, target, 6, **TREE), PROMPTS, NEW)
    assert outs == [hf_greedy(p) for p in PROMPTS]
    assert 3 <= max(lengths) <= 4, lengths  # the target agrees with itself: paths accepted to depth 2 or more


def test_latent_caches_are_contiguous_after_trees() -> None:
    """After several tree steps, the target's latents of every position before t and the draft's of every
    committed position equal a from-scratch forward's: the accepted path's latents moved to the lane's next
    positions, the draft caught up on the accepted branch, rejected nodes left nothing. The three-layer target
    as its own draft has paths of several depths accepted."""
    target = deepseek_target()
    step = compiled(target, target, 10, **TREE)
    prompts = [list(p) for p in PROMPTS]
    state = step.prefill(prompts, max_new_tokens=40)
    seqs, lengths = [list(p) for p in prompts], []
    for i in range(6):
        for lane in range(len(prompts)):
            n = int(state.step_output.num_tokens[lane])
            seqs[lane] += state.step_output.tokens[lane, :n].tolist()
            lengths += [n] if i else []
        state, _ = step(state)
    for lane in range(len(prompts)):
        seqs[lane] += state.step_output.tokens[lane, : int(state.step_output.num_tokens[lane])].tolist()
    assert max(lengths) == 4 and len(set(lengths)) > 1, lengths
    assert state.target_kv.shape[1] == 1  # one latent [c | k_pe] a slot, not keys and values
    bs = step.config.block_size
    for lane, seq in enumerate(seqs):
        n = int(state.base_pos[lane]) + 1
        assert n == len(seq)
        slots = slot_of(state.block_tables[lane : lane + 1], torch.arange(n)[None], bs)[0]
        want = fresh_forward(step.target, seq, block_size=bs)[2]
        torch.testing.assert_close(state.target_kv[:, :, slots[:-1]], want[:, :, :-1], rtol=1e-5, atol=1e-5)
        want = fresh_forward(step.draft, seq, block_size=bs)[2]
        torch.testing.assert_close(state.draft_kv[:, :, slots], want, rtol=1e-5, atol=1e-5)
