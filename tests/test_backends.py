"""Backend eligibility, fallback reporting and the torchair GE mapping, on CPU.

Device availability is faked only at the eligibility boundary (`torch.cuda.is_available`,
`has_triton`, `torchair.availability_reason`, an ops-info file of a custom op package);
nothing is compiled or run on a faked device. The eligibility functions read the
models' parameters, so the positive cases use parameter-free stand-ins: a model
with no weights has none on the wrong device.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from support.llama_models import fdecode_target, independent_draft

import fdecode
from fdecode.config import BACKENDS
from fdecode.drafts import LM, MTP, NGRAM
from fdecode.graphs import backends
from fdecode.graphs import torchair as npu
from fdecode.ops import histogram, kv

CFG = dict(num_draft_tokens=2, max_batch=2, max_seq_len=32, block_size=4)


def config(**changes) -> fdecode.DecodeConfig:
    return fdecode.DecodeConfig(**{**CFG, **changes})


def weightless(hidden_size: int = 64) -> torch.nn.Module:
    """A model stand-in without parameters (eligibility reads only parameters and config.hidden_size)."""
    model = torch.nn.Module()
    model.config = SimpleNamespace(hidden_size=hidden_size)
    return model


def eligible(name: str, cfg: fdecode.DecodeConfig, *, target=None, draft=None, kind=LM) -> str | None:
    target = target if target is not None else weightless()
    return backends.ELIGIBILITY[name](cfg, target, draft if draft is not None else weightless(), kind)


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("torch.utils._triton.has_triton", lambda: True)


@pytest.fixture
def fake_npu(monkeypatch):
    monkeypatch.setattr(npu, "availability_reason", lambda: None)


def test_every_backend_has_one_eligibility_function():
    assert set(backends.ELIGIBILITY) == set(BACKENDS) - {"auto"}
    assert set(backends.PREFERENCE) <= set(backends.ELIGIBILITY)


def test_cpu_backends():
    cpu = config()
    assert eligible("eager", cpu) is None and eligible("aot_eager", cpu) is None
    assert eligible("inductor", cpu) is None
    assert "CUDA device" in eligible("cudagraphs", cpu)
    assert "Ascend NPU" in eligible("torchair", cpu)
    assert backends.choose_backend(config(backend="auto"), weightless(), weightless(), LM) == ("inductor", None)


def test_the_dynamo_backend_captures_one_graph_and_lowers_nothing():
    """`dynamo`: Dynamo's one graph run op by op, no AOTAutograd (half the capture time of `aot_eager`, for
    graph and recompile tests); the eager step's tokens; one graph for every window, like `aot_eager`."""
    from torch._dynamo.utils import counters

    target = fdecode_target(2)
    draft = independent_draft("partial", target)
    cfg = config(backend="dynamo", max_seq_len=40, context_buckets=(16,), sampling=False)
    step = fdecode.compile(target, draft, cfg, announce=False)
    assert step.backend == "dynamo" and step.dynamic_window and eligible("dynamo", cfg) is None
    graphs, lowered = counters["stats"]["unique_graphs"], sum(counters["aot_autograd"].values())
    prompts = [[5, 17, 33], [7, 3]]
    got = fdecode.generate(step, prompts, max_new_tokens=24, progress=False)
    assert counters["stats"]["unique_graphs"] - graphs == 1  # crossing windows compiled nothing more
    assert sum(counters["aot_autograd"].values()) == lowered  # nothing went through AOTAutograd
    assert len(step.compile_seconds) >= 2  # it ran more than one window
    eager = fdecode.compile(target, draft, config(backend="eager", max_seq_len=40, sampling=False))
    assert got == fdecode.generate(eager, prompts, max_new_tokens=24, progress=False)


