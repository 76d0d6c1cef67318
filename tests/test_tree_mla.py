"""Draft trees (`fdecode.tree`) on DeepSeek-V3 (MLA: tree attention over the latent cache, the accepted path's
latents moved at commit) and with the DeepSeek-style NextN MTP head (DeepSeek-V3, GLM-4.5) drafting level by level.

Greedy lanes commit transformers' greedy tokens; after several tree steps the target's and the head's latent
caches equal a from-scratch forward's; random lanes follow the target's distribution (chi-square over every
3-token outcome at a 5-token vocabulary); the step is one graph with no break and no host sync.
"""

from __future__ import annotations

import copy

import pytest
import torch
from support import glm_models
from support.deepseek_models import (
    NEW,
    PROMPTS,
    TINY_MLA,
    agreeing_pair,
    compiled,
    deepseek_target,
    greedy_of,
    hf_greedy,
    random_mtp_state,
    save_with_mtp,
)
from support.hybrid_models import run
from support.llama_models import fresh_forward
from support.tiny_vocab import check_follows_the_target

import fdecode
from fdecode.ops import slot_of

TREE = dict(draft_topk=2, draft_depth=3)  # with num_draft_tokens=6: 6 of the 10 nodes three levels of top-2 make


def test_greedy_tree_over_latent_caches_equals_transformers() -> None:
    """The target as its own draft LM: both forwards read their latent caches through the tree mask."""
    target = deepseek_target()
    outs, lengths, _ = run(compiled(target, target, 6, **TREE), PROMPTS, NEW)
    assert outs == [hf_greedy(p) for p in PROMPTS]
    assert 3 <= max(lengths) <= 4, lengths  # the target agrees with itself: paths accepted to depth 2 or more


def test_greedy_ngram_tree_over_the_latent_cache_equals_transformers() -> None:
    """n-gram trees (no draft forward) on prompts that repeat themselves: paths of depths 1 to 3 accepted."""
    prompts = [(5, 17, 33, 2, 9, 5, 17, 33, 4, 5, 17, 33, 2), (7, 3), (11, 12, 13, 14, 11, 12, 13, 15, 11, 12)]
    outs, lengths, _ = run(compiled(deepseek_target(), "ngram", 6, **TREE), prompts, 30)
    assert outs == [hf_greedy(p, 30) for p in prompts]
    assert max(lengths) == 4, lengths


@pytest.mark.parametrize("modules", [1, 2])
def test_nextn_tree_from_a_checkpoint_folder_equals_transformers(tmp_path, modules: int) -> None:
    """DeepSeek's MTP head of one module (every published checkpoint) or two (level j runs module j - 1 mod 2,
    each row writing both modules' latents), loaded from DeepSeek's layout."""
    save_with_mtp(tmp_path, random_mtp_state(layers=modules))
    step = compiled(str(tmp_path), "mtp", 6, **TREE)
    assert step.draft.num_mtp_layers == modules and step.config.tree
    outs, _, _ = run(step, PROMPTS, NEW)
    assert outs == [hf_greedy(p) for p in PROMPTS]


def test_an_agreeing_nextn_head_drafts_deep_trees() -> None:
    """A head that proposes the target's greedy token: with all 10 nodes of three top-2 levels verified, paths
    are accepted to depth 3, so each level's forward took its parent's output hidden and latents."""
    hf, target = agreeing_pair()
    outs, lengths, _ = run(compiled(target, "mtp", 10, **TREE), PROMPTS, NEW)
    assert outs == [greedy_of(hf, p) for p in PROMPTS]
    assert max(lengths) == 4, lengths


def test_glm_nextn_tree_equals_transformers(tmp_path) -> None:
    """GLM-4.5's NextN head (GQA + MoE layer) from GLM's checkpoint layout drafts trees."""
    glm_models.save_glm(tmp_path)
    outs, _, _ = run(compiled(str(tmp_path), "mtp", 6, **TREE), glm_models.PROMPTS, glm_models.NEW)
    assert outs == [glm_models.hf_greedy(p) for p in glm_models.PROMPTS]


