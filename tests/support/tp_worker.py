"""The rank side of tests/test_tp.py: what each of the 2 spawned gloo processes runs.

`run_rank` runs every scenario once per process (a process group and the imports are
paid once) and saves what it saw to `<out>/rank<r>.pt`; the tests compare the ranks
with each other and with single-process runs of the same builders (`reference`).

Models are tiny random Llamas (std 0.1, so greedy argmaxes are far from ties); the
"partial" draft is the target cut to its first layer, so acceptance is mixed.
"""

from __future__ import annotations

import datetime
import os
import socket
import time

import torch
import torch.distributed as dist

import fdecode
from fdecode.models import LlamaModel, ModelConfig, MTPHead, group_exit
from fdecode.models.dense import dense_forward

CFG = ModelConfig(
    vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16
)
# Shapes that exercise the other sharding rules: q/k/v biases (qwen2), q/k norms and an o_proj bias
# (qwen3), a tied LM head (llama).
VARIANTS = {
    "qwen2": CFG.replace(model_type="qwen2", attention_bias=True),
    "qwen3": CFG.replace(model_type="qwen3", qk_norm=True, attention_bias=True),
    "tied": CFG.replace(tie_word_embeddings=True),
}
ODD_VOCAB = CFG.replace(vocab_size=97)  # does not divide by 2: the vocabulary-parallel layers pad it
PROMPTS = [[5, 17, 33, 2, 9, 41, 60], [7, 3], [11, 12, 13, 14, 15, 80, 81, 82, 83, 84, 85, 86, 87]]
GREEDY_NEW = 24
STEPS = 40  # steps of the random-mode runs (ranks that disagree do so within a few)
CONTROL_STEPS = 20  # steps of the run that shows ranks diverge without a broadcast
# Random lanes of several kinds plus one greedy lane, side by side.
SAMPLING = dict(temperature=[1.0, 0.8, 0.0, 1.2], top_k=[0, 20, 0, 0], top_p=[1.0, 1.0, 1.0, 0.9], seed=[1, 2, 3, 4])
PERTURBED_SEEDS = [1001, 1002, 1003, 1004]  # what rank 1 samples with when it "disagrees"


def target_model(cfg: ModelConfig = CFG) -> LlamaModel:
    return LlamaModel.random(cfg, seed=0, std=0.1).eval()


def partial_draft(target: LlamaModel) -> LlamaModel:
    """The target cut to its first decoder layer (same embedding, final norm and LM head)."""
    small = LlamaModel(target.config.replace(num_layers=1))
    keep = {k: v for k, v in target.state_dict().items() if not k.startswith("layers.") or k.startswith("layers.0.")}
    small.load_state_dict(keep)
    return small.eval()


def mtp_draft(target: LlamaModel) -> MTPHead:
    return MTPHead.random(target.config, seed=7, std=0.1)


def decode_config(**changes) -> fdecode.DecodeConfig:
    base = dict(num_draft_tokens=2, max_batch=4, max_seq_len=640, block_size=16, backend="eager")
    return fdecode.DecodeConfig(**{**base, **changes})


def greedy(step) -> list[list[int]]:
    return fdecode.generate(step, PROMPTS, max_new_tokens=GREEDY_NEW, progress=False)


def accepted_per_step(step, steps: int, seeds: list[int]) -> torch.Tensor:
    """[steps, B, W] int64: the accepted tokens (-1 padded) of every step, random lanes included."""
    prompts = PROMPTS + [[1, 2, 3]]
    state = step.prefill(prompts, max_new_tokens=3 * steps, **{**SAMPLING, "seed": seeds})
    rows = []
    for _ in range(steps):
        state, out = step(state)
        rows.append(out.tokens.clone())
    return torch.stack(rows)


def variant_logits(cfg: ModelConfig, tp_group=None) -> torch.Tensor:
    """Logits [1, T, V] of a whole-sequence forward of the variant `cfg` (sharded when a group is given)."""
    model = target_model(cfg)
    if tp_group is not None:
        from fdecode.models.parallel import TPGroup
        from fdecode.models.sharding import shard_model

        model = shard_model(model, TPGroup.of(tp_group))
    with torch.no_grad():
        return dense_forward(model, torch.tensor([PROMPTS[2]]))[0]


