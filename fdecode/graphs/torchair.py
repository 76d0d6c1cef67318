"""The Ascend NPU backend: torchair (`torch_npu`'s Dynamo backend), imported lazily
(docs/backends.md, "Per backend").

Two graph modes (`DecodeConfig.torchair_mode`):
- `"reduce-overhead"` (default): ACL graph capture (torchair's `npugraph_ex` mode); the
  step's ATen kernels are captured and replayed like CUDA graphs, the fused op through
  its meta (fake) registration.
- `"max-autotune"`: a GE graph; every FX node needs a GE converter. The step avoids the
  ATen ops torchair leaves unconverted (`GE_UNCONVERTED`) or gets a converter here
  (`aten.view.dtype` to GE `Bitcast`; the fused op to the AscendC `MtpPrepareNextDraft`
  kernel, which must be installed as a custom-op package), and needs the NPU attention
  kernel. `GE_BLOCKERS`, what remains unconverted, is empty.

Static-graph settings: `dynamic=False`, parameters frozen (GE), KV leaves marked static.
Nothing here imports torch_npu or torchair at module import time.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from fdecode.config import DecodeConfig

OP_TYPE = "MtpPrepareNextDraft"  # the AscendC kernel's IR name (REG_OP)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The AscendC kernel moves hidden rows in 32-byte blocks.
KERNEL_ALIGN_BYTES = 32
# ATen overloads whose torchair GE converter raises NotImplementedError (torchair's
# `_ge_concrete_graph/ge_converter/aten/*.py`, read in torchair's sources as of 2026-11): a reviewer's list, plus the two
# the step was measured to contain (amax, view.dtype). Not exhaustive: torchair leaves ~1100 overloads unconverted.
GE_UNCONVERTED = frozenset(
    {
        "aten.index_put.default",
        "aten.index_put_.default",
        "aten.index_copy.default",
        "aten.index_copy_.default",
        "aten.scatter.src",
        "aten.scatter.value",
        "aten.scatter_.src",
        "aten.scatter_.value",
        "aten.cumprod.default",
        "aten.exponential.default",
        "aten.bitwise_xor.Tensor",
        "aten.bitwise_xor.Scalar",
        "aten.bitwise_left_shift.Tensor",
        "aten.bitwise_right_shift.Tensor",
        "aten.amax.default",
        "aten.view.dtype",
        "aten.scatter_reduce.two",
        "aten.scatter_reduce_.two",
    }
)
# Overloads in that set for which fdecode registers a converter of its own (`register_ge_converters`).
GE_SUPPLIED = frozenset({"aten.view.dtype"})
# What the captured NPU step still contains of GE_UNCONVERTED - GE_SUPPLIED, by `DecodeConfig.sampling`
# (measured with `fdecode.inspect` on CPU with the NPU's KV write; tests/test_backends.py re-measures it).
GE_BLOCKERS: dict[bool, tuple[str, ...]] = {False: (), True: ()}
# GE names of the fused op's results, in the schema's return order.
GE_OUTPUTS = ("tokens", "hidden_rows", "positions", "kv_lens", "slots")


def import_torchair():
    """torchair as a package, or as shipped inside torch_npu (older releases)."""
    import torch_npu  # noqa: F401 - registers the NPU device with torch

    try:
        return importlib.import_module("torchair")
    except ImportError:
        return importlib.import_module("torch_npu.dynamo.torchair")


def torch_npu_reason() -> str | None:
    """None where torch_npu imports and sees an NPU, else what is missing."""
    if importlib.util.find_spec("torch_npu") is None:
        return 'torch_npu is not installed (pip install -e ".[npu]")'
    try:
        import torch_npu  # noqa: F401
    except Exception as err:
        return f"torch_npu failed to import: {err}"
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        return "torch_npu is installed but torch.npu.is_available() is False"
    return None


def availability_reason() -> str | None:
    """None where torch_npu, an NPU and torchair are present, else what is missing."""
    reason = torch_npu_reason()
    if reason is not None:
        return reason
    try:
        import_torchair()
    except ImportError as err:
        return f"torchair is not importable: {err}"
    return None


# ---------------------------------------------------------------------------- the AscendC kernel


def _opp_roots() -> list[Path]:
    """Where CANN looks for custom op packages: ASCEND_CUSTOM_OPP_PATH entries, then ASCEND_OPP_PATH/vendors/*."""
    roots = [Path(p) for p in os.environ.get("ASCEND_CUSTOM_OPP_PATH", "").split(":") if p]
    opp = os.environ.get("ASCEND_OPP_PATH")
    if opp and (Path(opp) / "vendors").is_dir():
        roots += sorted(p for p in (Path(opp) / "vendors").iterdir() if p.is_dir())
    return roots


def installed_kernel() -> dict | None:
    """The `MtpPrepareNextDraft` entry of an installed custom op package's ops-info JSON, or None."""
    for root in _opp_roots():
        for info in sorted(root.glob("op_impl/ai_core/tbe/config/*/aic-*-ops-info.json")):
            try:
                ops = json.loads(info.read_text())
            except (OSError, ValueError):
                continue
            if OP_TYPE in ops:
                return ops[OP_TYPE]
    return None


