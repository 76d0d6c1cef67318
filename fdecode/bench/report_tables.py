"""Markdown tables of the result files in bench/results/, one renderer per kind of file (`fdecode.bench.report`
assembles them into BENCHMARKS.md). Every figure a table shows is read from its file or computed from what the
file holds (ratios, medians, geometric means); nothing is typed in here.

Kinds: `fdecode bench --json` files (`results`: tokens per second; `sampling`: step time against a baseline
system; `acceptance`: drafts accepted under a grammar; `tables`: the rows of the workloads with a table of their
own, `fdecode.bench.registry`, rendered by `rows`), the real pair's per-prompt summary over several
`fdecode bench` files, and the JSON of the scripts in bench/ (cold_start, step_phases, depth_policy,
seed_batch, tp_memory, tp_step, tree_acceptance).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from fdecode.bench.results import Result, markdown, rate

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def load(name: str):
    return json.loads((RESULTS / name).read_text())


def table(header: list[str], rows: list[list]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]


def speeds(name: str, workloads: tuple[str, ...] = (), systems: tuple[str, ...] = ()) -> list[str]:
    """`fdecode bench`'s own table of the file's tokens-per-second rows (optionally some workloads / systems). A row
    that repeats an earlier one but for its workload (the target alone, run once for the workloads of one model)
    is shown once."""
    rows, seen = [], set()
    for r in load(name)["results"]:
        if (workloads and r["workload"].split("[")[0] not in workloads) or (systems and r["system"] not in systems):
            continue
        figures = repr({key: value for key, value in r.items() if key != "workload"})
        if figures not in seen:
            seen.add(figures)
            rows.append(Result(**r))
    return markdown(rows).splitlines()


def versus(name: str, systems: tuple[str, ...]) -> list[str]:
    """One row per workload of a `fdecode bench` file: tok/s of each of `systems` (the fdecode one's tokens per
    lane-step beside it), and fdecode's ratio to each other system."""
    by: dict[str, dict[str, dict]] = {}
    for r in load(name)["results"]:
        by.setdefault(r["workload"], {})[r["system"]] = r
    others = [system for system in systems if system != "fdecode"]
    rows = []
    for workload, of in by.items():
        ours = of["fdecode"]
        cells = [rate(of[system]["tokens_per_s"]) for system in others]
        mine = f"{rate(ours['tokens_per_s'])} ({ours['tokens_per_step']:.2f})"
        ratios = [f"{ours['tokens_per_s'] / of[system]['tokens_per_s']:.2f}x" for system in others]
        rows.append([workload, *cells, mine, *ratios])
    header = [f"{system} tok/s" for system in others] + ["fdecode tok/s (tok/lane-step)"]
    return table(["workload", *header, *(f"fdecode / {system}" for system in others)], rows)


def step_times(name: str, batches: tuple[int, ...] = (), workloads: tuple[str, ...] = ()) -> list[str]:
    """The file's step-time rows (`sampling`; optionally some batches / workloads): each system against the run's
    baseline system."""
    rows = [
        [
            r["workload"],
            r["batch"],
            r["system"],
            r["plan"],
            f"{r['step_ms']:.2f} ({r['step_ms_min']:.2f}-{r['step_ms_max']:.2f})",
            f"{r['ratio']:.2f}x",
        ]
        for r in load(name)["sampling"]
        if (not batches or r["batch"] in batches) and (not workloads or r["workload"] in workloads)
    ]
    return table(["workload", "B", "system", "plan", "ms/step (min-max)", "x baseline"], rows)


def rows(name: str, workload: str) -> list[str]:
    """The file's rows of a workload with a table of its own (acceptance, depths, context, prefill, moe-experts,
    ttft: `fdecode.bench.registry`), in that workload's own table."""
    from fdecode.bench.registry import markdown as workload_markdown

    return workload_markdown(workload, load(name)["tables"][workload]).splitlines()


def acceptance(name: str) -> list[str]:
    """Drafts accepted per verified step with and without a grammar (`acceptance` rows)."""
    rows = [
        [r["model"], r["prompt"], r["grammar"], r["tokens"], f"{r['accepted_per_step']:.2f}", r["parses"]]
        for r in load(name)["acceptance"]
    ]
    return table(["model", "prompt", "grammar", "tokens", "tokens / verified step", "output parses"], rows)


