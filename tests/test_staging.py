"""`fdecode.staging`: packed uploads, and one code path for every accelerator (checked with a fake one)."""

from __future__ import annotations

import pytest
import torch

import fdecode
from fdecode.staging import Fence, Uploads, accelerated, host_buffer


class FakeEvent:
    """torch.Event stand-in: copies stay "in flight" until the host waits (or `done` is set)."""

    made: list[FakeEvent] = []

    def __init__(self, device=None) -> None:
        self.device, self.records, self.waits, self.done = torch.device(device), 0, 0, False
        FakeEvent.made.append(self)

    def record(self) -> None:
        self.records += 1
        self.done = False

    def synchronize(self) -> None:
        self.waits += 1
        self.done = True

    def query(self) -> bool:
        return self.done


@pytest.fixture
def fake_accelerator(monkeypatch):
    """torch.accelerator reports the CPU as the accelerator; torch.Event is `FakeEvent`; pin_memory is a
    spy (this CPU build cannot page-lock) returning the tensor itself. Yields the pinned tensors."""
    pinned = []

    def pin_memory(self, *args, **kwargs):
        pinned.append(self)
        return self

    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("cpu"))
    monkeypatch.setattr(torch, "Event", FakeEvent)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    FakeEvent.made = []
    return pinned


def test_uploads_round_trip_any_dtype_and_shape() -> None:
    uploads = Uploads("cpu", capacity=512)  # the six take 384 bytes (64-byte aligned)
    host = [
        torch.arange(12).view(3, 4),
        torch.tensor([0.5, -2.0, 3.25], dtype=torch.float32),
        torch.tensor([True, False, True]),
        torch.tensor(7),
        torch.zeros(0, 5, dtype=torch.int64),
        torch.arange(6, dtype=torch.int32)[::2],  # not contiguous
    ]
    first = uploads(*host)
    again = uploads(*(h + 1 if h.dtype != torch.bool else ~h for h in host))  # reuses the buffer's bytes
    for h, got, later in zip(host, first, again):
        assert got.dtype == h.dtype and got.shape == h.shape and torch.equal(got, h)  # not overwritten
        assert torch.equal(later, h + 1 if h.dtype != torch.bool else ~h)
    assert first[0].untyped_storage().data_ptr() == first[1].untyped_storage().data_ptr()  # one copy
    assert uploads.buffer.numel() == 512  # persistent: it was reused, not regrown


def test_uploads_never_overwrite_bytes_a_copy_may_still_read(fake_accelerator) -> None:
    uploads = Uploads("cpu", capacity=256)
    (event,) = FakeEvent.made
    buffer = uploads.buffer
    uploads(torch.arange(8))  # 64 bytes in flight
    uploads(torch.arange(8))
    assert uploads.in_flight == 128 and uploads.buffer is buffer  # the second took the next part
    uploads(torch.arange(32))  # 256 more bytes than are free: a bigger buffer, the old one kept
    assert (
        uploads.buffer is not buffer
        and uploads.buffer.numel() == 512
        and len(uploads.retired) == 1
        and uploads.retired[0] is buffer
    )
    event.synchronize()  # the device passed every copy: the buffer is reused from the start
    uploads(torch.arange(8))
    assert uploads.in_flight == 64 and uploads.retired == ()
    assert all(any(p is b for p in fake_accelerator) for b in (buffer, uploads.buffer))  # staged in pinned memory
    assert event.records == 4


def test_the_code_path_follows_torch_accelerator(monkeypatch) -> None:
    assert not accelerated("cpu")  # this machine: no accelerator
    assert not host_buffer(3, torch.int64, "cpu").is_pinned() and Fence("cpu").passed()
    for current, device, expected in (
        ("cuda", "cuda:1", True),
        ("xpu", "xpu", True),
        ("xpu", "cuda", False),
        ("cuda", "cpu", False),
    ):
        monkeypatch.setattr(
            torch.accelerator, "current_accelerator", lambda check_available=False: torch.device(current)
        )
        assert accelerated(device) is expected, (current, device)


def test_engine_reads_through_pinned_buffers_and_one_event_on_any_accelerator(fake_accelerator) -> None:
    """With an accelerator (faked: it reports the CPU), the Engine pins its read buffers and staging buffer,
    records its event after each launch or admission and waits on it once per read, as on CUDA."""
    from support.llama_models import fdecode_target, independent_draft

    target = fdecode_target(2)
    cfg = fdecode.DecodeConfig(num_draft_tokens=2, max_batch=2, max_seq_len=48, block_size=4, backend="eager")
    step = fdecode.compile(target, independent_draft("partial", target), cfg)
    engine = fdecode.Engine(step)
    ready = engine.ready_event
    assert isinstance(ready, FakeEvent)
    assert all(any(b is pinned for pinned in fake_accelerator) for b in engine.host_buffers)  # reads and uploads
    for prompt in ([1, 2, 3], [4, 5], [6]):
        engine.add_request(prompt, max_new_tokens=6)
    got = engine.run()
    assert ready.waits == engine.host_waits and ready.records == engine.host_waits  # one wait per read
    with pytest.MonkeyPatch.context() as undo:  # the same requests on the plain CPU path
        undo.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: None)
        plain = fdecode.Engine(step)
        assert plain.ready_event is None
        for prompt in ([1, 2, 3], [4, 5], [6]):
            plain.add_request(prompt, max_new_tokens=6)
        assert plain.run() == got
