"""Draft trees on hybrid targets (Qwen3.5: Gated DeltaNet + gated attention) with their MTP heads (issue 55).

Each tree node's conv window and delta-rule state continue its parent's, not the previous row's; the accepted
path's last node's state is committed. Checked: the recurrence over tree rows against chains over each
root-to-node path; greedy lanes commit transformers' tokens (a 5-token vocabulary, where wide trees accept deep
and sibling paths often, and the real checkpoint layout at K = 3); the committed state and KV equal a from-scratch
forward; random lanes follow the target (chi-square); one graph without breaks or host syncs.
"""

from __future__ import annotations

import pytest
import torch
from support.hand_grammar import parity
from support.hybrid_models import (
    PROMPTS,
    hf_greedy,
    hf_hybrid,
    hybrid_mtp_head,
    hybrid_target,
    near_copy,
    prompts,
    run,
    save_with_mtp,
    scratch_states,
    staggered,
)
from support.llama_models import fresh_forward
from support.processor_oracle import hf_processed
from support.tiny_vocab import check_follows_the_target

import fdecode
from fdecode import SamplingParams
from fdecode.models.dense import dense_forward
from fdecode.ops import slot_of
from fdecode.ops.delta_rule import causal_conv_rows, gated_delta_rows

V = 5  # the root's top 3 children hold most of the target's mass: deep and sibling paths are accepted often
TINY_PROMPTS = [tuple(p.tolist()) for p in prompts((7, 11, 4), seed=2, vocab=V)]
NEW = 16


def tree_step(
    pattern: str, draft: str, n: int, k: int, s: int, backend: str = "eager", family: str = "qwen3_5", **changes
):
    """A tree step on the V-token hybrid of `family`; draft "mtp", "mtp2" (a two-layer head), "self" (the target as
    its own draft LM), "near" (a hybrid draft LM that agrees often, not always) or "ngram"."""
    target = hybrid_target(pattern, family=family, vocab_size=V)
    cfg = fdecode.DecodeConfig(
        **{
            "num_draft_tokens": n,
            "draft_topk": k,
            "draft_depth": s,
            "max_batch": 4,
            "max_seq_len": 64,
            "block_size": 4,
            "backend": backend,
            **changes,
        }
    )
    if draft.startswith("mtp"):
        draft = hybrid_mtp_head(target, layers=int(draft[3:] or 1))
    elif draft in ("self", "near"):
        draft = target if draft == "self" else near_copy(target, noise=0.3)
    return fdecode.compile(target, draft, cfg), target


