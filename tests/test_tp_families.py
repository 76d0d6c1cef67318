"""Tensor parallelism for every MTP family (`fdecode.models.sharding`): gloo processes on the CPU against
transformers' greedy `generate` of the same models (`support.tp_families_worker`).

- Qwen3.5 (Gated DeltaNet + gated attention), Qwen3-Next (fused qkvz, MoE and dense MLPs), Qwen3.5-MoE,
  each with its MTP head at K = 3; DeepSeek-V3 (MLA + MoE) and GLM-4.5 (GQA + MoE) with their NextN heads;
  a draft LM beside a Qwen3.5 target (partial acceptance: the recurrent rollback per rank): on every
  rank, greedy tokens == transformers';
- random lanes: both ranks commit the same tokens;
- each rank's KV and recurrent leaves hold its share of the heads, and its weights about half;
- draft trees (k = 2, S = 3): a hybrid MTP head, DeepSeek-V3's NextN head, a hybrid draft LM and
  `broadcast_accepted` equal transformers on both ranks; random tree lanes agree; one graph per rank;
- one case at 4 ranks; Qwen3.5 + MTP through Inductor: one graph per rank, the collectives inside;
- a split that does not divide is refused, naming the dimension, before any weight is read.
"""

from __future__ import annotations

import functools

import pytest
from support.tp_families_worker import CASES, reference, run_rank, run_rank_4, run_rank_inductor
from support.tp_worker import spawn_ranks

WORKER_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return spawn_ranks(run_rank, 2, tmp_path_factory.mktemp("tp_families"), WORKER_TIMEOUT_S)


@functools.cache
def want(case: str, size: int = 2) -> list[list[int]]:
    return reference(case, size)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_every_family_at_tp2_commits_transformers_greedy_tokens_on_every_rank(ranks, case):
    for rank in ranks:
        assert rank[case]["greedy"] == want(case)
    proposed, accepted = ranks[0][case]["proposed"], ranks[0][case]["accepted"]
    assert proposed > 0  # the drafts were verified, not skipped
    if case == "qwen3_5_draft":
        assert 0 < accepted < proposed  # partial acceptance: the target's recurrent state rolled back per rank


@pytest.mark.slow
def test_random_lanes_agree_across_ranks(ranks):
    assert ranks[0]["qwen3_5"]["random"] == ranks[1]["qwen3_5"]["random"]
    assert ranks[0]["qwen3_5"]["random"] != ranks[0]["qwen3_5"]["greedy"]


@pytest.mark.slow
def test_ranks_agree_on_every_event_with_grammars_ngram_drafts_adaptive_depth_and_max_seq_len(ranks):
    """One Engine of GLM-4.5 + MTP per rank (greedy, random, grammar and near-max_seq_len lanes, staggered;
    the adaptive depth choosing among 0 .. K): both ranks emit the same events and launch the same depths;
    the plain greedy lanes and a Qwen3.5 n-gram step equal transformers."""
    first, second = ranks[0]["agreement"], ranks[1]["agreement"]
    assert first["events"] == second["events"] and first["launches"] == second["launches"]
    assert sum(n > 0 for n in first["launches"].values()) > 1  # more than one depth was launched
    tokens: dict[int, list[int]] = {}
    for rid, new, _, _ in first["events"]:
        tokens.setdefault(rid, []).extend(new)
    greedy = want("glm4_moe")
    assert tokens[0] == greedy[0] and tokens[4] == greedy[1]
    assert len(tokens[1]) == 64 - 52  # the long prompt ran into max_seq_len, on both ranks alike
    reasons = {rid: reason for rid, _, done, reason in first["events"] if done}
    assert reasons[1] == "length"
    assert first["ngram"] == second["ngram"] == want("qwen3_5")


