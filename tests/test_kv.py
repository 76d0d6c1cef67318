"""Draft-KV consistency and scratch isolation (docs/design.md invariants), with mixed acceptance; KV pools
(ownership rules: `fdecode.state.ownership`, more in `test_ownership.py`)."""

from __future__ import annotations

import torch
from support.llama_models import fdecode_target, fresh_forward, independent_draft, mtp_head

import fdecode
from fdecode.ops import slot_of

PROMPTS = [[5, 17, 33, 2, 9], [7, 3, 4, 4, 1, 1, 2, 60, 61], [11, 12]]


def committed_run(step, steps, max_new_tokens=40, prompts=PROMPTS):
    """Step `steps` times; return state, committed sequences, and per-lane positions written by
    the repair/current rows (the draft entries that are exact by construction)."""
    state = step.prefill(prompts, max_new_tokens=max_new_tokens)
    seqs = [list(p) for p in prompts]
    exact = [set(range(len(p))) for p in prompts]  # prompt positions come from the draft prefill
    lengths = set()
    for i in range(steps + 1):
        out = state.step_output
        for lane in range(len(prompts)):
            n = int(out.num_tokens[lane])
            seqs[lane] += out.tokens[lane, :n].tolist()
            if n:
                p = int(state.base_pos[lane])  # position of `last`, written by the current row
                exact[lane].add(p)
                if n == step.config.W:
                    exact[lane].add(p - 1)  # the repair row wrote the accepted dK
                if i:
                    lengths.add(n)
        if i < steps:
            state, _ = step(state)
    return state, seqs, exact, lengths


def lane_slots(state, lane, n, block_size):
    positions = torch.arange(n)[None]
    return slot_of(state.block_tables[lane : lane + 1], positions, block_size)[0]


def stepped(draft, target, k):
    """Eight steps of `draft` against `target` with mixed acceptance (asserted)."""
    cfg = fdecode.DecodeConfig(num_draft_tokens=k, max_batch=4, max_seq_len=64, block_size=4, backend="eager")
    state, seqs, exact, lengths = committed_run(fdecode.compile(target, draft, cfg), steps=8)
    assert len(lengths) >= 2, lengths  # mixed acceptance
    return cfg, state, seqs, exact


def test_independent_draft_kv_matches_a_from_scratch_forward():
    target = fdecode_target(2)
    draft = independent_draft("partial", target)
    cfg, state, seqs, _ = stepped(draft, target, k=3)
    for lane, seq in enumerate(seqs):
        # Committed positions 0..P hold KV; `last` (at P) went through the draft as the current row.
        n = int(state.base_pos[lane]) + 1
        assert n == len(seq)
        want = fresh_forward(draft, seq[:n], block_size=cfg.block_size)[2]
        got = state.draft_kv[:, :, lane_slots(state, lane, n, cfg.block_size)]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_mtp_kv_of_repair_and_current_rows_matches_from_scratch():
    target = fdecode_target(2)
    head = mtp_head("partial", target)
    cfg, state, seqs, exact = stepped(head, target, k=2)
    for lane, seq in enumerate(seqs):
        n = int(state.base_pos[lane]) + 1
        target_hidden = fresh_forward(target, seq[:n], block_size=cfg.block_size)[1]  # of every committed position
        shifted = torch.cat([torch.zeros_like(target_hidden[:, :1]), target_hidden[:, :-1]], dim=1)
        want = fresh_forward(head, seq[:n], block_size=cfg.block_size, hidden_in=shifted)[2]
        got = state.draft_kv[:, :, lane_slots(state, lane, n, cfg.block_size)]
        rows = sorted(exact[lane])
        assert len(rows) > len(PROMPTS[lane])  # the steps contributed rows too
        torch.testing.assert_close(got[:, :, rows], want[:, :, rows], rtol=1e-5, atol=1e-5)


