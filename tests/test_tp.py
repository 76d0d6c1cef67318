"""Tensor parallelism: 2 gloo processes on CPU against single-process runs of the same models.

The ranks run every scenario of `support.tp_worker.run_rank` once (module fixture `ranks`);
the tests compare what they saw:
- greedy TP=2 == TP=1, token for token (independent draft LM, MTP head, captured graph, n-gram drafts);
- random lanes: both ranks accept the same tokens at every one of 200 steps, with no
  broadcast (identical all-gathered logits + the PRNG key in the state);
- `broadcast_accepted`: rank 1 samples with other seeds (a stand-in for a kernel that
  disagrees), yet both ranks commit exactly rank 0's unperturbed run; without the
  broadcast the same perturbation makes the ranks diverge (the control);
- `fdecode.inspect` on a rank: one graph, no breaks, the collectives as nodes.
"""

from __future__ import annotations

import pytest
import torch
from support.tp_worker import CFG, GREEDY_NEW, STEPS, partial_draft, reference, run_rank, spawn_ranks, target_model

import fdecode
from fdecode.models.sharding import check_divides

WORKER_TIMEOUT_S = 400  # a collective one rank never joins would otherwise hang the suite


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return spawn_ranks(run_rank, 2, tmp_path_factory.mktemp("tp"), WORKER_TIMEOUT_S)


@pytest.fixture(scope="module")
def single() -> dict:
    return reference()


def lengths(accepted: torch.Tensor) -> torch.Tensor:
    """[steps, B, W] accepted tokens -> [steps, B] accepted counts."""
    return (accepted >= 0).sum(dim=-1)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["greedy_model", "greedy_mtp", "greedy_compiled", "greedy_ngram"])
def test_tp2_greedy_equals_single_process(ranks, single, run):
    """n-gram drafts (through `generate`, so with the Engine's draft gate) commit the target's greedy tokens,
    which the LM-draft run's single-process output is."""
    want = single["greedy_mtp" if run == "greedy_mtp" else "greedy_model"]  # the compiled run uses the LM draft
    if run == "greedy_ngram":
        assert [rank["ngram_kind"] for rank in ranks] == ["ngram", "ngram"]
    for rank in ranks:
        assert rank[run] == want
    assert all(len(seq) == GREEDY_NEW for seq in want)  # no lane stopped early: the full budget is compared