def test_inductor_needs_a_compiler_and_weights_on_the_device(monkeypatch):
    target = fdecode_target(2)
    assert eligible("inductor", config(), target=target) is None
    target.lm_head.weight.data = target.lm_head.weight.data.t().contiguous().t()  # same values, strided layout
    assert "lm_head.weight" in eligible("inductor", config(), target=target)
    assert "not contiguous" in eligible("inductor", config(), target=target)
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert "C++ compiler" in eligible("inductor", config())


def test_cudagraphs_eligibility(monkeypatch, fake_cuda):
    cuda = config(device="cuda", backend="cudagraphs")
    assert eligible("cudagraphs", cuda) is None
    assert backends.choose_backend(config(device="cuda", backend="auto"), weightless(), weightless(), LM) == (
        "cudagraphs",
        None,
    )
    # Weights left on the CPU would put CPU tensors in the graph (CUDA graph trees skip such graphs).
    assert "is on cpu" in eligible("cudagraphs", cuda, target=fdecode_target(2))
    monkeypatch.setattr("torch.utils._triton.has_triton", lambda: False)
    assert "triton" in eligible("cudagraphs", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "is_available() is False" in eligible("cudagraphs", cuda)


def test_an_unusable_device_raises_before_any_model_moves():
    target = fdecode_target(2)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="is_available"):
            fdecode.compile(target, independent_draft("random", target), config(device="cuda"), fallback=True)
    with pytest.raises(ValueError, match="torch_npu is not installed"):
        fdecode.compile(target, independent_draft("random", target), config(device="npu", backend="torchair"))


def test_npu_config_without_torch_npu():
    cfg = config(device="npu:1", backend="torchair")
    assert cfg.device == "npu:1" and cfg.device_type == "npu"
    assert eligible("torchair", cfg) == 'torch_npu is not installed (pip install -e ".[npu]")'
    assert "CPU and CUDA only" in eligible("inductor", cfg)
    with pytest.raises(ValueError, match="torchair_mode"):
        config(torchair_mode="ge")


def test_torchair_acl_graph_eligibility(fake_npu):
    acl = config(device="npu", backend="torchair", dtype=torch.float16)
    assert eligible("torchair", acl) is None
    assert eligible("torchair", acl, kind=MTP) is None
    assert "n-gram draft" in eligible("torchair", acl, kind=NGRAM)  # its drafter says why it cannot run
    assert "dtype torch.float64" in eligible("torchair", config(device="npu", dtype=torch.float64))
    assert "is on cpu" in eligible("torchair", acl, target=fdecode_target(2))
    assert backends.choose_backend(dataclasses.replace(acl, backend="auto"), weightless(), weightless(), MTP) == (
        "torchair",
        None,
    )


def write_kernel_package(root, inputs, outputs) -> None:
    """A custom op package's ops-info file declaring MtpPrepareNextDraft (what CANN's installer lays out)."""
    entry = {f"input{i}": {"name": n, "dtype": "int64"} for i, n in enumerate(inputs)}
    entry.update({f"output{i}": {"name": n, "dtype": "int64"} for i, n in enumerate(outputs)})
    entry["attr"] = {"list": "block_size"}
    folder = root / "op_impl" / "ai_core" / "tbe" / "config" / "ascend910b"
    folder.mkdir(parents=True)
    (folder / "aic-ascend910b-ops-info.json").write_text(json.dumps({"Other": {}, npu.OP_TYPE: entry}))


