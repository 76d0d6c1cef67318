"""The rank side of tests/test_tp_families.py: every MTP family at TP = 2 (and one at TP = 4), on gloo.

Each rank builds the same tiny models (transformers' models of each family in their checkpoint layouts,
loaded by `from_hf`, with random MTP heads of fixed seeds; the vocabulary is 96 so that it divides), runs
every case, and saves what it saw to `<out>/rank<r>.pt`. The test compares the ranks with each other and
with transformers' greedy `generate` (`reference`, in the test's own process).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

import fdecode
from fdecode.models import from_hf, group_exit

VOCAB = 96
NEW = 10
K = 3
CASES = ("qwen3_5", "qwen3_next", "qwen3_5_moe", "deepseek_v3", "glm4_moe", "qwen3_5_draft")
PROMPTS = [[5, 17, 33, 2, 9, 41, 60], [7, 3, 88, 90], [11, 12, 13, 14, 15, 80, 81, 82, 83, 84, 85]]


def hf_model(case: str, size: int = 2):
    """transformers' model of `case` (cached per process by the support builders)."""
    from support import deepseek_models, glm_models, hybrid_models

    if case.startswith(("qwen3_5", "qwen3_next")):
        family = "qwen3_5" if case == "qwen3_5_draft" else case
        wide = dict(num_key_value_heads=4, linear_num_key_heads=4, linear_num_value_heads=8) if size == 4 else {}
        return hybrid_models.hf_hybrid("full-lin-lin-full", family=family, vocab_size=VOCAB, **wide)
    if case == "deepseek_v3":
        return deepseek_models.hf_deepseek(vocab_size=VOCAB)
    if case == "glm4_moe":
        return glm_models.hf_glm(vocab_size=VOCAB)
    raise KeyError(case)


def pair(case: str, size: int = 2):
    """(target, draft) of `case`: the target's MTP head (`"mtp"`), or a noisy copy as a draft LM."""
    from fdecode.models.families.deepseek_v3 import mtp_head
    from fdecode.models.families.glm4_moe import Glm4MoeMTPHead
    from fdecode.models.mtp.hybrid import HybridMTPHead
    from support.hybrid_models import near_copy

    target = from_hf(hf_model(case, size))
    if case == "qwen3_5_draft":  # a draft LM beside a hybrid target: partial acceptance, rollback per rank
        return target, near_copy(target, noise=0.03)
    cfg = target.config.replace(mtp_num_layers=1)
    if case == "deepseek_v3":
        head = mtp_head(cfg)
        head.init_random_(seed=3, std=0.3)
    else:
        head = {"glm4_moe": Glm4MoeMTPHead}.get(case, HybridMTPHead).random(cfg, seed=3, std=0.3)
    target.mtp = head.bind(target)
    return target, "mtp"


def reference(case: str, size: int = 2) -> list[list[int]]:
    hf = hf_model(case, size)
    out = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        got = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        out.append(got[0, len(prompt) :].tolist())
    return out


def config(size: int, **changes) -> fdecode.DecodeConfig:
    base = dict(num_draft_tokens=K, max_batch=4, max_seq_len=64, block_size=4, backend="eager", tp_size=size)
    return fdecode.DecodeConfig(**{**base, **changes})


def weight_bytes(*models) -> int:
    seen, total = set(), 0
    for model in models:
        if isinstance(model, torch.nn.Module):
            for t in model.parameters():
                if id(t) not in seen:
                    seen.add(id(t))
                    total += t.numel() * t.element_size()
    return total