@pytest.mark.slow
def test_sharded_forward_matches_full_model(ranks, single):
    """q/k/v biases (qwen2), q/k norms + o_proj bias (qwen3) and a tied head shard correctly."""
    for name, full in single["logits"].items():
        assert torch.equal(ranks[0]["logits"][name], ranks[1]["logits"][name]), name  # all-gathered: same bits
        torch.testing.assert_close(ranks[0]["logits"][name], full, rtol=1e-5, atol=1e-5, msg=name)
    # Each rank's target KV holds its half of the KV heads: [layers, 2, slots, Hkv / 2, D].
    for rank in ranks:
        assert rank["kv_shape"][0] == CFG.num_layers and rank["kv_shape"][3:] == (CFG.num_kv_heads // 2, CFG.head_dim)


@pytest.mark.slow
def test_a_vocabulary_that_does_not_divide_is_padded(ranks, single):
    """97 ids over 2 ranks: 49 rows each, the last padded; the gathered logits are cut back to 97."""
    for rank in ranks:
        assert rank["odd_vocab"] == single["odd_vocab"]


@pytest.mark.slow
def test_random_mode_ranks_agree_every_step(ranks):
    first, second = ranks[0]["random"], ranks[1]["random"]
    assert first.shape == (STEPS, 4, 3)
    mismatched = (first != second).any(dim=-1).any(dim=-1).nonzero().flatten().tolist()
    assert mismatched == [], f"ranks disagree at steps {mismatched[:10]}"
    counts = lengths(first)
    assert bool((counts >= 1).all()), "every lane must stay active for all the steps compared"
    assert set(counts.flatten().tolist()) == {1, 2, 3}, "expected a mixture of accepted lengths"


@pytest.mark.slow
def test_ranks_agree_without_a_seed(ranks):
    """Default seeds are agreed across ranks (drawn from one broadcast entropy), not drawn per process;
    two calls still get different seeds."""
    first, second = ranks[0]["unseeded"]
    assert ranks[1]["unseeded"] == [first, second]
    assert first != second


def test_ranks_diverge_without_broadcast_when_sampling_differs(ranks):
    """The control for the next test: the perturbation (other seeds on rank 1) really changes tokens."""
    assert not torch.equal(ranks[0]["control"], ranks[1]["control"])


@pytest.mark.slow
def test_broadcast_accepted_makes_ranks_follow_rank0(ranks):
    first, second = ranks[0]["broadcast"], ranks[1]["broadcast"]
    assert torch.equal(first, second)
    # Rank 0 sampled with the unperturbed seeds, so both ranks committed exactly the plain run.
    assert torch.equal(first, ranks[0]["random"])
    assert set(lengths(first).flatten().tolist()) == {1, 2, 3}


@pytest.mark.slow
def test_inspect_on_a_rank_shows_the_collectives(ranks):
    for rank in ranks:
        report = rank["inspect"]
        assert report["graph_count"] == 1
        assert report["graph_break_count"] == 0
        assert report["host_syncs"] == []
        ops = report["op_counts"]
        k, target_layers, draft_layers = 2, CFG.num_layers, 1
        # One all-reduce for the embedding and two per decoder layer (o_proj, down_proj), in the
        # validate forward and in each of the K draft forwards.
        assert ops["_c10d_functional::all_reduce"] == (1 + 2 * target_layers) + k * (1 + 2 * draft_layers)
        assert ops["_c10d_functional::all_gather_into_tensor"] == 1 + k  # one LM head per forward
        assert ops["_c10d_functional::broadcast"] == 1 + k  # the accepted run, then each draft
        assert ops["_c10d_functional::wait_tensor"] == sum(
            ops[f"_c10d_functional::{name}"] for name in ("all_reduce", "all_gather_into_tensor", "broadcast")
        )
        assert ops["fdecode::prepare_next_draft"] == 1


@pytest.mark.slow
def test_errors_need_a_shardable_model_and_the_right_group(ranks):
    errors = ranks[0]["errors"]
    assert errors["kv_heads"].startswith("ValueError") and "num_kv_heads = 3" in errors["kv_heads"]
    assert errors["size"].startswith("ValueError") and "tp_size=2" in errors["size"]
    assert errors["resharded"].startswith("ValueError") and "already sharded" in errors["resharded"]


def test_tp_without_a_process_group_raises():
    target = target_model()
    with pytest.raises(ValueError, match="no process group"):
        fdecode.compile(
            target,
            partial_draft(target),
            fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=32, backend="eager", tp_size=2),
        )
    with pytest.raises(TypeError, match="ProcessGroup"):
        fdecode.compile(
            target,
            partial_draft(target),
            fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=32, backend="eager", tp_size=2),
            tp_group="world",
        )


def test_config_checks_tp_options():
    with pytest.raises(ValueError, match="tp_size"):
        fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=32, tp_size=0)
    with pytest.raises(ValueError, match="broadcast_accepted needs tensor parallelism"):
        fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=32, broadcast_accepted=True)


@pytest.mark.parametrize(
    ("change", "name"),
    [
        (dict(num_heads=6, num_kv_heads=2), None),  # divides: no error
        (dict(num_heads=3, num_kv_heads=1), "num_heads"),
        (dict(num_heads=6, num_kv_heads=3), "num_kv_heads"),
        (dict(vocab_size=95), None),  # the vocabulary pads to 2 x 48 rows
        (dict(intermediate_size=127), "intermediate_size"),
    ],
)
def test_check_divides(change, name):
    cfg = CFG.replace(**change)
    if name is None:
        check_divides(cfg, 2)
        return
    with pytest.raises(ValueError, match=f"{name} = {getattr(cfg, name)} does not divide by 2"):
        check_divides(cfg, 2)