def test_tree_rows_continue_their_parents_state():
    """Row j of a tree starts from the state after its parent row: its output and its state after it equal those
    of a chain over the rows of its root-to-node path."""
    gen = torch.Generator().manual_seed(0)
    parents = torch.tensor([[-1, 0, 0, 1, 2, 2, 4], [-1, 0, 1, 0, 3, 1, 5]])  # [B, Q], parents first
    b, q, hv, dk, dv, c = 2, 7, 2, 4, 3, 6
    x, window, weight = torch.randn(b, q, c, generator=gen), torch.randn(b, c, 3, generator=gen), torch.randn(c, 4)
    qk = torch.nn.functional.normalize(torch.randn(2, b, q, hv, dk, generator=gen), dim=-1)
    v, g = torch.randn(b, q, hv, dv, generator=gen), -torch.rand(b, q, hv, generator=gen)
    beta, rec = torch.rand(b, q, hv, generator=gen), torch.randn(b, hv, dk, dv, generator=gen)
    conv_out, windows = causal_conv_rows(x, window, weight, snapshots=True, parents=parents)
    o, states = gated_delta_rows(qk[0], qk[1], v, g, beta, rec, snapshots=True, parents=parents)
    for lane in range(b):
        for j in range(q):
            path = [j]
            while parents[lane, path[0]] >= 0:
                path.insert(0, int(parents[lane, path[0]]))
            rows = torch.tensor(path)
            one = slice(lane, lane + 1)
            chain_out, chain_window = causal_conv_rows(x[one, rows], window[one], weight)
            chain_o, chain_state = gated_delta_rows(*(t[one, rows] for t in (qk[0], qk[1], v, g, beta)), rec[one])
            torch.testing.assert_close(conv_out[lane, j], chain_out[0, -1], rtol=0, atol=1e-6)
            torch.testing.assert_close(windows[lane, j], chain_window[0], rtol=0, atol=0)
            torch.testing.assert_close(o[lane, j], chain_o[0, -1], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(states[lane, j], chain_state[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("pattern", "draft", "n", "k", "s", "family"),
    [
        ("full-lin-lin-full", "mtp", 6, 3, 2, "qwen3_5"),
        ("lin-lin-lin-full", "mtp", 9, 3, 3, "qwen3_5"),
        ("lin-lin-lin-full", "ngram", 6, 2, 3, "qwen3_5"),
        ("lin-lin-lin-full", "mtp2", 6, 3, 2, "qwen3_5"),  # draft level j runs layer j mod 2
        ("full-lin-lin-full", "mtp", 6, 3, 2, "qwen3_next"),  # fused projections, MoE and dense MLPs
        ("lin-lin-lin-full", "mtp", 6, 3, 2, "qwen3_5_moe"),
        ("full-lin-lin-full", "self", 6, 2, 3, "qwen3_5"),  # hybrid draft LMs: per-node state in the draft too
        ("lin-lin-lin-full", "near", 9, 3, 3, "qwen3_5"),
    ],
)
def test_greedy_tree_on_a_hybrid_equals_transformers(pattern, draft, n, k, s, family):
    step, _ = tree_step(pattern, draft, n, k, s, family=family)
    outs, lengths, _ = run(step, TINY_PROMPTS, new=NEW)
    assert outs == [hf_greedy(p, pattern, NEW, family, vocab_size=V) for p in TINY_PROMPTS]
    assert max(lengths) >= 3, lengths  # paths of depth 2 and more were accepted, so per-node states mattered


@pytest.mark.parametrize("draft", ["mtp", "near"])
def test_tree_steps_at_every_depth_on_a_hybrid_equal_transformers(draft):
    """Depth 0 verifies the root alone, depths 1 .. S the window's first rows (the chain every tree holds first)
    and draft a chain; K the tree. In any order they commit transformers' greedy tokens, and the target's state
    is a from-scratch forward's after each (a hybrid draft LM's too, through t): every depth rolls it back."""
    step, target = tree_step("lin-lin-lin-full", draft, 6, 2, 3)
    assert step.depths == (0, 1, 2, 3, 4, 6)
    # tree -> chain -> tree, the 4-node tree between, each depth after each
    schedule = [6, 1, 6, 3, 0, 2, 6, 6, 2, 1, 0, 3, 3, 6, 4, 6, 4, 4, 0, 4, 2, 4, 1, 4, 3]
    state = step.prefill(TINY_PROMPTS, max_new_tokens=NEW)
    seqs = [list(p) + state.step_output.tokens[lane, :1].tolist() for lane, p in enumerate(TINY_PROMPTS)]
    for i in range(40):
        if bool(state.step_output.finished[: len(TINY_PROMPTS)].all()):
            break
        state, out = step(state, depth=schedule[i % len(schedule)])
        for lane, seq in enumerate(seqs):
            seq += out.tokens[lane, : int(out.num_tokens[lane])].tolist()
            if not bool(out.finished[lane]):
                conv, rec = scratch_states(target, seq[:-1])
                torch.testing.assert_close(state.target_rec[lane, :, 0], rec, rtol=0, atol=1e-5)
                torch.testing.assert_close(state.target_conv[lane, :, 0], conv, rtol=0, atol=1e-5)
                if draft == "near":
                    conv, rec = scratch_states(step.draft, seq)
                    torch.testing.assert_close(state.draft_rec[lane, :, 0], rec, rtol=0, atol=1e-5)
    assert [seq[len(p) :] for seq, p in zip(seqs, TINY_PROMPTS)] == [
        hf_greedy(p, "lin-lin-lin-full", NEW, vocab_size=V) for p in TINY_PROMPTS
    ]


@pytest.mark.parametrize("draft", ["mtp", "near"])
def test_greedy_hybrid_tree_with_processors_equals_transformers(draft):
    """Penalties, a bias, min_tokens and a grammar apply per node (each row after its own path) on a hybrid tree
    as on a dense one: its greedy lanes equal transformers' under the same processors."""
    features = dict(penalties=True, min_tokens=True, max_logit_bias=3, max_grammar_states=8, max_grammar_transitions=64)
    step, _ = tree_step("lin-lin-lin-full", draft, 6, 2, 3, adaptive_depth=False, **features)
    eos = V - 1
    requests = [
        SamplingParams(repetition_penalty=0.7, frequency_penalty=-0.3, presence_penalty=0.4, logit_bias={2: 1.0}),
        SamplingParams(grammar=parity(V, eos), repetition_penalty=1.4),
    ]
    for params in requests:
        params = params.replace(min_tokens=4, eos_token_id=eos, max_new_tokens=NEW)
        got = fdecode.generate(step, [list(p) for p in TINY_PROMPTS], params)
        model = hf_hybrid("lin-lin-lin-full", vocab_size=V)
        assert got == [hf_processed(p, params, NEW, eos=eos, model=model)[0] for p in TINY_PROMPTS]
        assert got != fdecode.generate(step, [list(p) for p in TINY_PROMPTS], max_new_tokens=NEW, eos_token_id=eos)


def test_mtp_head_from_a_checkpoint_folder_drafts_lossless_trees(tmp_path):
    """The seed configuration's layout: Qwen3.5 with its MTP head from checkpoint keys, K = 3 nodes."""
    save_with_mtp(tmp_path)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=3, draft_topk=2, draft_depth=2, max_batch=4, max_seq_len=64, block_size=4, backend="eager"
    )
    step = fdecode.compile(str(tmp_path), "mtp", cfg)
    outs, _, _ = run(step, PROMPTS)
    assert outs == [hf_greedy(p) for p in PROMPTS]


@pytest.mark.parametrize("draft", ["mtp", "near"])
def test_committed_state_and_kv_after_trees_equal_a_from_scratch_forward(draft):
    """After several tree steps the target's conv windows and delta-rule states, and the KV of its attention
    layers at every position before t, are what a from-scratch forward over the committed tokens gives: the
    accepted path's last node's state was kept, and the rejected branches left nothing behind. A hybrid draft
    LM's state (copy 0) and KV are its from-scratch forward's through t: it caught up on the accepted branch."""
    step, target = tree_step("lin-lin-lin-full", draft, 9, 3, 3)
    state = step.prefill(TINY_PROMPTS, max_new_tokens=40)
    seqs, lengths = [list(p) for p in TINY_PROMPTS], set()
    for i in range(6):
        for lane, seq in enumerate(seqs):
            n = int(state.step_output.num_tokens[lane])
            seq += state.step_output.tokens[lane, :n].tolist()
            lengths.add(n if i else 0)
            assert int(state.base_pos[lane]) == len(seq) - 1
            conv, rec = scratch_states(target, seq[:-1])
            torch.testing.assert_close(state.target_conv[lane, :, 0], conv, rtol=0, atol=1e-5)
            torch.testing.assert_close(state.target_rec[lane, :, 0], rec, rtol=0, atol=1e-5)
            slots = slot_of(state.block_tables[lane : lane + 1], torch.arange(len(seq) - 1)[None], 4)[0]
            want = fresh_forward(target, seq[:-1])[2]
            torch.testing.assert_close(state.target_kv[:, :, slots], want, rtol=1e-5, atol=1e-5)
            if draft == "near":
                conv, rec = scratch_states(step.draft, seq)
                torch.testing.assert_close(state.draft_conv[lane, :, 0], conv, rtol=0, atol=1e-5)
                torch.testing.assert_close(state.draft_rec[lane, :, 0], rec, rtol=0, atol=1e-5)
                slots = slot_of(state.block_tables[lane : lane + 1], torch.arange(len(seq))[None], 4)[0]
                want = fresh_forward(step.draft, seq)[2]
                torch.testing.assert_close(state.draft_kv[:, :, slots], want, rtol=1e-5, atol=1e-5)
        state, _ = step(state)
    assert {2, 3} <= lengths, lengths  # paths of several depths were committed


def test_a_hybrid_draft_lm_branches_from_each_nodes_own_state():
    """Every node a hybrid draft LM drafts is among the top k of the draft's from-scratch forward over the
    committed tokens and the node's path: each frontier node ran from its parent's recurrent state (a node run
    from another's state at the same level picks other children now and then)."""
    step, _ = tree_step("lin-lin-lin-full", "near", 8, 2, 4)
    state = step.prefill(TINY_PROMPTS, max_new_tokens=30)
    seqs, checked = [list(p) for p in TINY_PROMPTS], 0
    for _ in range(5):
        for lane, seq in enumerate(seqs):
            seq += state.step_output.tokens[lane, : int(state.step_output.num_tokens[lane])].tolist()
            tokens, parents = state.tokens[lane].tolist(), state.tree_parents[lane].tolist()
            for node in (j for j in range(1, len(tokens)) if tokens[j] >= 0):
                path, up = [], parents[node]
                while up > 0:
                    path, up = [tokens[up], *path], parents[up]
                logits = dense_forward(step.draft, torch.tensor([seq + path]))[0][0, -1]
                assert tokens[node] in logits.topk(2).indices.tolist(), (lane, node)
                checked += 1
        state, _ = step(state)
    assert checked > 100


def test_engine_admits_requests_next_to_live_tree_lanes():
    """Two lanes, five requests arriving over time: lanes are re-primed (fresh recurrent state and a first tree)
    next to a lane mid-flight, whose state the admission leaves alone."""
    step, _ = tree_step("full-lin-lin-full", "mtp", 6, 3, 2, max_batch=2, adaptive_depth=False)  # trees each step
    arrivals = {0: [TINY_PROMPTS[0], TINY_PROMPTS[2]], 1: [TINY_PROMPTS[1]], 3: [TINY_PROMPTS[2]], 4: [(1, 2, 3)]}
    got, want = staggered(
        fdecode.Engine(step), arrivals, [5, 9, 6, 12, 7], lambda p: hf_greedy(p, "full-lin-lin-full", NEW, vocab_size=V)
    )
    assert got == want


@pytest.mark.slow  # 64 lanes x 40 batches of the eager tree step
@pytest.mark.parametrize("draft", ["mtp", "near"])
def test_random_tree_lanes_on_a_hybrid_follow_the_target(draft):
    """Three new tokens (125 outcomes at V = 5): the second and third come from verifying the MTP head's or a
    hybrid draft LM's trees, their nodes' states from their parents'."""
    step, target = tree_step("lin-lin-lin-full", draft, 4, 2, 2, max_batch=64, max_seq_len=12, adaptive_depth=False)
    check_follows_the_target(step, target, dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))