def reference() -> dict[str, object]:
    """The single-process (TP off) results the ranks are compared with."""
    target = target_model()
    return {
        "greedy_model": greedy(fdecode.compile(target, partial_draft(target), decode_config())),
        "greedy_mtp": greedy(fdecode.compile(target, mtp_draft(target), decode_config())),
        "logits": {name: variant_logits(cfg) for name, cfg in VARIANTS.items()},
        "odd_vocab": greedy(
            fdecode.compile(target_model(ODD_VOCAB), partial_draft(target_model(ODD_VOCAB)), decode_config())
        ),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(run, nprocs: int, out, timeout_s: float) -> list[dict]:
    """Run `run(rank, port, out)` in `nprocs` spawned processes; returns what each saved to `out/rank<r>.pt`.
    A rank stuck in a collective is killed after `timeout_s` and the test fails (rather than hanging)."""
    import pytest

    ctx = torch.multiprocessing.start_processes(
        run, args=(free_port(), str(out)), nprocs=nprocs, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=2):  # raises with the worker's traceback if a rank fails
        if time.monotonic() > deadline:
            for process in ctx.processes:
                process.kill()
            pytest.fail(f"the ranks did not finish within {timeout_s} s (a rank stuck in a collective?)")
    # weights_only=False: the files hold lists and dicts the test's own workers wrote.
    return [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(nprocs)]


def _error(fn) -> str:
    try:
        fn()
    except (ValueError, TypeError) as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def run_rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=120),
    )
    group = dist.group.WORLD
    target = target_model()
    tp2 = dict(tp_size=2)
    result: dict[str, object] = {"seconds": {}}
    clock = time.perf_counter()

    def lap(name: str) -> None:  # wall time of each scenario, to keep the test inside CI's budget
        nonlocal clock
        result["seconds"][name], clock = time.perf_counter() - clock, time.perf_counter()

    def tp_step(draft, **changes):
        return fdecode.compile(target, draft, decode_config(**tp2, **changes), tp_group=group)

    result["greedy_model"] = greedy(tp_step(partial_draft(target)))
    lap("greedy_model")
    result["greedy_mtp"] = greedy(tp_step(mtp_draft(target)))
    lap("greedy_mtp")
    ngram = tp_step("ngram")  # no weights to shard: every rank looks up the same committed tokens
    result["greedy_ngram"] = greedy(ngram)
    result["ngram_kind"] = ngram.draft_kind
    lap("greedy_ngram")
    # The same pair captured by Dynamo (collectives inside the graph) must agree too; greedy-only
    # (sampling=False), the smaller graph, to keep the capture time down, and with rank 0's tokens broadcast,
    # so that the inspection of its graph below shows every kind of collective. (The broadcast's effect on
    # random lanes: the eager `broadcast` run below.)
    compiled = tp_step(partial_draft(target), backend="dynamo", sampling=False, broadcast_accepted=True)
    result["greedy_compiled"] = greedy(compiled)
    lap("greedy_compiled")
    report = fdecode.inspect(compiled, compiled.prefill(PROMPTS, max_new_tokens=8))
    result["inspect"] = {
        "graph_count": report.graph_count,
        "graph_break_count": report.graph_break_count,
        "host_syncs": report.host_syncs,
        "op_counts": report.op_counts,
    }
    lap("inspect")
    result["logits"] = {name: variant_logits(cfg, group) for name, cfg in VARIANTS.items()}
    result["kv_shape"] = tuple(compiled.prefill([[1, 2]]).target_kv.shape)
    lap("logits")

    step = tp_step(partial_draft(target))
    seeds = SAMPLING["seed"]
    perturbed = PERTURBED_SEEDS if rank == 1 else seeds  # stands in for a rank whose kernels disagree
    result["random"] = accepted_per_step(step, STEPS, seeds)
    lap("random")
    result["control"] = accepted_per_step(step, CONTROL_STEPS, perturbed)
    lap("control")
    # No seed given: each rank must still draw the same default seeds (the step's SeedSource).
    result["unseeded"] = [
        fdecode.generate(step, PROMPTS, max_new_tokens=24, temperature=1.0, progress=False) for _ in range(2)
    ]
    lap("unseeded")
    broadcast = tp_step(partial_draft(target), broadcast_accepted=True)
    result["broadcast"] = accepted_per_step(broadcast, STEPS, perturbed)
    lap("broadcast")

    odd_kv = target_model(CFG.replace(num_heads=6, num_kv_heads=3))
    odd_vocab = target_model(ODD_VOCAB)
    result["odd_vocab"] = greedy(
        fdecode.compile(odd_vocab, partial_draft(odd_vocab), decode_config(**tp2), tp_group=group)
    )

    def error_of(model, **changes) -> str:
        return _error(lambda: fdecode.compile(model, partial_draft(model), decode_config(**changes), tp_group=group))

    result["errors"] = {
        "kv_heads": error_of(odd_kv, **tp2),
        "size": error_of(target, tp_size=4),
        "resharded": _error(lambda: tp_step(step.draft)),
    }
    lap("errors")
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    group_exit.destroy_process_group()
