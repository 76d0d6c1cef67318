"""Step graphs kept on disk (`fdecode.graphs.stored`): a second process loads the compiled step instead of
tracing it, the key changes with whatever the graph is compiled from, and a file that cannot serve is
compiled afresh with a one-line notice."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
from support.kernel_files import kernel_files

import fdecode
from fdecode.bench import llama
from fdecode.graphs.backends import capture
from fdecode.graphs.graph_key import GraphKey
from fdecode.graphs.pure import pure_step
from fdecode.graphs.stored import StoredGraph, cache_dir, graph_key, serializable_guards

# A fresh process: a random 2-layer target (weights from argv[2]) with a 1-layer draft, Inductor, six steps
# of two lanes across windows; prints its tokens, the eager step's tokens, the graphs Dynamo traced and
# how each step graph came to be (loaded or compiled), and whether Inductor built or loaded its base
# vector-ISA probe (`fdecode.backends.cpu.vec_isa` trusts the CPU's flags instead).
CHILD = """
import dataclasses, json, sys, torch
import fdecode
from fdecode.bench import llama
from torch._dynamo.utils import counters
from torch._inductor.cpu_vec_isa import VecISA
probed, check_build = [], VecISA.check_build
VecISA.check_build = lambda isa, code: probed.append(code == VecISA._avx_code) or check_build(isa, code)
seed = int(sys.argv[1])
target, draft = llama(512, 64, 2, seed=seed), llama(512, 64, 1, seed=seed + 1)
cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=2, max_seq_len=64, block_size=8, sampling=False)

def run(step):
    state = step.prefill([list(range(3, 20)), list(range(40, 44))], max_new_tokens=30)
    tokens = []
    for _ in range(6):
        state, out = step(state)
        tokens.append(out.packed.tolist())
    return step, tokens

step, tokens = run(fdecode.compile(target, draft, cfg))
traced = counters["stats"]["unique_graphs"]
_, eager = run(fdecode.compile(target, draft, dataclasses.replace(cfg, backend="eager")))
# A second step of the same layout in this process (its graph a function of its own): it loads the file.
again, _ = run(fdecode.compile(llama(512, 64, 2, seed=seed + 7), llama(512, 64, 1, seed=seed + 8), cfg))
print(json.dumps({"tokens": tokens, "eager": eager, "traced": traced, "base_probes": sum(probed),
                  "loaded": [g.loaded for g in step.graphs.values()],
                  "again_loaded": [g.loaded for g in again.graphs.values()],
                  "again_traced": counters["stats"]["unique_graphs"] - traced}))
