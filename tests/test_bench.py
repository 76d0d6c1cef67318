"""`fdecode bench --quick` runs end to end and its JSON has every field."""

from __future__ import annotations

import json

import pytest
from support.llama_models import fdecode_target, hf_greedy, independent_draft
from support.ngram_steps import grounded_prompts, ngram_step

from fdecode.bench import Result, main

SYSTEMS = {"target-only", "before", "fdecode-eager", "fdecode", "hf-generate", "hf-assisted"}


@pytest.mark.slow
def test_quick_bench_writes_every_field(tmp_path, capsys):
    out = tmp_path / "bench.json"
    # dynamo and one random-model workload: this checks the bench's rows and fields (every workload runs
    # the same `run_workload`); Inductor's code is checked by the lossless tests.
    argv = ["--quick", "--backend", "dynamo", "--workloads", "draft=target", "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    fields = set(Result.__dataclass_fields__)
    for row in data["results"]:
        assert set(row) == fields
        assert row["tokens_per_s"] > 0 and row["step_ms"] > 0
    assert {r["system"] for r in data["results"]} == SYSTEMS
    (ours,) = [r for r in data["results"] if r["system"] == "fdecode"]
    assert ours["floor_ms"] > 0 and ours["overhead"] < 1
    # draft == target: every draft is accepted, K + 1 tokens per lane-step (the bench's own check of outputs
    # against target-only already passed, or main() would have raised).
    assert ours["workload"] == "draft=target" and ours["tokens_per_step"] > 2.5
    assert "| fdecode |" in capsys.readouterr().out


@pytest.mark.slow
def test_profile_writes_traces_and_a_timeline(tmp_path, capfd):
    """On the bundled model with its MTP head: both rows hold the same iterations, per-token times are
    printed, and the profiler's start/stop lines (C++, on fd 2) do not get out."""
    from fdecode.profile import main as profile_main

    # dynamo (capture only): the traces and the timeline are the concern here, not Inductor's code.
    assert profile_main(["--out", str(tmp_path), "--iterations", "3", "-k", "2", "--backend", "dynamo"]) == 0
    counts = {}
    for name, label in (("before.json", "before/validate"), ("fdecode.json", "fdecode/step")):
        trace = json.loads((tmp_path / name).read_text())
        counts[name] = sum(e.get("name") == label and e.get("ph") == "X" for e in trace["traceEvents"])
    assert counts == {"before.json": 3, "fdecode.json": 3}, counts
    png = (tmp_path / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    out, err = capfd.readouterr()
    assert "host round trip" in out and "fdecode step" in out and out.count("ms per token") == 2
    assert "3 iterations each" in out and "MTP head" in out
    assert "profiler_start" not in err and "Completed Stage" not in err, err


def test_loops_survive_graph_replays_that_reuse_their_output_buffers(monkeypatch):
    """A CUDA-graph replay returns the same output tensors every call, overwritten in place. The bench's
    device-resident loop and the target-only baseline keep outputs across calls, so they must copy them,
    and the Engine must have copied a step's output before it launches the next: simulated here by making
    every call of the captured functions write into one persistent buffer."""
    from support.llama_models import fdecode_target, independent_draft

    import fdecode
    from fdecode.baseline import TargetOnly
    from fdecode.bench import fdecode_loop
    from fdecode.state import StepOutput

    def replay_like(fn, pick, rebuild):
        buffer = []

        def call(*args):
            result = fn(*args)
            out = pick(result)
            if not buffer:
                buffer.append(out.clone())
            buffer[0].copy_(out)
            return rebuild(result, buffer[0])

        return call

    target = fdecode_target(2)
    # Eager: the replays are simulated around each graph's runs (`graph_set.run`), so no compile is needed.
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=64, block_size=4, backend="eager")
    prompts = [[5, 17, 33, 2, 9], [7, 3]]
    honest = fdecode.compile(target, independent_draft("partial", target), cfg)
    expected, steps = fdecode_loop(honest, prompts, 16)
    assert fdecode_loop(honest, prompts, 16, steps)[0] == expected

    replaying = fdecode.compile(target, independent_draft("partial", target), cfg)
    real_run, graphs = replaying.graph_set.run, {}

    def run(state, blocks, key, **kw):  # one "recorded graph" per window and key, as the step keeps them
        if (blocks, key) not in graphs:
            graphs[blocks, key] = replay_like(
                lambda state: real_run(state, blocks, key, **kw),
                lambda r: r[1].packed,
                lambda r, packed: (r[0], StepOutput(packed)),
            )
        return graphs[blocks, key](state)

    monkeypatch.setattr(replaying.graph_set, "run", run)
    assert fdecode_loop(replaying, prompts, 16, steps)[0] == expected  # device-resident: outputs read at the end
    assert fdecode.generate(replaying, prompts, max_new_tokens=16, progress=False) == expected  # the Engine's reads

    baseline = TargetOnly(honest, backend="eager")
    want = baseline.generate(prompts, max_new_tokens=12)
    # `next_token` returns (token, recurrent state): the token is the replayed output.
    baseline.next_token = replay_like(baseline.next_token, lambda r: r[0], lambda r, token: (token, r[1]))
    assert baseline.generate(prompts, max_new_tokens=12) == want


def test_bench_writes_no_file_unless_asked_and_shows_one_target_only_figure(tmp_path, monkeypatch, capsys):
    """Rows over one target (every K, both workloads) show one target-only measurement; no bench.json
    lands in the working directory without --json."""
    monkeypatch.chdir(tmp_path)
    args = [
        "--batch",
        "1",
        "-k",
        "1",
        "2",
        "--new-tokens",
        "8",
        "--reps",
        "1",
        "--target",
        "64x2",
        "--draft",
        "64x1",
        "--vocab",
        "256",
        "--no-hf",
        "--backend",
        "eager",
        "--workloads",
        "random-draft",
        "draft=target",
    ]
    assert main(args) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if "| target-only |" in line]
    assert len(rows) == 4 and len({row[5] for row in rows}) == 1  # tok/s (min-max), ms/step
    assert list(tmp_path.iterdir()) == []
    assert main([*args[:-1], "--json", "out.json"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_transformers_copies_of_a_target_with_an_mtp_head_load_without_a_report(monkeypatch, caplog):
    """The bench's transformers pair leaves the MTP head out: no "UNEXPECTED mtp.*" load report."""
    import logging

    from fdecode.bench import hf_pair, llama
    from fdecode.models import MTPHead

    target, draft = llama(256, 64, 2, seed=1), llama(256, 64, 1, seed=2)
    target.mtp = MTPHead.random(target.config, seed=3).bind(target)
    logger = logging.getLogger("transformers")  # its own handler, which pytest's capture does not see
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, caplog.handler])
    hf_target, _ = hf_pair(target, draft)
    assert "UNEXPECTED" not in caplog.text and "mtp" not in caplog.text
    assert not any(name.startswith("mtp") for name in hf_target.state_dict())