def test_torchair_ge_eligibility(fake_npu, monkeypatch, tmp_path):
    monkeypatch.delenv("ASCEND_OPP_PATH", raising=False)
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", str(tmp_path / "vendor"))
    ge = config(
        device="npu",
        backend="torchair",
        torchair_mode="max-autotune",
        dtype=torch.float16,
        sampling=False,
        attention="npu_fused_infer_attention",
    )
    # The reference attention's SDPA has no GE converter: GE needs the NPU attention kernel.
    assert "GE mode needs the NPU attention kernel" in eligible("torchair", dataclasses.replace(ge, attention="torch"))
    assert "MtpPrepareNextDraft kernel" in eligible("torchair", ge) and "not installed" in eligible("torchair", ge)

    names = npu.ge_call_names()
    write_kernel_package(tmp_path / "vendor", ["accepted", "hidden"], names.outputs)
    assert "fdecode maps" in eligible("torchair", ge)  # an installed kernel with other inputs is refused

    other = tmp_path / "good"
    write_kernel_package(other, list(names.inputs), list(names.outputs))
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", str(other))
    assert npu.installed_kernel() is not None
    # H * itemsize % 32: 40 fp16 values are 80 bytes, 48 are 96.
    assert "% 32 == 0" in eligible("torchair", ge, target=weightless(40))
    # With the kernel installed, the GE mode takes both the greedy-only and the sampling step (nothing blocks).
    assert eligible("torchair", ge, target=weightless(48)) is None
    # ... but not a tree step: its trees' forwards and its prepare op have no GE converter.
    tree = dataclasses.replace(ge, num_draft_tokens=4, draft_topk=2, draft_depth=2)
    assert "GE mode cannot capture a tree step" in eligible("torchair", tree, target=weightless(48))
    sampling = dataclasses.replace(ge, sampling=True)
    assert eligible("torchair", sampling, target=weightless(48)) is None
    # Were the step to contain an unconvertible op again, GE would be refused with its name.
    monkeypatch.setitem(npu.GE_BLOCKERS, True, ("aten.amax.default",))
    assert eligible("torchair", sampling, target=weightless(48)) == (
        "torchair's GE mode has no converter for aten.amax.default, which the step uses (see docs/backends.md)"
    )
    # ASCEND_OPP_PATH/vendors/<name> is searched too.
    monkeypatch.delenv("ASCEND_CUSTOM_OPP_PATH")
    monkeypatch.setenv("ASCEND_OPP_PATH", str(tmp_path / "opp"))
    write_kernel_package(tmp_path / "opp" / "vendors" / "fdecode", list(names.inputs), list(names.outputs))
    assert npu.kernel_io_names(npu.installed_kernel()) == (list(names.inputs), list(names.outputs))


def test_ge_graph_falls_back_to_the_acl_graph_mode(fake_npu, monkeypatch, tmp_path):
    """Without the AscendC kernel, a GE request with fallback=True still captures one graph (ACL mode)."""
    monkeypatch.delenv("ASCEND_OPP_PATH", raising=False)
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", str(tmp_path))
    ge = config(
        device="npu",
        backend="torchair",
        torchair_mode="max-autotune",
        dtype=torch.float16,
        attention="npu_fused_infer_attention",
    )
    with pytest.raises(ValueError, match="MtpPrepareNextDraft kernel"):
        backends.resolve_backend(ge, weightless(), weightless(), LM)
    runs, name, reason = backends.resolve_backend(ge, weightless(), weightless(), LM, fallback=True)
    assert (name, runs.torchair_mode) == ("torchair", "reduce-overhead")
    assert reason.startswith("torchair GE graph: GE mode needs the AscendC MtpPrepareNextDraft kernel")
    assert reason.endswith("running torchair's ACL graph mode instead")
    # Where the ACL mode cannot run either, the usual chain: the next backends (eager on an NPU).
    runs, name, reason = backends.resolve_backend(ge, weightless(), weightless(), NGRAM, fallback=True)
    assert (name, runs) == ("eager", ge) and "n-gram draft" in reason
    # An eligible GE request runs as asked.
    names = npu.ge_call_names()
    write_kernel_package(tmp_path, list(names.inputs), list(names.outputs))
    # (with its layers unrolled: torchair is not known to take nested compile regions)
    unrolled = dataclasses.replace(ge, layer_regions=False)
    assert backends.resolve_backend(ge, weightless(48), weightless(48), LM, fallback=True) == (
        unrolled,
        "torchair",
        None,
    )
    # "auto" on an NPU asking for GE: the same fallback to the ACL graph mode, not to eager.
    auto = dataclasses.replace(ge, backend="auto", attention="torch")
    runs, name, reason = backends.resolve_backend(auto, weightless(48), weightless(48), LM)
    assert (name, runs.torchair_mode) == ("torchair", "reduce-overhead") and "NPU attention kernel" in reason


