"""Cold compile cost of each sampling plan's graph at V = 151,936, against the greedy-only graph's.

    python bench/compile_cost.py                 # B = 1 and 8, the three graphs, one fresh process each
    python bench/compile_cost.py --batch 8 --plans greedy-only full+top_p

The models and shapes of `fdecode bench --workloads real-vocab` (target 256x4, draft 128x1, K = 3).
Every measurement runs in a fresh process with the inductor caches off
(TORCHINDUCTOR_FORCE_DISABLE_CACHES=1), after an untimed compile of a small unrelated function (so
one-time start-up work, imports and the precompiled header, is paid by no plan). It times the first
`step(state)` of the plan: tracing, lowering, code generation and the C++ builds. Two figures each:

- wall seconds;
- CPU seconds of the process and its children. Kernels are built one at a time in child compilers
  (TORCHINDUCTOR_COMPILE_THREADS=1), so their CPU time is counted. CPU time is the figure that stays
  put when other work shares the machine; wall time does not.

The ratio of each plan to the greedy-only graph of the same batch is printed, with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

PLANS = {
    "greedy-only": (False, {}),
    "candidates": (True, dict(temperature=0.7, top_p=0.8, top_k=20)),
    "full+top_p": (True, dict(temperature=1.0, top_p=0.95)),
}


def _measure(batch: int, plan: str) -> dict:
    """Runs in the child process: one cold compile of `plan`'s graph at batch `batch`."""
    import resource
    import time

    import torch

    import fdecode
    from fdecode.bench import llama
    from fdecode.bench.sampling import VOCAB

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    torch.compile(lambda x: (x * 2).softmax(-1))(torch.randn(4, 8))  # start-up work, untimed
    target, draft = llama(VOCAB, 256, 4, seed=1), llama(VOCAB, 128, 1, seed=2)
    k, budget = 3, 33
    sampling, params = PLANS[plan]
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=k, max_batch=batch, max_seq_len=16 + batch + budget + 2 * (k + 1), sampling=sampling
    )
    step = fdecode.compile(target, draft, cfg)
    seeds = dict(seed=list(range(batch))) if params else {}
    state = step.prefill(
        [list(range(1 + lane, 17 + lane)) for lane in range(batch)], max_new_tokens=budget, **params, **seeds
    )
    chosen = step.plan_for(state).name
    cpu0, wall0 = cpu(), time.perf_counter()
    step(state)
    return dict(batch=batch, plan=plan, graph=chosen, wall_s=time.perf_counter() - wall0, cpu_s=cpu() - cpu0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--plans", nargs="+", default=list(PLANS), choices=list(PLANS))
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_measure(int(args.child[0]), args.child[1])))
        return
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1", TORCHINDUCTOR_COMPILE_THREADS="1")
    rows = []
    for batch in args.batch:
        for plan in args.plans:
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(batch), plan],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            row = json.loads(out.strip().splitlines()[-1])
            row["load"] = os.getloadavg()[0]
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print("| B | graph | wall s | CPU s | wall x greedy-only | CPU x greedy-only | load (1 min) |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        base = next((r for r in rows if r["batch"] == row["batch"] and r["plan"] == "greedy-only"), None)
        ratio = (lambda key: f"{row[key] / base[key]:.2f}") if base else (lambda key: "")
        print(
            f"| {row['batch']} | {row['plan']} ({row['graph']}) | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | "
            f"{ratio('wall_s')} | {ratio('cpu_s')} | {row['load']:.1f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