def run_rank(rank: int, port: int, out: str, cases: tuple[str, ...] = CASES, size: int = 2) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=datetime.timedelta(seconds=120),
    )
    group = dist.group.WORLD
    result: dict[str, object] = {}
    for case in cases:
        target, draft = pair(case, size)
        step = fdecode.compile(target, draft, config(size), tp_group=group)
        details = fdecode.generate(step, PROMPTS, max_new_tokens=NEW, eos_token_id=[], details=True, progress=False)
        state = step.empty_state()
        result[case] = {
            "greedy": [d.tokens for d in details],
            "accepted": sum(d.metrics.drafts_accepted for d in details),
            "proposed": sum(d.metrics.drafts_proposed for d in details),
            "leaves": {
                name: tuple(getattr(state, name).shape)
                for name in ("target_kv", "draft_kv", "target_conv", "target_rec", "draft_conv", "draft_rec")
                if getattr(state, name) is not None  # a model without linear-attention layers has no recurrent leaves
            },
            "bytes": weight_bytes(step.target, step.draft),
            "full_bytes": weight_bytes(target, target.mtp if draft == "mtp" else draft),
        }
        if case == "qwen3_5":  # random lanes: both ranks draw and accept the same tokens
            result[case]["random"] = fdecode.generate(
                step,
                PROMPTS,
                max_new_tokens=NEW,
                eos_token_id=[],
                temperature=[1.0, 0.8, 1.3],
                seed=[1, 2, 3],
                progress=False,
            )
    if size == 2:
        result["errors"] = split_errors(group, os.path.join(out, f"configs{rank}"))
        result["agreement"] = agreement(group)
        result["trees"] = trees(group)
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    group_exit.destroy_process_group()


# 6 of the 10 nodes 3 levels of 2 children make; a tree every step (on a CPU an Engine starts at the chain)
TREE = dict(num_draft_tokens=6, draft_topk=2, draft_depth=3, adaptive_depth=False)
TREE_CASES = ("qwen3_5", "deepseek_v3", "qwen3_5_draft")  # hybrid MTP head, MLA + NextN, hybrid draft LM


def trees(group) -> dict[str, dict[str, object]]:
    """Draft trees at TP = 2: greedy tokens of a hybrid MTP head, DeepSeek-V3's NextN head over the latent
    cache and a hybrid draft LM (per-node recurrent state on each rank's heads), random lanes, and the
    Qwen3.5 head with `broadcast_accepted` (every rank verifies rank 0's tree and commits rank 0's path)."""
    out: dict[str, dict[str, object]] = {}
    runs = [(case, {}) for case in TREE_CASES] + [("qwen3_5_broadcast", dict(broadcast_accepted=True))]
    for name, extra in runs:
        target, draft = pair(name.removesuffix("_broadcast"))
        step = fdecode.compile(target, draft, config(2, **TREE, **extra), tp_group=group)
        details = fdecode.generate(step, PROMPTS, max_new_tokens=NEW, eos_token_id=[], details=True, progress=False)
        out[name] = {
            "greedy": [d.tokens for d in details],
            "accepted": sum(d.metrics.drafts_accepted for d in details),
            "proposed": sum(d.metrics.drafts_proposed for d in details),
        }
        if name == "qwen3_5":
            out[name]["random"] = fdecode.generate(
                step, PROMPTS, max_new_tokens=NEW, eos_token_id=[], temperature=1.0, seed=[1, 2, 3], progress=False
            )
            report = fdecode.inspect(step, step.prefill(PROMPTS, max_new_tokens=NEW, eos_token_id=[]))
            out[name]["graph"] = (report.graph_count, report.graph_break_count, report.host_syncs)
            out[name]["collectives"] = {op: n for op, n in report.op_counts.items() if op.startswith("_c10d")}
    return out


LONG = list(range(1, 53))  # 52 tokens: with its budget it runs into max_seq_len 64