def test_finished_lanes_and_free_blocks_are_never_written():
    target = fdecode_target(2)
    draft = independent_draft("partial", target)
    # A generous pool: blocks nobody owns must stay zero; lane 1 finishes after 2 tokens.
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=3, max_batch=4, max_seq_len=48, block_size=4, num_blocks=64, backend="eager"
    )
    step = fdecode.compile(target, draft, cfg)
    state = step.prefill(PROMPTS, max_new_tokens=30)
    state = state.replace(remaining=torch.tensor([30, 1, 30, 0]))  # lane 1: one more token, then done
    state, out = step(state)
    assert bool(out.finished[1]) and not bool(out.finished[0])

    owned = state.block_tables[state.block_tables >= 0]
    free = torch.ones(cfg.pool_blocks, dtype=torch.bool)
    free[owned] = False
    free[0] = False  # scratch is written freely
    bs = cfg.block_size

    def blocks(kv, which):
        return kv.view(kv.shape[0], 2, cfg.pool_blocks, bs, *kv.shape[3:])[:, :, which]

    lane1 = state.block_tables[1][state.block_tables[1] >= 0]
    before_t, before_d = blocks(state.target_kv, lane1).clone(), blocks(state.draft_kv, lane1).clone()
    lengths = set()
    for _ in range(12):
        state, out = step(state)
        lengths.update(int(n) for n in out.num_tokens[[0, 2]] if n)
        assert int(out.num_tokens[1]) == 0 and int(out.num_tokens[3]) == 0
    assert len(lengths) >= 2, lengths  # the other lanes accepted and rejected meanwhile
    assert torch.equal(blocks(state.target_kv, lane1), before_t)
    assert torch.equal(blocks(state.draft_kv, lane1), before_d)
    assert not blocks(state.target_kv, free).any()
    assert not blocks(state.draft_kv, free).any()


def test_both_kv_writes_put_every_row_in_the_same_place():
    """`index_put` (CPU, CUDA) and `scatter_nd` (NPU) writes of random rows to random distinct slots."""
    from fdecode.ops.kv import write_kv

    gen = torch.Generator().manual_seed(0)
    for layers, batch, q_len, heads, d in ((1, 1, 1, 1, 8), (3, 2, 4, 2, 16), (2, 5, 2, 4, 8)):
        cache = torch.randn(layers, 2, 64, heads, d, generator=gen)
        slots = torch.randperm(63, generator=gen)[: batch * q_len].view(batch, q_len) + 1  # distinct, not scratch
        k, v = torch.randn(2, batch, q_len, heads, d, generator=gen).to(torch.float64)  # cast to the cache dtype
        for layer in range(layers):
            a, b = cache.clone(), cache.clone()
            write_kv(a, layer, slots, k, v, way="index_put")
            write_kv(b, layer, slots, k, v, way="scatter_nd")
            assert torch.equal(a, b)
            assert torch.equal(a[layer, 0, slots.flatten()], k.reshape(-1, heads, d).float())
            assert torch.equal(a[layer, 1, slots.flatten()], v.reshape(-1, heads, d).float())
            untouched = torch.ones(64, dtype=torch.bool)
            untouched[slots.flatten()] = False
            assert torch.equal(a[:, :, untouched], cache[:, :, untouched])
            others = [i for i in range(layers) if i != layer]
            assert torch.equal(a[others], cache[others])