def _by_system(names: tuple[str, ...]) -> dict[str, dict[str, dict]]:
    """{prompt: {system: row}} over `fdecode bench` files of the qwen-coder workloads."""
    out: dict[str, dict[str, dict]] = {}
    for name in names:
        for r in load(name)["results"]:
            prompt = r["workload"].split("[")[1].rstrip("]")
            out.setdefault(prompt, {})[r["system"]] = r
    return out


def launched(row: dict) -> str:
    return ", ".join(f"{d} x {n}" for d, n in sorted(row["extra"].get("depths_launched", {}).items()))


def real_pair(names: tuple[str, ...]) -> tuple[list[str], float]:
    """The real pair at batch 1: tok/s of every system per prompt, the default config's ratios, and the
    geometric mean of the default against transformers' assisted generation."""
    prompts = _by_system(names)
    speed, ratios, against = [], [], []
    for prompt, sys in prompts.items():
        default = sys["fdecode"]
        depths = [sys[f"fdecode depth {d}"]["tokens_per_s"] for d in range(1, 5)]
        spread = f"({rate(default['tokens_per_s_min'])}-{rate(default['tokens_per_s_max'])})"
        speed.append(
            [prompt, rate(sys["target-only"]["tokens_per_s"]), *map(rate, depths)]
            + [f"**{rate(default['tokens_per_s'])}** {spread}", rate(sys["hf-generate"]["tokens_per_s"])]
            + [rate(sys["hf-assisted"]["tokens_per_s"]), launched(default)]
        )
        assisted = default["tokens_per_s"] / sys["hf-assisted"]["tokens_per_s"]
        against.append(assisted)
        ratios.append(
            [
                prompt,
                f"**{assisted:.2f}x**",
                f"{default['tokens_per_s'] / sys['hf-generate']['tokens_per_s']:.2f}x",
                f"{default['tokens_per_s'] / sys['target-only']['tokens_per_s']:.2f}x",
                f"{default['tokens_per_s'] / max(depths):.2f}x (depth {1 + depths.index(max(depths))})",
            ]
        )
    header = ["prompt", "target-only", "depth 1", "depth 2", "depth 3", "depth 4", "**default**"]
    lines = table(header + ["transformers", "transformers assisted", "default launched (depth x steps)"], speed)
    lines += ["", *table(["prompt", "vs assisted", "vs transformers", "vs target-only", "vs best fixed depth"], ratios)]
    return lines, statistics.geometric_mean(against)


def real_pair_batch(name: str) -> tuple[list[str], float]:
    rows = {r["system"]: r for r in load(name)["results"]}
    lines = table(
        ["system", "tok/s", "launched (depth x steps)"],
        [[s, rate(r["tokens_per_s"]), launched(r)] for s, r in rows.items()],
    )
    return lines, rows["fdecode"]["tokens_per_s"] / rows["hf-generate"]["tokens_per_s"]


def cold_starts(name: str, revision: str) -> list[str]:
    """Median first-token seconds per workload, cold and warm, of one revision's fresh processes."""
    groups: dict[tuple, list[float]] = {}
    for r in load(name)["runs"]:
        if r["revision"] == revision and r["workload"] != "qwen-coder":  # (the pair: `default_first_calls`)
            groups.setdefault((r["workload"], r["layers"], r["start"]), []).append(r["first_step_s"])
    keys = sorted({(w, n) for w, n, _ in groups}, key=lambda k: (k[0] != "qwen-coder", k[1]))
    rows = []
    for w, n in keys:
        cold, warm = groups.get((w, n, "cold"), []), groups.get((w, n, "warm"), [])
        what = "Qwen2.5-Coder 1.5B + 0.5B" if w == "qwen-coder" else f"random Llama, {n} layers + 2-layer draft"
        rows.append([what, f"{statistics.median(cold):.1f} ({len(cold)})", f"{statistics.median(warm):.1f}"])
    return table(["model (K = 4, B = 1, regions)", "cold s (runs)", "warm s"], rows)


