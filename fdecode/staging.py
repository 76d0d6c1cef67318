"""Host <-> device copies that do not make the host wait: pinned staging and events, on any accelerator
(docs/design.md, "The Engine").

A copy between pageable host memory and an accelerator is synchronous: the host waits for it, and so for
all the device work queued before it. The host side of fdecode (priming, the `Engine`, the benchmark's
before loop) therefore
- uploads through `Uploads`: host values are packed into one persistent page-locked buffer and sent in one
  `copy_(non_blocking=True)`; the device tensors it returns are views of that one copy;
- reads into page-locked host buffers (`host_buffer`) filled by `copy_(non_blocking=True)`, and waits once,
  when it needs the values, on an event recorded after the copy (`Fence`).

"Accelerator" is whatever `torch.accelerator` reports (CUDA, an Ascend NPU through torch_npu's PrivateUse1
backend, XPU, ...), through one code path: `torch.Event` and `Tensor.pin_memory`. On the CPU (or a device
that is not the current accelerator) buffers are plain tensors, copies are ordinary and there is no event:
a copy has finished when it returns.
"""

from __future__ import annotations

import torch

ALIGN = 64  # bytes between packed tensors: any dtype's view of the device bytes is aligned


def accelerated(device: torch.device | str) -> bool:
    """Whether `device` is the accelerator torch drives (so host buffers for it are pinned, copies are
    asynchronous and events exist); False on the CPU."""
    current = torch.accelerator.current_accelerator(check_available=True)
    return current is not None and torch.device(device).type == current.type


def host_buffer(shape: tuple[int, ...] | int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zeroed host tensor that copies to and from `device` can use asynchronously: page-locked where
    `device` is an accelerator, plain memory on the CPU."""
    buffer = torch.zeros(shape, dtype=dtype)
    return buffer.pin_memory() if accelerated(device) else buffer


class Fence:
    """A point in `device`'s queue: `record()` marks it after the work queued so far, `wait()` blocks the
    host until the device has passed it, `passed()` asks without blocking. On the CPU every queued copy has
    already happened, so it has always passed."""

    def __init__(self, device: torch.device | str) -> None:
        self._event = torch.Event(device=torch.device(device)) if accelerated(device) else None

    def record(self) -> None:
        if self._event is not None:
            self._event.record()

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()

    def passed(self) -> bool:
        return self._event is None or self._event.query()

    @property
    def event(self) -> torch.Event | None:
        """The accelerator event behind the fence, None on the CPU (where every copy has already happened)."""
        return self._event


class Uploads:
    """Packed host -> device uploads through one persistent staging buffer (pinned on an accelerator).

    `uploads(a, b, ...)` packs the host tensors into the buffer, sends them in one non-blocking copy and
    returns their device copies (same shapes and dtypes). Successive uploads take successive parts of the
    buffer; it is reused from the start once every copy out of it has finished (a `Fence` asked without
    blocking), and only grows when uploads outrun the device, so the host never waits to reuse it.
    """

    def __init__(self, device: torch.device | str, capacity: int = 4096) -> None:
        self.device = torch.device(device)
        self._buffer = host_buffer(capacity, torch.uint8, self.device)
        self._retired: list[torch.Tensor] = []  # outgrown buffers, kept until their copies are done
        self._used = 0  # bytes of the buffer that copies may still be reading
        self._sent = Fence(self.device)  # recorded after the latest copy out of the buffer

    @property
    def buffer(self) -> torch.Tensor:
        """The staging buffer uploads pack into now ([capacity] uint8 host memory)."""
        return self._buffer

    @property
    def in_flight(self) -> int:
        """Bytes of `buffer` that copies may still be reading (the next upload packs after them)."""
        return self._used

    @property
    def retired(self) -> tuple[torch.Tensor, ...]:
        """Outgrown buffers, kept until every copy out of them has finished."""
        return tuple(self._retired)

    def __call__(self, *host: torch.Tensor) -> tuple[torch.Tensor, ...]:
        offsets, total = [], 0
        for t in host:
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        if self._sent.passed():
            self._used, self._retired = 0, []
        if self._used + total > self._buffer.numel():
            self._retired.append(self._buffer)
            self._buffer = host_buffer(max(2 * self._buffer.numel(), total), torch.uint8, self.device)
            self._used = 0
        start, staged = self._used, self._buffer[self._used : self._used + total]
        for t, offset in zip(host, offsets):
            data = t.contiguous().reshape(-1).view(torch.uint8)
            staged[offset : offset + data.numel()].copy_(data)  # host memory only
        packed = torch.empty(total, dtype=torch.uint8, device=self.device)
        packed.copy_(staged, non_blocking=True)
        self._sent.record()
        self._used = start + total
        return tuple(
            packed[offset : offset + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for t, offset in zip(host, offsets)
        )

    def __repr__(self) -> str:
        pinned = self._buffer.is_pinned() if accelerated(self.device) else False
        return f"Uploads(device={self.device}, capacity={self._buffer.numel()}, pinned={pinned})"
