"""`DeviceReads`: a torch-function mode that raises where the host would wait for the device, on a CPU.

On a CPU-only machine a "device" tensor is an ordinary tensor, so the mode draws the line itself.
Device tensors are those it is told about (`mark`: a state's leaves, model weights), those made by a
factory given a `device`, those uploaded, and everything computed from a device tensor; any other
tensor is host memory. It raises (`HostSync`) on

- a host read of a device tensor's values: `.item()`, `.tolist()`, `bool()`, `int()`, `float()`,
  `.numpy()`, `.cpu()`, printing it, and ops whose output shape depends on the values (`nonzero`,
  boolean-mask indexing, `unique`, ...), each a device -> host sync on an accelerator;
- a blocking copy between the two: `torch.tensor(data, device=...)`, `new_tensor`, `.to(device)` or
  `copy_` without `non_blocking=True`, and an op that mixes device tensors with host tensors of rank
  >= 1 (an implicit pageable upload). A non-blocking `copy_` from a device tensor into host memory is
  the asynchronous read path: its destination stays host memory (reading it later is the caller's
  one wait, which the mode cannot see and does not judge).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

# Host reads of values, and ops whose output shape depends on the values.
READS = {
    "item",
    "tolist",
    "numpy",
    "cpu",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__complex__",
    "__repr__",
    "__str__",
    "__format__",
    "__array__",
    "nonzero",
    "argwhere",
    "masked_select",
    "unique",
    "unique_consecutive",
    "equal",
    "allclose",
    "is_nonzero",
    "repeat_interleave",
}
UPLOADS = {"tensor", "as_tensor", "asarray", "new_tensor"}  # host data -> a tensor on `device`


class HostSync(AssertionError):
    """The host waited for the device (or would have, on an accelerator)."""


class DeviceReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self._device = WeakIdKeyDictionary()
        self.calls = 0  # torch calls seen: a test can check the mode saw the code it guards
        self.reads = 0  # non-blocking device -> host copies (the asynchronous read path)
        self.uploads = 0  # non-blocking host -> device copies

    def mark(self, *tensors: torch.Tensor) -> DeviceReads:
        for t in tensors:
            self._device[t] = True
        return self

    def on_device(self, t: object) -> bool:
        return isinstance(t, torch.Tensor) and t in self._device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls += 1
        name = getattr(func, "__name__", "")
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        device_in = [t for t in tensors if self.on_device(t)]
        non_blocking = kwargs.get("non_blocking", False) or any(a is True for a in args[1:])
        if device_in and name in READS:
            raise HostSync(f"{name}() reads a device tensor on the host")
        if (
            device_in
            and name in ("__getitem__", "__setitem__", "index_put", "index_put_")
            and any(t.dtype == torch.bool for t in tree_leaves(args[1]) if isinstance(t, torch.Tensor))
        ):
            raise HostSync(f"{name} with a boolean mask: the result's shape depends on device values")
        if name in UPLOADS and (kwargs.get("device") is not None or (name == "new_tensor" and device_in)):
            raise HostSync(f"torch.{name}(data, device=...) uploads through a blocking pageable copy")
        if name == "copy_":
            dst, src = args[0], args[1]
            if self.on_device(dst) != self.on_device(src) and not non_blocking:
                way = "device -> host" if self.on_device(src) else "host -> device"
                raise HostSync(f"a blocking {way} copy_ (non_blocking=False)")
            self.reads += self.on_device(src) and not self.on_device(dst)
            self.uploads += self.on_device(dst) and not self.on_device(src)
            return func(*args, **kwargs)  # the destination keeps its side
        if name == "to" and not device_in and _names_a_device(args[1:], kwargs):
            if not non_blocking:
                raise HostSync("a blocking host -> device .to() (non_blocking=False)")
            self.uploads += 1
            return self._marked(func(*args, **kwargs))
        if device_in and name != "to":
            host = [t for t in tensors if not self.on_device(t) and t.dim() > 0]
            if host:
                raise HostSync(
                    f"{name} mixes device tensors with a host tensor {tuple(host[0].shape)} (an implicit upload)"
                )
        out = func(*args, **kwargs)
        if device_in or kwargs.get("device") is not None:
            self._marked(out)
        return out

    def _marked(self, out):
        self.mark(*(t for t in tree_leaves(out) if isinstance(t, torch.Tensor)))
        return out


def _names_a_device(args, kwargs) -> bool:
    return kwargs.get("device") is not None or any(isinstance(a, (str, torch.device, torch.Tensor)) for a in args)