@pytest.mark.slow
def test_each_rank_holds_its_share_of_the_heads_and_about_half_the_weights(ranks):
    from support.tp_families_worker import hf_model

    for case in CASES:
        leaves = ranks[0][case]["leaves"]
        full = hf_model(case).config
        if case.startswith(("qwen3_5", "qwen3_next")):
            assert leaves["target_kv"][3] == full.num_key_value_heads // 2
            assert leaves["target_rec"][3] == full.linear_num_value_heads // 2  # [B, L_lin, copies, Hv, dk, dv]
            assert (
                leaves["target_conv"][3]
                == (
                    2 * full.linear_num_key_heads * full.linear_key_head_dim
                    + full.linear_num_value_heads * full.linear_value_head_dim
                )
                // 2
            )
        if case == "deepseek_v3":  # the latent cache is replicated: one head of R + Dr per token
            assert leaves["target_kv"][3:] == (1, full.kv_lora_rank + full.qk_rope_head_dim)
        share = ranks[0][case]["bytes"] / ranks[0][case]["full_bytes"]
        assert share < 0.6, (case, share)  # norms, routers and MTP eh_proj / fc are replicated


@pytest.mark.slow
@pytest.mark.parametrize("case", ["qwen3_5", "deepseek_v3", "qwen3_5_draft", "qwen3_5_broadcast"])
def test_draft_trees_at_tp2_commit_transformers_greedy_tokens_on_every_rank(ranks, case):
    """A tree of 6 nodes (k = 2, S = 3) per step: hybrid MTP head, DeepSeek-V3's NextN head, a hybrid draft LM,
    and rank 0's tree and path broadcast (`broadcast_accepted`)."""
    for rank in ranks:
        assert rank["trees"][case]["greedy"] == want(case.removesuffix("_broadcast"))
    proposed, accepted = ranks[0]["trees"][case]["proposed"], ranks[0]["trees"][case]["accepted"]
    assert proposed > 0  # the trees were verified, not skipped
    if case == "qwen3_5_draft":
        assert accepted > 0  # a near copy's nodes accepted: paths past the root committed on every rank


@pytest.mark.slow
def test_random_tree_lanes_agree_across_ranks(ranks):
    assert ranks[0]["trees"]["qwen3_5"]["random"] == ranks[1]["trees"]["qwen3_5"]["random"]
    assert ranks[0]["trees"]["qwen3_5"]["random"] != ranks[0]["trees"]["qwen3_5"]["greedy"]


@pytest.mark.slow
def test_a_tree_step_at_tp2_is_one_graph_with_its_collectives_inside(ranks):
    for rank in ranks:
        tree = rank["trees"]["qwen3_5"]
        assert tree["graph"] == (1, 0, [])
        # The verify over the 7 rows and each of the 3 levels' MTP forwards gather their LM head's logits.
        assert tree["collectives"]["_c10d_functional::all_gather_into_tensor"] == 1 + 3
        assert tree["collectives"]["_c10d_functional::all_reduce"] > 0


@pytest.mark.slow
def test_a_split_that_does_not_divide_is_refused_before_any_weight_is_read(ranks):
    for name, error in ranks[0]["errors"].items():
        assert error.startswith("ValueError") and f"{name} = " in error and "does not divide by 2" in error, error


@pytest.mark.slow
def test_qwen3_5_at_four_ranks(tmp_path):
    for rank in spawn_ranks(run_rank_4, 4, tmp_path, WORKER_TIMEOUT_S):
        assert rank["qwen3_5"]["greedy"] == want("qwen3_5", 4)
        assert rank["qwen3_5"]["leaves"]["target_rec"][3] == 2  # 8 value heads over 4 ranks


@pytest.mark.slow
def test_qwen3_5_mtp_at_tp2_through_inductor_is_one_graph_per_rank(tmp_path):
    for rank in spawn_ranks(run_rank_inductor, 2, tmp_path, WORKER_TIMEOUT_S):
        assert rank["backend"] == "inductor" and rank["greedy"] == want("qwen3_5")
        assert (rank["graph_count"], rank["graph_break_count"], rank["host_syncs"]) == (1, 0, [])
        ops = rank["op_counts"]
        assert ops["fdecode::prepare_next_draft"] == 1
        # 2 full-attention + 2 DeltaNet layers: o_proj / out_proj and the MLP's down_proj each all-reduce, the
        # embedding too: (1 + 2 * 4) in the verify, (1 + 2) in each of the K MTP forwards.
        assert ops["_c10d_functional::all_reduce"] == (1 + 2 * 4) + 3 * (1 + 2)
        assert ops["_c10d_functional::all_gather_into_tensor"] == 1 + 3  # one LM head per forward