"""


def run_child(seed: int, env: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(seed)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr}


@pytest.mark.slow
def test_a_second_process_loads_the_compiled_step_and_traces_nothing(tmp_path) -> None:
    """The first process compiles the step and keeps its graphs, naming the folder; a second step of the same
    layout in that process, and a second process, each with other weights, say they load the file and load
    it: Dynamo traces nothing, no kernel is built again, and the tokens are the eager step's on those weights."""
    env = {
        **os.environ,
        "FDECODE_CACHE_DIR": str(tmp_path / "steps"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "OMP_NUM_THREADS": "1",
    }
    first = run_child(0, env)
    built = kernel_files(tmp_path / "inductor")
    assert built["batched"] and not built["single"]  # its kernels built a few to a library
    assert first["tokens"] == first["eager"]
    assert first["traced"] >= 1 and not any(first["loaded"])
    assert first["base_probes"] == 0  # neither compiled nor loaded in a child process
    steps = tmp_path / "steps"
    compiled, loaded = first["stderr"].split("loading the compiled decode step", 1)  # first compiles, then loads
    assert f"then kept in {steps}" in compiled and "loading" not in compiled
    assert loaded.startswith(" (inductor, greedy sampling plan") and str(steps) in loaded
    assert "compiling the decode step" not in loaded
    assert first["again_loaded"] and all(first["again_loaded"]) and first["again_traced"] == 0
    stored = sorted(p.name for p in steps.iterdir())
    assert stored and all(name.endswith(".step") for name in stored)
    second = run_child(1, env)
    assert second["tokens"] == second["eager"] != first["tokens"]  # other weights, other tokens, still exact
    assert second["traced"] == 0 and second["loaded"] and all(second["loaded"])
    assert second["base_probes"] == 0
    assert sorted(p.name for p in (tmp_path / "steps").iterdir()) == stored  # nothing new written
    assert kernel_files(tmp_path / "inductor") == built  # its kernels loaded, none built again


def test_the_key_follows_what_the_graph_is_compiled_from(monkeypatch, tmp_path) -> None:
    """Config, plan, depth, window, the models' layout (layers, dtype, tied weights) each give another key;
    other weight values of the same layout give the same key. Off, or a backend other than Inductor:
    nothing is stored."""
    monkeypatch.setenv("FDECODE_CACHE_DIR", str(tmp_path))
    target, draft = llama(512, 64, 2, seed=0), llama(512, 64, 1, seed=1)
    cfg = fdecode.DecodeConfig(num_draft_tokens=3, max_batch=2, max_seq_len=64, block_size=8, sampling=False)
    step = fdecode.compile(target, draft, cfg, announce=False)
    plan = step.plans[0]

    def key(s=step, blocks=8, depth=None) -> str:
        return graph_key(
            pure_step(s.target, s.draft, s.config, GraphKey(blocks, plan, 3 if depth is None else depth)), "inductor"
        )

    base = key()
    assert key() == base and len(base) == 32
    assert key(fdecode.compile(llama(512, 64, 2, seed=5), llama(512, 64, 1, seed=6), cfg)) == base
    others = [
        key(blocks=4),
        key(depth=1),
        key(fdecode.compile(target, draft, dataclasses.replace(cfg, max_batch=3))),
        key(fdecode.compile(llama(512, 64, 3, seed=0), draft, cfg)),
        key(fdecode.compile(llama(512, 64, 2, seed=0).double(), llama(512, 64, 1, seed=1).double(), cfg)),
    ]
    # Tied or untied output weights, all else equal: a graph traced with one tensor for both takes one input.
    retied = llama(512, 64, 2, seed=0)
    head, embed = retied.lm_head, retied.embed_tokens
    head.weight = torch.nn.Parameter(embed.weight.clone()) if head.weight is embed.weight else embed.weight
    others.append(key(fdecode.compile(retied, draft, cfg)))
    # A weight of the same shape in another memory layout: compiled code reads it by its strides.
    strided = llama(512, 64, 2, seed=0)
    strided.layers[0].mlp.down_proj.weight = torch.nn.Parameter(
        strided.layers[0].mlp.down_proj.weight.t().contiguous().t(), requires_grad=False
    )
    others.append(key(fdecode.compile(strided, draft, cfg)))
    assert len({base, *others}) == len(others) + 1
    fn = pure_step(step.target, step.draft, step.config, GraphKey(8, plan, 3))
    assert step.graph_set.stored_path(fn) == tmp_path / f"{fn.__name__}-{base}.step"
    assert fdecode.compile(target, draft, dataclasses.replace(cfg, backend="dynamo")).graph_set.stored_path(fn) is None
    monkeypatch.setenv("FDECODE_CACHE_DIR", "off")
    assert cache_dir() is None and step.graph_set.stored_path(fn) is None


def test_a_stored_graph_keeps_the_guards_the_key_does_not_cover() -> None:
    """The state's tensor guards stay; the models' weight guards (fixed by the key's layout), globals and
    identity guards go."""
    from torch._dynamo.types import GuardFilterEntry

    def entry(name: str, kind: str = "TENSOR_MATCH", is_global: bool = False) -> GuardFilterEntry:
        return GuardFilterEntry(
            name=name,
            has_value=False,
            value=None,
            guard_type=kind,
            derived_guard_types=(),
            is_global=is_global,
            orig_guard=None,
        )

    entries = [
        entry("state.tokens"),
        entry("target._modules['norm']._parameters['weight']"),
        entry("draft._modules['lm_head']._parameters['weight']"),
        entry("target.config", "EQUALS_MATCH"),
        entry("G['torch']", "MODULE_MATCH", is_global=True),
        entry("plan", "ID_MATCH"),
        entry("drafts.x"),
    ]
    assert serializable_guards(["target", "draft"])(entries) == [True, False, False, True, False, False, True]


class Scale(torch.nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        self.weight = torch.nn.Parameter(
            torch.randn(8, 8, generator=torch.Generator().manual_seed(seed)), requires_grad=False
        )


def stored(path, model: Scale) -> StoredGraph:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ model.weight) + 1

    cfg = fdecode.DecodeConfig(num_draft_tokens=1, max_batch=1, max_seq_len=16, block_size=8)
    ahead = capture("inductor", fn, cfg, guard_filter=serializable_guards(["model"]))
    return StoredGraph(fn, path, {"model": model}, ahead=ahead, fallback=lambda: capture("inductor", fn, cfg))


@pytest.mark.slow
def test_a_file_that_cannot_serve_is_compiled_afresh(tmp_path, capsys) -> None:
    """Stored, loaded with other weights (exact), refusing inputs its guards do not take, and damaged: each
    time the right values, and a one-line notice where it compiles afresh."""
    path = tmp_path / "f.step"
    x = torch.randn(3, 8)
    with torch.no_grad():
        first = stored(path, Scale(0))
        torch.testing.assert_close(first(x), torch.tanh(x @ first.models["model"].weight) + 1)
        assert path.exists() and not first.loaded
        model = Scale(1)
        second = stored(path, model)
        torch.testing.assert_close(second(x), torch.tanh(x @ model.weight) + 1)
        assert second.loaded and capsys.readouterr().err == ""
        tall = torch.randn(5, 8)  # a shape the (static) graph's guards refuse
        torch.testing.assert_close(second(tall), torch.tanh(tall @ model.weight) + 1)
        assert "refuses these inputs" in capsys.readouterr().err and not second.loaded
        path.write_bytes(b"not a graph")
        third = stored(path, model)
        torch.testing.assert_close(third(x), torch.tanh(x @ model.weight) + 1)
        assert "could not load the stored step graph" in capsys.readouterr().err and not third.loaded
        assert stored(path, model)(x) is not None and path.stat().st_size > 100  # written again, whole
