"""oneDNN's packed layout of a weight as bytes, and a packed weight over bytes fdecode holds.

`torch.ops.mkldnn._reorder_linear_weight` returns an opaque oneDNN tensor: its bytes (`mkldnn.data_ptr`,
`mkldnn._nbytes`) and its layout's description (`mkldnn._get_mkldnn_serialized_md`) are all there is of
it. `as_bytes` copies both out; `over` makes the opaque tensor again over bytes held elsewhere (a file
mapped by `packed_store`), without copying them, through the function AOTInductor's stable C ABI
uses to load its own packed constants (`aoti_torch_create_tensor_from_blob_v2` in libtorch_cpu). The
tensor `over` returns does not own its bytes: whoever calls it keeps `memory` alive as long as the tensor.
`available()` is False where this torch lacks the function; fdecode then packs in memory only.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch


@functools.cache
def _shim():
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    create = lib.aoti_torch_create_tensor_from_blob_v2
    i64p = ctypes.POINTER(ctypes.c_int64)
    create.restype = ctypes.c_int32
    create.argtypes = [
        ctypes.c_void_p,  # data
        ctypes.c_int64,  # ndim
        i64p,  # sizes
        i64p,  # strides
        ctypes.c_int64,  # storage offset
        ctypes.c_int32,  # dtype
        ctypes.c_int32,  # device type
        ctypes.c_int32,  # device index
        ctypes.POINTER(ctypes.c_void_p),  # the new tensor's handle
        ctypes.c_int32,  # layout
        ctypes.c_char_p,  # the layout's serialized description
        ctypes.c_int64,  # its length
    ]
    codes = {}
    for name in ("dtype_float32", "dtype_bfloat16", "device_type_cpu", "layout__mkldnn"):
        code = getattr(lib, f"aoti_torch_{name}")
        code.restype = ctypes.c_int32
        codes[name] = code()
    capsule = ctypes.pythonapi.PyCapsule_New
    capsule.restype, capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return create, codes, capsule


@functools.cache
def available() -> bool:
    """Whether packed weights can be made over fdecode's own bytes here."""
    try:
        _shim()
    except (OSError, AttributeError):
        return False
    return hasattr(torch._C, "_aoti") and hasattr(torch._C._aoti, "alloc_tensor_by_stealing_from_void_ptr")


def as_bytes(packed: torch.Tensor) -> tuple[memoryview, bytes]:
    """(`packed`'s bytes, not copied: valid while `packed` lives; its layout's description)."""
    n = torch.ops.mkldnn._nbytes(packed)
    data = memoryview((ctypes.c_ubyte * n).from_address(torch.ops.mkldnn.data_ptr(packed))).cast("B")
    return data, bytes(torch.ops.mkldnn._get_mkldnn_serialized_md(packed).tolist())


def nbytes(packed: torch.Tensor) -> int:
    return torch.ops.mkldnn._nbytes(packed)


def over(memory: torch.Tensor, shape: torch.Size, dtype: torch.dtype, description: bytes) -> torch.Tensor:
    """The packed weight of `shape` and `dtype` whose bytes are `memory` (uint8, CPU, contiguous), laid out as
    `description` says (`as_bytes`). Keep `memory` alive while the result lives."""
    create, codes, capsule = _shim()
    dtype_code = {torch.float32: codes["dtype_float32"], torch.bfloat16: codes["dtype_bfloat16"]}[dtype]
    sizes = (ctypes.c_int64 * len(shape))(*shape)
    strides = (ctypes.c_int64 * len(shape))(*_contiguous_strides(shape))
    handle = ctypes.c_void_p()
    err = create(
        memory.data_ptr(),
        len(shape),
        sizes,
        strides,
        0,
        dtype_code,
        codes["device_type_cpu"],
        0,
        ctypes.byref(handle),
        codes["layout__mkldnn"],
        description,
        len(description),
    )
    if err != 0 or not handle.value:
        raise RuntimeError(f"oneDNN could not take a packed {tuple(shape)} {dtype} weight over fdecode's bytes")
    return torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr(capsule(handle.value, None, None))


def _contiguous_strides(shape) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]
