"""The `DeviceReads` mode itself: what it calls a host sync, and what it lets through."""

from __future__ import annotations

import pytest
import torch
from support.device_reads import DeviceReads, HostSync


@pytest.mark.parametrize(
    "read",
    [
        lambda d: d.tolist(),
        lambda d: d[0].item(),
        lambda d: bool(d[0]),
        lambda d: int(d.max()),
        lambda d: float(d[1]),
        lambda d: [1, 2, 3][d[0]],
        lambda d: repr(d),
        lambda d: d.cpu(),
        lambda d: d.nonzero(),
        lambda d: d[d > 0],
        lambda d: torch.tensor([1, 2], device="cpu"),
        lambda d: d.new_tensor([1, 2]),
        lambda d: torch.arange(2).to("cpu"),
        lambda d: d.copy_(torch.arange(3)),
        lambda d: torch.zeros(3, dtype=d.dtype).copy_(d),
        lambda d: d + torch.arange(3),
        lambda d: d.index_fill(0, torch.tensor([1]), 0),
    ],
)
def test_reads_and_blocking_copies_raise(read) -> None:
    mode = DeviceReads()
    device = torch.arange(3)
    with mode.mark(device), pytest.raises(HostSync):
        read(device)


def test_device_work_and_non_blocking_copies_pass() -> None:
    mode = DeviceReads()
    device = torch.arange(3)
    with mode.mark(device):
        made = torch.zeros(3, dtype=torch.int64, device="cpu")  # a device factory
        staged = torch.empty(3, dtype=torch.int64).copy_(torch.tensor([4, 5, 6]))  # host work
        made.copy_(staged, non_blocking=True)  # an asynchronous upload
        total = (device + made + torch.arange(3, device="cpu")).sum() * torch.tensor(2)  # a 0-d host scalar
        host = torch.zeros(1, dtype=torch.int64)
        host.copy_(total[None], non_blocking=True)  # the asynchronous read path
        assert mode.on_device(total) and not mode.on_device(host) and not mode.on_device(staged)
        uploaded = staged.to("cpu", non_blocking=True)
        assert mode.on_device(uploaded)
    assert host.tolist() == [2 * (3 + 15 + 3)]