def warmups(name: str) -> list[str]:
    rows = [[r["start"], r["graphs"], f"{r['warmup_s']:.1f}"] for r in load(name)["bench_cold_start_py_warmup"]]
    return table(["start", "graphs", "`step.warmup()` s"], rows)


def step_phases(name: str) -> list[str]:
    d = load(name)
    m, floor, k = d["measured_s"], d["floor_s"], d["k"]
    rows = [
        [f"target verify, {k + 1} rows", f"{1e3 * m['target_verify_packed']:.0f}"]
        + [f"{1e3 * m['target_verify_unpacked']:.0f}", f"{1e3 * floor['target']:.0f}"],
        ["draft forward, 1 row", f"{1e3 * m['draft_forward_packed']:.0f}"]
        + [f"{1e3 * m['draft_forward_unpacked']:.0f}", f"{1e3 * floor['draft']:.0f}"],
        [
            f"whole step (median of {d['steps']})",
            f"{1e3 * m['compiled_step']:.0f}",
            "",
            f"{1e3 * d['step_floor_s']:.0f}",
        ],
    ]
    header = ["compiled as the step compiles it", "ms (packed weights)", "ms (weights as they lie)"]
    lines = table(header + [f"floor ms (bytes / {d['bandwidth_gb_s']:.1f} GB/s)"], rows)
    t = d["tokens_per_s"]
    lines += [
        "",
        f"{d['mean_accepted']:.2f} tokens per step: {t['compiled']:.2f} tok/s compiled, {t['floor']:.2f} at the "
        f"floor; the target alone at its floor {t['target_only_floor']:.2f} tok/s.",
    ]
    return lines


def replay(name: str) -> list[str]:
    d = load(name)
    rows, ratios = [], []
    for r in d["rows"]:
        fixed = r["fixed_tokens_per_s"]
        best = fixed[r["best_depth"]]
        ratios.append(r["tokens_per_s"] / best)
        rows.append(
            [r["sequence"], f"{r['tokens_per_s'] / fixed[0]:.2f}x", f"{ratios[-1]:.3f}x (depth {r['best_depth']})"]
        )
    rows.append(["**geometric mean**", "", f"**{statistics.geometric_mean(ratios):.3f}x**"])
    return table(["sequence", "vs target-only (depth 0)", "vs best fixed depth >= 1"], rows)


def seed_batches(names: tuple[str, ...]) -> list[str]:
    """Per configuration, the requests that differ alone and batched, by temperature and dtype (one count per
    file that ran it)."""
    cells: dict[str, dict[str, list[str]]] = {}
    for name in names:
        d = load(name)
        a = d["args"]
        dtype = "bf16" if a["dtype"] == "auto" else a["dtype"]
        for r in d["results"]:
            differ = sum(q.get("diverge") is not None for q in r["requests"])
            column = f"T = {a['temperature']}, {dtype}"
            cells.setdefault(r["config"], {}).setdefault(column, []).append(f"{differ}/{len(r['requests'])}")
    columns = list(dict.fromkeys(column for by in cells.values() for column in by))
    rows = [[config, *(", ".join(by.get(column, ["-"])) for column in columns)] for config, by in cells.items()]
    return table(["requests that differ alone and batched", *columns], rows)


def tp_memory(name: str) -> list[str]:
    rows = []
    for m in load(name):
        cells = [f"{r['rank_gib']:.2f} GiB ({r['ratio']:.3f}x)" for r in m["ranks"].values()]
        sizes = ", ".join(f"TP = {s}" for s in m["ranks"])
        rows.append([m["model"], f"{m['tp1_gib']:.2f} GiB", sizes, " / ".join(cells)])
    return table(["model (bf16, shapes only)", "TP = 1", "sizes", "per rank"], rows)


def tp_step(name: str) -> list[str]:
    d = load(name)
    rows = [[r["tp"], r["backend"], f"{r['step_ms']:.1f}", f"{r['tokens_per_step']:.2f}"] for r in d["rows"]]
    lines = table(["TP", "backend", "ms/step", "tokens/step"], rows)
    return lines + ["", f"Tokens identical at TP = 1 and 2: {d['tokens_identical']}."]