@pytest.mark.parametrize("draft", ["noisy", "mtp"])
def test_latent_caches_are_contiguous_after_trees(draft: str) -> None:
    """After several tree steps, the target's latents of every position before t and the draft's of every
    committed position equal a from-scratch forward's: the accepted path's latents moved to the lane's next
    positions, the draft caught up on the accepted branch (the agreeing NextN head: token p with the target's
    hidden at p - 1), rejected nodes left nothing. A noisy copy of the three-layer target as its draft has paths
    of several depths accepted, off the chain too (the target itself would accept the chain, rows 1 .. 3, whole:
    nothing to move), the agreeing head depth-3 ones."""
    target = deepseek_target() if draft == "noisy" else agreeing_pair()[1]
    step = compiled(target, noisy_copy(target) if draft == "noisy" else "mtp", 10, **TREE)
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
    assert max(lengths) == 4 and (draft == "mtp" or len(set(lengths)) > 2), lengths
    assert state.target_kv.shape[1] == 1  # one latent [c | k_pe] a slot, not keys and values
    bs = step.config.block_size
    for lane, seq in enumerate(seqs):
        n = int(state.base_pos[lane]) + 1
        assert n == len(seq)
        slots = slot_of(state.block_tables[lane : lane + 1], torch.arange(n)[None], bs)[0]
        _, hidden, want = fresh_forward(step.target, seq, block_size=bs)
        torch.testing.assert_close(state.target_kv[:, :, slots[:-1]], want[:, :, :-1], rtol=1e-5, atol=1e-5)
        shifted = torch.cat([hidden.new_zeros(1, 1, hidden.shape[-1]), hidden[:, :-1]], dim=1)
        want = fresh_forward(step.draft, seq, block_size=bs, hidden_in=shifted)[2]
        torch.testing.assert_close(state.draft_kv[:, :, slots], want, rtol=1e-5, atol=1e-5)


def noisy_copy(model, scale: float = 0.1, seed: int = 5):
    """`model` with every weight moved by `scale` times its mean magnitude of Gaussian noise: a draft that agrees
    with it often, not always."""
    noisy = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(scale * p.abs().mean() * torch.randn(p.shape, generator=generator))
    return noisy


def tiny_mla_with_head():
    """A DeepSeek-V3 at the 5-token vocabulary of `support.tiny_vocab`, with a random NextN head as `mtp`."""
    from fdecode.models.families.deepseek_v3 import DeepseekV3Model, mtp_head

    cfg = TINY_MLA.replace(mtp_num_layers=1)
    target = DeepseekV3Model.random(cfg, seed=11, std=0.6)
    head = mtp_head(cfg)
    head.init_random_(seed=12, std=0.6)
    target.mtp = head.bind(target)
    return target


@pytest.mark.parametrize(
    "params",
    [dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), dict(temperature=0.8, top_k=4, top_p=0.9, min_p=0.0)],
)
def test_random_nextn_tree_lanes_follow_the_target(params: dict) -> None:
    target = tiny_mla_with_head()
    step = compiled(target, "mtp", 4, draft_topk=2, draft_depth=2, max_batch=64, max_seq_len=12, adaptive_depth=False)
    check_follows_the_target(step, target, params)


def test_nextn_tree_step_is_one_graph_without_host_syncs() -> None:
    """The sampling plan's graph (greedy lanes' verification in it too): the head's levels, the latent writes
    and the accepted path's move are captured whole."""
    target = tiny_mla_with_head()
    step = compiled(target, "mtp", 4, draft_topk=2, draft_depth=2, backend="aot_eager")
    state = step.prefill([[1, 3, 2], [4, 0]], max_new_tokens=8)
    report = fdecode.inspect(step, state, plan="full+top_k+top_p")
    assert (report.graph_count, report.graph_break_count, report.host_syncs) == (1, 0, []), report.break_reasons
    assert report.op_counts.get("aten::index_copy_", 0) + report.op_counts.get("aten::index_copy", 0) >= 1