def test_explicit_backend_falls_back_to_the_next_eligible_one():
    target = fdecode_target(2)
    draft = independent_draft("random", target)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        fdecode.compile(target, draft, config(backend="cudagraphs"))
    step = fdecode.compile(target, draft, config(backend="cudagraphs"), fallback=True)
    assert step.backend == "inductor"
    assert step.fallback_reason == "cudagraphs: CUDA graphs need a CUDA device, the step runs on 'cpu'"
    assert "fallback_reason=" in repr(step)


def test_fallback_chain_reports_every_refusal(monkeypatch):
    monkeypatch.setitem(backends.ELIGIBILITY, "inductor", lambda cfg, t, d, k: "no compiler in this test")
    target = fdecode_target(2)
    draft = independent_draft("random", target)
    step = fdecode.compile(target, draft, config(backend="cudagraphs"), fallback=True)
    assert step.backend == "eager"
    assert step.fallback_reason == (
        "cudagraphs: CUDA graphs need a CUDA device, the step runs on 'cpu'; inductor: no compiler in this test"
    )
    auto = fdecode.compile(target, draft, config(backend="auto"))
    assert (auto.backend, auto.fallback_reason) == ("eager", "inductor: no compiler in this test")
    state = auto.prefill([[1, 2, 3]], max_new_tokens=3)
    auto(state)  # the fallback really runs


def test_fdecode_backend_names_what_auto_resolves_to(monkeypatch):
    target = fdecode_target(2)
    draft = independent_draft("random", target)
    monkeypatch.setenv("FDECODE_BACKEND", "aot_eager")
    step = fdecode.compile(target, draft, config(backend="auto"))
    assert (step.backend, step.config.backend, step.fallback_reason) == ("aot_eager", "aot_eager", None)
    assert fdecode.compile(target, draft, config(backend="eager")).backend == "eager"  # only "auto" follows it
    monkeypatch.setenv("FDECODE_BACKEND", "inductr")
    with pytest.raises(ValueError, match="FDECODE_BACKEND must be one of"):
        fdecode.compile(target, draft, config(backend="auto"))


# ---------------------------------------------------------------------------- the GE converter's mapping

GE_ATTR_TYPES = {
    "Bool",
    "DataType",
    "Float",
    "Int",
    "ListBool",
    "ListDataType",
    "ListFloat",
    "ListInt",
    "ListStr",
    "Str",
}


def test_ge_mapping_follows_the_op_schema():
    schema = torch.ops.fdecode.prepare_next_draft.default._schema
    accepted, hidden, placeholder = torch.tensor([[3, -1]]), torch.zeros(1, 2, 8), torch.zeros(8)
    base_pos, tables = torch.tensor([5]), torch.tensor([[1, 2]])
    args = (accepted, hidden, placeholder, base_pos, base_pos + 1, tables, 4)
    call = npu.ge_call(*args)
    tensor_args = [a.name for a in schema.arguments if str(a.type) == "Tensor"]
    assert (
        list(call.inputs) == tensor_args == ["accepted", "hidden", "placeholder", "base_pos", "base_kv", "block_tables"]
    )
    # Every tensor goes through untouched, in schema order; block_size becomes a typed attribute.
    assert all(call.inputs[name] is arg for name, arg in zip(tensor_args, args))
    assert call.attrs == {"block_size": ("Int", 4)}
    assert {kind for kind, _ in call.attrs.values()} <= GE_ATTR_TYPES
    assert len(call.outputs) == len(schema.returns) == 5
    names = dict(zip(schema.arguments, args))
    assert npu.ge_call(**{a.name: v for a, v in names.items()}) == call
    assert npu.ge_call(*args[:3], base_pos=args[3], base_kv=args[4], block_tables=args[5], block_size=4) == call
    with pytest.raises(TypeError, match="takes 7 arguments"):
        npu.ge_call(*args[:6])