def default_first_calls(names: dict[str, str]) -> list[str]:
    """The plain path's first call per start (`bench/default_path.py` files, start -> file)."""
    rows = []
    for start, name in names.items():
        r = load(name)
        depths = ", ".join(f"{d}: {n}" for d, n in sorted(r["first_stream_depths"].items()))
        rows.append(
            [
                start,
                f"{r['compile_call_s']:.1f}",
                f"{r['first_token_s']:.1f}",
                f"{r['first_stream_rest_s']:.1f} ({depths})",
                f"{r['background_wait_s']:.1f}",
                f"{r['peak_gb']:.2f} ({r['peak_gb'] / r['weights_gb']:.2f}x)",
            ]
        )
    header = ["start", "`compile` s", "first token s", "next 63 tokens s (launches per depth)"]
    return table([*header, "other depths' graphs, s more", "peak GB (x weights)"], rows)


def default_rounds(name: str) -> tuple[list[str], float]:
    """Per prompt: target-only, the default Engine, depth K alone and transformers' assisted generation (tok/s,
    ratios of the interleaved rounds), and the geometric mean of the default against assisted."""
    prompts, rows = load(name)["prompts"], []
    for prompt, s in prompts.items():
        depth_k = next(system for system in s if system.startswith("depth"))
        launched = ", ".join(f"{d}: {n}" for d, n in sorted(s["default"]["depths_launched"].items()))
        rows.append(
            [
                prompt,
                f"{s['target-only']['tok_s']:.2f}",
                f"{s['default']['tok_s']:.2f} ({s['default']['vs_target_only']:.2f}x)",
                f"{s[depth_k]['tok_s']:.2f} ({s[depth_k]['vs_target_only']:.2f}x)",
                f"{s['hf-assisted']['tok_s']:.2f}",
                f"{s['default']['vs_hf_assisted']:.2f}x",
                launched,
            ]
        )
    geomean = statistics.geometric_mean(s["default"]["vs_hf_assisted"] for s in prompts.values())
    header = ["prompt", "target-only tok/s", "default tok/s (x target-only)", "depth 4 alone", "assisted tok/s"]
    return table([*header, "default / assisted", "default's launches per depth"], rows), geomean


def tree_acceptance(*names: str) -> list[str]:
    """Greedy tokens per verify of chains and draft trees (`bench/tree_acceptance.py --json`, one file per run
    length), the mean over each file's prompts: a row per new tokens, depth S and node count N, a column per k
    (the chain: k = 1, N = S), each tree against the chain of its depth in its run (the ratio of the means), and
    the row's best tree against the chain as the geometric mean of the per-prompt ratios."""
    chains: dict[tuple[int, int], list[float]] = {}
    cells: dict[tuple[int, int, int], dict[int, list[float]]] = {}
    for name in names:
        run = load(name)
        tokens = run["settings"]["new_tokens"]
        for r in run["rows"]:
            if r["k"] == 1:
                chains[tokens, r["s"]] = r["per_prompt"]
            cells.setdefault((tokens, r["s"], r["n"]), {})[r["k"]] = r["per_prompt"]
    ks = sorted({k for by_k in cells.values() for k in by_k})
    lines = []
    for (tokens, s, n), by_k in sorted(cells.items()):
        chain = statistics.mean(chains[tokens, s])
        means = {k: statistics.mean(per) for k, per in by_k.items()}
        shown = [f"{means[k]:.2f}" + (f" ({means[k] / chain:.2f}x)" if k > 1 else "") if k in means else "" for k in ks]
        trees = [k for k in by_k if k > 1]
        geomean = ""
        if trees:
            best = by_k[max(trees, key=means.__getitem__)]
            ratios = [a / b for a, b in zip(best, chains[tokens, s], strict=True)]
            geomean = f"{statistics.geometric_mean(ratios):.2f}x"
        lines.append([tokens, s, n, *shown, geomean])
    header = ["tokens", "depth S", "nodes N", *(f"k = {k}" + (" (the chain)" if k == 1 else "") for k in ks)]
    return table([*header, "best tree / chain, geomean of prompts"], lines)