def agreement(group) -> dict[str, object]:
    """The cases where ranks could take different paths, in one Engine of GLM-4.5 + its MTP head at TP = 2
    (MoE; every depth 0 .. K runs: a recurrent target's Engine keeps K): greedy, random, grammar and
    near-max_seq_len lanes arriving staggered, with the adaptive depth free to choose
    (`warmup(depths=step.depths)`); and n-gram drafts beside a Qwen3.5 target. Every event, as each rank
    saw it."""
    from support.hand_grammar import HandGrammar

    target, draft = pair("glm4_moe")
    step = fdecode.compile(
        target, draft, config(2, max_grammar_states=8, max_grammar_transitions=64, sampling=True), tp_group=group
    )
    step.warmup(depths=step.depths)
    grammar = HandGrammar(
        {0: {t: 1 for t in range(0, 40, 2)}, 1: {t: 0 for t in range(1, 40, 2)}},
        final={0, 1},
        vocab_size=VOCAB,
        eos=(VOCAB - 1,),
    )
    engine = fdecode.Engine(step)
    requests = [
        (PROMPTS[0], dict(max_new_tokens=NEW)),
        (LONG, {}),
        (PROMPTS[1], dict(temperature=1.0, seed=5)),
        (PROMPTS[2], dict(grammar=grammar, max_new_tokens=NEW)),
        (PROMPTS[1], dict(max_new_tokens=NEW)),
    ]
    events, tick = [], 0
    while requests or engine.has_work():
        if requests and tick % 2 == 0:
            prompt, params = requests.pop(0)
            engine.add_request(prompt, fdecode.SamplingParams(eos_token_id=[], **params))
        events += [(e.request_id, e.new_tokens, e.finished, e.reason) for e in engine.step()]
        tick += 1
    ngram = fdecode.compile(pair("qwen3_5")[0], "ngram", config(2), tp_group=group)
    return {
        "events": events,
        "launches": dict(engine.policy.launches),
        "ngram": fdecode.generate(ngram, PROMPTS, max_new_tokens=NEW, eos_token_id=[], progress=False),
    }


def split_errors(group, folder: str) -> dict[str, str]:
    """What compile says of checkpoint folders holding a config.json and no weights whose split does not
    divide by 2: the message, which must come before any weight is read (there is none to read)."""
    import transformers

    from support import deepseek_models, hybrid_models

    configs = {
        "num_kv_heads": hybrid_models.hf_config(
            hybrid_models.PATTERNS["full-lin-lin-full"], vocab_size=VOCAB, num_key_value_heads=1
        ),
        "linear_num_key_heads": hybrid_models.hf_config(
            hybrid_models.PATTERNS["full-lin-lin-full"],
            vocab_size=VOCAB,
            linear_num_key_heads=1,
            linear_num_value_heads=2,
        ),
        "moe_intermediate_size": deepseek_models.hf_config(vocab_size=VOCAB, moe_intermediate_size=15),
        "shared_expert_intermediate_size": hybrid_models.hf_config(
            hybrid_models.PATTERNS["full-lin-lin-full"],
            transformers.Qwen3_5MoeTextConfig,
            vocab_size=VOCAB,
            **{**hybrid_models.MOE, "shared_expert_intermediate_size": 25},
        ),
    }
    errors = {}
    for name, hf_config in configs.items():
        path = os.path.join(folder, name)
        os.makedirs(path, exist_ok=True)
        hf_config.to_json_file(os.path.join(path, "config.json"))
        try:
            fdecode.compile(path, "ngram", config(2), tp_group=group)
            errors[name] = "no error"
        except Exception as err:
            errors[name] = f"{type(err).__name__}: {err}"
    return errors


def run_rank_inductor(rank: int, port: int, out: str) -> None:
    """Qwen3.5 with its MTP head at TP = 2 through Inductor (greedy graph): its tokens and what
    `fdecode.inspect` sees on the rank."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300)
    )
    target, draft = pair("qwen3_5")
    step = fdecode.compile(
        target, draft, config(2, backend="inductor", sampling=False, adaptive_depth=False), tp_group=dist.group.WORLD
    )
    greedy = fdecode.generate(step, PROMPTS, max_new_tokens=NEW, eos_token_id=[], progress=False)
    report = fdecode.inspect(step, step.prefill(PROMPTS, max_new_tokens=NEW, eos_token_id=[]))
    result = {
        "greedy": greedy,
        "backend": step.backend,
        "graph_count": report.graph_count,
        "graph_break_count": report.graph_break_count,
        "host_syncs": report.host_syncs,
        "op_counts": report.op_counts,
    }
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    group_exit.destroy_process_group()


def run_rank_4(rank: int, port: int, out: str) -> None:
    run_rank(rank, port, out, cases=("qwen3_5",), size=4)