def test_the_pair_goals_take_ratios_round_by_round():
    """`fdecode.bench.pair.goal_markdown`: a machine twice as slow in the second round moves both systems'
    medians, but not their ratio within a round (`paired_ratio`)."""
    from fdecode.bench.pair import goal_markdown
    from fdecode.bench.timing import paired_ratio

    assert paired_ratio([1.0, 2.0, 1.1], [1.0, 2.2, 1.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="same rounds"):
        paired_ratio([1.0], [1.0, 2.0])

    def row(system, rounds):  # 64 tokens a run; tokens/s from the median round, as `run_pair_workload`'s rows
        med = sorted(rounds)[len(rounds) // 2]
        return Result(
            "qwen-coder[text]",
            system,
            1,
            4,
            64 / med,
            64 / max(rounds),
            64 / min(rounds),
            1.0,
            2.0,
            extra={"round_seconds": rounds},
        )

    rows = [
        row("fdecode", [10.0, 21.0, 12.0]),
        row("fdecode depth 3", [9.0, 22.0, 13.0]),
        row("fdecode depth 1", [12.0, 24.0, 13.0]),
        row("target-only", [14.0, 30.0, 16.0]),
    ]
    table = goal_markdown(rows)
    # vs target-only: medians 16 / 12 s, rounds 14/10, 30/21, 16/12: median 1.4; vs depth 3 (the best median):
    # medians 13 / 12 s, rounds 9/10, 22/21, 13/12: median 1.048
    assert "| qwen-coder[text] |  | 1.333x (1.400x) | 1.083x (1.048x) | fdecode depth 3 |" in table
    assert goal_markdown([r for r in rows if r.system != "fdecode"]) == ""


@pytest.mark.slow
def test_host_time_splits_the_step_at_the_compiled_code(tmp_path, capsys):
    """`--workloads host-time --quick`: the small pair at B = 1, under Inductor (the split is read from
    Inductor's own profiler range around its compiled graph, which no other backend has)."""
    out = tmp_path / "host.json"
    assert main(["--quick", "--workloads", "host-time", "--backend", "inductor", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["host"]
    assert (row["model"], row["batch"], row["backend"], row["threads"]) == ("micro", 1, "inductor", 1)
    assert row["step_ms"] > 0 and row["cpu_ms"] > 0 and row["inside_ms"] > 0 and row["outside_ms"] > 0
    assert (
        0 < row["outside_share"] < 1 and 0 < row["cpu_outside_share"] < 1 and row["device_idle"] is None
    )  # no device apart from the host here
    assert row["engine_ms"] > 0 and row["engine_cpu_ms"] > 0 and row["engine_own_cpu_ms"] < row["engine_cpu_ms"]
    assert "| micro | 1 | inductor | 1 |" in capsys.readouterr().out


def test_engine_run_at_depth_k_launches_k_alone_and_asks_for_no_other_graph(monkeypatch):
    """`engine_run(adaptive=False)`, the benches' "Engine depth K", is the Engine of an `adaptive_depth=False` step:
    every launch at K, an n-gram step's too (its gate paused where no draft matched), a CPU tree step's (whose
    first depth is its chain of S), and no other depth's graph made in the background meanwhile."""
    import fdecode
    from fdecode.bench.loops import engine_run
    from fdecode.graphs import background

    monkeypatch.setenv(background.ENV, "1")
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=6, draft_topk=2, draft_depth=3, max_batch=4, max_seq_len=64, block_size=4, backend="eager"
    )
    tree = fdecode.compile(target, independent_draft("partial", target), cfg)
    prompts = [list(p) for p in grounded_prompts()]
    for step in (ngram_step(), tree):
        outs, _, info = engine_run(step, prompts, 12, adaptive=False)
        assert set(info["depths_launched"]) == {step.config.K}, info
        assert outs == [hf_greedy(tuple(p), 12) for p in prompts]
        assert step.graph_set.background.wait(timeout=60) and step.graph_set.background.made == []