def kernel_io_names(entry: dict) -> tuple[list[str], list[str]]:
    """Input and output names of an ops-info entry (`input0`, `input1`, ... and `output0`, ...)."""

    def names(prefix: str) -> list[str]:
        keys = sorted(
            (k for k in entry if k.startswith(prefix) and k[len(prefix) :].isdigit()),
            key=lambda k: int(k[len(prefix) :]),
        )
        return [entry[k]["name"] for k in keys]

    return names("input"), names("output")


def ge_reason(cfg: DecodeConfig, *, hidden_size: int) -> str | None:
    """Why the GE mode cannot capture this step, or None."""
    if cfg.attention != "npu_fused_infer_attention":
        # The reference's SDPA: torchair has no GE converter for the fused SDPA overloads
        # (`_scaled_dot_product_flash_attention` raises NotImplementedError in those sources).
        return (
            f"GE mode needs the NPU attention kernel (attention='npu_fused_infer_attention', which needs float16/"
            f"bfloat16 and block_size 128..512), the step's attention is {cfg.attention!r}"
        )
    if cfg.tree:
        return (
            "GE mode cannot capture a tree step: its trees' forwards run the reference attention (no GE converter "
            "takes a tree mask) and its fused prepare op, fdecode::prepare_tree_draft, has no GE converter"
        )
    entry = installed_kernel()
    if entry is None:
        return (
            f"GE mode needs the AscendC {OP_TYPE} kernel (a custom op package under ASCEND_CUSTOM_OPP_PATH or "
            "ASCEND_OPP_PATH/vendors), which is not installed"
        )
    inputs, outputs = kernel_io_names(entry)
    want = ge_call_names()
    if (inputs, outputs) != (list(want.inputs), list(want.outputs)):
        return f"the installed {OP_TYPE} kernel has inputs {inputs} / outputs {outputs}, fdecode maps {want.inputs} / {want.outputs}"
    itemsize = torch.empty((), dtype=cfg.dtype).element_size()
    if hidden_size * itemsize % KERNEL_ALIGN_BYTES:
        return (
            f"the {OP_TYPE} kernel needs hidden_size * itemsize % {KERNEL_ALIGN_BYTES} == 0, got "
            f"{hidden_size} * {itemsize} = {hidden_size * itemsize}"
        )
    blockers = GE_BLOCKERS[cfg.sampling]
    if blockers:  # empty today; kept so that a new unconvertible op in the step is refused, not a GE build error
        return (
            f"torchair's GE mode has no converter for {', '.join(blockers)}, which the step uses (see docs/backends.md)"
        )
    return None


# ---------------------------------------------------------------------------- the GE converter


@dataclass(frozen=True)
class GeCall:
    """One `torchair.ge.custom_op` call: IR inputs (in order), typed attributes, output names."""

    inputs: dict[str, object]  # IR input name -> converter input (a GE tensor), schema order
    attrs: dict[str, tuple[str, object]]  # IR attribute name -> (torchair.ge.attr type name, value)
    outputs: tuple[str, ...]


_ATTR_TYPES = {"int": "Int", "float": "Float", "bool": "Bool", "str": "Str", "List[int]": "ListInt"}