def test_ge_outputs_match_the_fake_results():
    """The converter's outputs are, in order, what the op's meta function returns (shapes per name)."""
    with torch._subclasses.fake_tensor.FakeTensorMode():
        accepted = torch.empty(3, 4, dtype=torch.int64)
        hidden = torch.empty(3, 4, 16)
        out = torch.ops.fdecode.prepare_next_draft(
            accepted,
            hidden,
            torch.empty(16),
            torch.empty(3, dtype=torch.int64),
            torch.empty(3, dtype=torch.int64),
            torch.empty(3, 5, dtype=torch.int64),
            4,
        )
        shapes = dict(zip(npu.GE_OUTPUTS, (tuple(t.shape) for t in out)))
    assert shapes == {"tokens": (6,), "hidden_rows": (6, 16), "positions": (6,), "kv_lens": (3,), "slots": (6,)}


# ---------------------------------------------------------------------------- ops per backend (measured)


def captured_ops(sampling: bool) -> set[str]:
    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(
        num_draft_tokens=1, max_batch=2, max_seq_len=16, block_size=4, backend="cudagraphs", sampling=sampling
    )
    step = fdecode.compile(target, independent_draft("random", target), cfg, fallback=True)
    state = step.prefill([[1, 2, 3]], max_new_tokens=4)
    # Between them, the candidate plan and the full plan with every filter contain every op of every plan.
    plans = ("top_k<=128", "full+top_k+top_p") if sampling else ("greedy",)
    reports = [fdecode.inspect(step, state, plan=plan) for plan in plans]
    assert {r.backend for r in reports} == {"inductor"}  # inspect reports what runs (the fallback); same graph
    return set().union(*(r.overload_counts for r in reports))


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [False, True])
def test_ge_blockers_are_what_the_npu_step_contains(sampling, monkeypatch):
    """GE_BLOCKERS is re-measured: the unconvertible overloads (less those fdecode converts) found in the
    step as an NPU captures it. Traced on CPU with the NPU's KV write, whose call there goes to
    `fdecode::scatter_nd_update_` (torch_npu's `npu_scatter_nd_update_` on an NPU: same schema)."""
    monkeypatch.setitem(kv.KV_WRITE, "cpu", kv.KV_WRITE["npu"])
    monkeypatch.setitem(histogram.WAY, "cpu", histogram.way_for("npu"))
    ops = captured_ops(sampling)
    assert {"fdecode.prepare_next_draft.default", "fdecode.scatter_nd_update_.default"} <= ops
    assert not ops & {"aten.index_put.default", "aten.index_put_.default", "aten.amax.default"}
    assert ("aten.view.dtype" in ops) == sampling  # the filters' float bits: fdecode's Bitcast converter
    assert sorted((ops & npu.GE_UNCONVERTED) - npu.GE_SUPPLIED) == sorted(npu.GE_BLOCKERS[sampling])


@pytest.mark.slow
def test_the_cpu_step_writes_kv_with_index_put():
    """The control of the test above: CPU and CUDA keep the one-scatter `index_put_`."""
    ops = captured_ops(False)
    assert "aten.index_put.default" in ops and "fdecode.scatter_nd_update_.default" not in ops


def test_bitcast_converter_takes_same_width_views_only():
    assert npu.bitcast_reason(torch.float32, torch.int32) is None
    assert npu.bitcast_reason(torch.bfloat16, torch.int16) is None
    assert "changes the last dimension" in npu.bitcast_reason(torch.float32, torch.int16)