def test_kv_pools_are_reused_only_when_no_state_holds_them():
    """A prefill takes a KV pool no live state chain holds (graph replay keeps its addresses across
    generations); two live chains (concurrent=True) never share one, so interleaving them changes no
    token. Compiled (aot_eager): the KV a compiled step returns is found by storage, not identity."""
    import gc

    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=4, max_seq_len=64, block_size=4, backend="aot_eager")
    step = fdecode.compile(target, independent_draft("partial", target), cfg)
    first = fdecode.generate(step, PROMPTS, max_new_tokens=12)
    gc.collect()
    (pool,) = step.kv_pools
    assert pool.free
    assert fdecode.generate(step, PROMPTS, max_new_tokens=12) == first  # the same pool, stale KV and all
    assert len(step.kv_pools) == 1

    a = step.prefill(PROMPTS[:2], max_new_tokens=12, concurrent=True)
    assert a.target_kv.data_ptr() == pool.target_kv.data_ptr() and not pool.free
    b = step.prefill(PROMPTS[1:], max_new_tokens=12, concurrent=True)  # `a` is alive: a second pool
    assert len(step.kv_pools) == 2 and b.target_kv.data_ptr() != a.target_kv.data_ptr()
    seqs = {"a": [], "b": []}
    for _ in range(5):  # interleaved: each chain keeps its pool through the state its step returns
        a, out_a = step(a)
        b, out_b = step(b)
        seqs["a"].append(out_a.tokens.tolist())
        seqs["b"].append(out_b.tokens.tolist())
    assert not step.kv_pools[0].free and not step.kv_pools[1].free
    for name, prompts in (("a", PROMPTS[:2]), ("b", PROMPTS[1:])):
        alone = step.prefill(prompts, max_new_tokens=12)  # a third pool: both chains are still alive
        got = []
        for _ in range(5):
            alone, out = step(alone)
            got.append(out.tokens.tolist())
        assert got == seqs[name]
    assert len(step.kv_pools) == 3  # the second plain prefill took the first one's pool over
    del a, b, alone
    gc.collect()
    assert all(p.free for p in step.kv_pools)
    step.prefill(PROMPTS, max_new_tokens=4)  # takes the oldest free pool and drops the other free ones
    assert step.kv_pools == [pool]


def test_warmup_hands_its_kv_pool_to_the_first_prefill():
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=2,
        max_batch=2,
        max_seq_len=64,
        block_size=4,
        backend="dynamo",
        context_buckets=(32, 64),
        sampling=False,
    )  # greedy only: one capture, not five
    step = fdecode.compile(target, independent_draft("partial", target), cfg, warmup=True)
    (pool,) = step.kv_pools
    assert step.prefill(PROMPTS[:2], max_new_tokens=8).draft_kv.data_ptr() == pool.draft_kv.data_ptr()


def test_an_engine_keeps_its_kv_pool_through_admissions():
    """Admission replaces the engine's state (`replace` builds a new object over the same KV): the ticket
    goes with it, so a prefill meanwhile never takes the engine's pool."""
    import gc

    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=64, block_size=4, backend="eager")
    step = fdecode.compile(target, independent_draft("partial", target), cfg)
    engine = fdecode.Engine(step)
    engine.add_request(PROMPTS[0], max_new_tokens=30)
    engine.step()
    engine.add_request(PROMPTS[1], max_new_tokens=30)  # admitted into the live state by the next steps
    for _ in range(3):
        engine.step()
    gc.collect()
    ticket = engine.state.kv_ticket
    assert ticket is not None and ticket.pool is not None and not ticket.spent
    other = step.prefill(PROMPTS[2:], max_new_tokens=8)
    assert other.target_kv.data_ptr() != engine.state.target_kv.data_ptr()
    assert engine.state.clone().kv_ticket.pool is None  # a clone has KV of its own
    engine.run()  # and the engine runs on


def test_scatter_nd_stand_in_passes_opcheck():
    """`fdecode::scatter_nd_update_` (torch_npu's op's stand-in off the NPU) is a well-formed mutating op:
    schema, fake implementation and functionalization agree with what it does."""
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(2, 2, 16, 2, 4, generator=gen)
    indices = torch.tensor([[0, 0, 3], [1, 1, 5], [0, 1, 9]])
    updates = torch.randn(3, 2, 4, generator=gen)
    torch.library.opcheck(torch.ops.fdecode.scatter_nd_update_.default, (cache.clone(), indices, updates))
    out = cache.clone()
    torch.ops.fdecode.scatter_nd_update_(out, indices, updates)
    for (layer, kind, slot), row in zip(indices.tolist(), updates):
        assert torch.equal(out[layer, kind, slot], row)
    out[tuple(indices.T)] = cache[tuple(indices.T)]
    assert torch.equal(out, cache)  # nothing else written