@pytest.mark.parametrize("draft", ["mtp", "self"])
def test_hybrid_tree_step_is_one_graph_without_host_syncs(draft):
    """The general plan's graph (greedy and random lanes: both verifications), both kinds of layer; with the MTP
    head, and with a hybrid draft LM (its frontier nodes as lanes of one row each)."""
    step, _ = tree_step("lin-full", draft, 4, 2, 2, backend="aot_eager")
    state = step.prefill(list(TINY_PROMPTS[:2]), max_new_tokens=8)
    report = fdecode.inspect(step, state, plan="full+top_k+top_p")
    assert (report.graph_count, report.graph_break_count, report.host_syncs) == (1, 0, []), report.break_reasons


@pytest.mark.slow
def test_inductor_hybrid_tree_step_equals_transformers_in_one_graph():
    """Inductor's code for the per-node recurrence (the rows' states written into one buffer, read back by
    parent): greedy lanes commit transformers' tokens from one graph that later steps run without recompiling."""
    step, _ = tree_step("lin-full", "mtp", 4, 2, 2, backend="inductor")
    assert step.backend == "inductor"
    with torch._dynamo.config.patch(error_on_recompile=True):
        outs, lengths, _ = run(step, TINY_PROMPTS, new=NEW)
    assert outs == [hf_greedy(p, "lin-full", NEW, vocab_size=V) for p in TINY_PROMPTS]
    assert len(step.graphs) == 1 and max(lengths) >= 3, lengths