def ge_call(*args: object, **kwargs: object) -> GeCall:
    """Map a `fdecode::prepare_next_draft` call onto the kernel's IR: tensor arguments become inputs,
    scalar arguments typed attributes, in the op schema's order. Pure: testable without torchair."""
    schema = torch.ops.fdecode.prepare_next_draft.default._schema
    if len(args) + len(kwargs) != len(schema.arguments):
        raise TypeError(f"{schema.name} takes {len(schema.arguments)} arguments, got {len(args) + len(kwargs)}")
    inputs: dict[str, object] = {}
    attrs: dict[str, tuple[str, object]] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(args):
            value = args[i]
        elif arg.name in kwargs:
            value = kwargs[arg.name]
        else:
            raise TypeError(f"{schema.name}: missing argument {arg.name!r}")
        kind = str(arg.type)
        if kind == "Tensor":
            inputs[arg.name] = value
        elif kind in _ATTR_TYPES:
            attrs[arg.name] = (_ATTR_TYPES[kind], value)
        else:
            raise TypeError(f"{schema.name}: no GE mapping for argument {arg.name}: {kind}")
    if len(schema.returns) != len(GE_OUTPUTS):
        raise TypeError(
            f"{schema.name} returns {len(schema.returns)} tensors, the kernel has {len(GE_OUTPUTS)} outputs"
        )
    return GeCall(inputs, attrs, GE_OUTPUTS)


def ge_call_names() -> GeCall:
    """The IR names fdecode maps to (no values): what an installed kernel must declare."""
    schema = torch.ops.fdecode.prepare_next_draft.default._schema
    return ge_call(*(a.name for a in schema.arguments))


def bitcast_reason(source: torch.dtype, target: torch.dtype) -> str | None:
    """Why `x.view(target)` of a `source` tensor cannot be a GE `Bitcast` (which keeps the shape), or None."""
    if source.itemsize != target.itemsize:
        return (
            f"view({target}) of a {source} tensor changes the last dimension; fdecode's GE converter maps only "
            "same-width views to Bitcast"
        )
    return None


def register_ge_converters(tng) -> None:
    """Register fdecode's GE converters with torchair `tng` (idempotent; call after importing torchair,
    whose own aten converters a later registration replaces):
    - `fdecode::prepare_next_draft` -> the AscendC `MtpPrepareNextDraft` kernel (`ge_call`);
    - `aten.view.dtype` between same-width dtypes -> GE `Bitcast` (torchair's raises NotImplementedError
      for every input; other widths still raise)."""
    if getattr(register_ge_converters, "done", False):
        return

    @tng.register_fx_node_ge_converter(torch.ops.fdecode.prepare_next_draft.default)
    def _convert(accepted, hidden, placeholder, base_pos, base_kv, block_tables, block_size, meta_outputs=None):
        call = ge_call(accepted, hidden, placeholder, base_pos, base_kv, block_tables, block_size)
        attrs = {name: getattr(tng.ge.attr, kind)(value) for name, (kind, value) in call.attrs.items()}
        return tng.ge.custom_op(OP_TYPE, inputs=call.inputs, attrs=attrs, outputs=list(call.outputs))

    @tng.register_fx_node_ge_converter(torch.ops.aten.view.dtype)
    def _view_dtype(self, dtype, meta_outputs=None):
        from torchair._ge_concrete_graph import ge_apis
        from torchair.ge._ge_graph import ge_type_to_torch_type, torch_type_to_ge_type

        reason = bitcast_reason(ge_type_to_torch_type(self.dtype), dtype)
        if reason is not None:
            raise NotImplementedError(reason)
        return ge_apis.Bitcast(self, type=torch_type_to_ge_type(dtype))

    register_ge_converters.done = True


def backend(cfg: DecodeConfig):
    """The torchair backend object for `torch.compile(..., backend=...)`, configured for `cfg.torchair_mode`."""
    tng = import_torchair()
    config = tng.CompilerConfig()
    if cfg.torchair_mode == "max-autotune":
        register_ge_converters(tng)
        config.mode = "max-autotune"
        config.experimental_config.frozen_parameter = True  # weights are graph inputs with fixed addresses
    else:
        try:  # ACL graph: called "npugraph_ex" by recent torchair, "reduce-overhead" by older releases
            config.mode = "npugraph_ex"
        except (ValueError, AssertionError):
            config.mode = "reduce-overhead"
    return tng.get_npu_backend(compiler_config=config)
