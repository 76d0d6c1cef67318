"""What a run costs: its largest CPU allocation, and whether it syncs the host with an accelerator.

(On a CPU the host reads of device tensors are caught by `DeviceReads`: support/device_reads.py.)
"""

from __future__ import annotations

import torch


def largest_cpu_allocation(fn) -> int:
    """Bytes of the largest CPU allocation made while `fn()` runs (the profiler's memory events)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0), default=0)


def steps_without_host_syncs(step, state, steps: int, device):
    """Warm up (3 steps: compile, capture), then run `steps` steps under the device's sync debug mode
    "error", so any device-to-host sync raises. `device`: `torch.cuda` or `torch_npu.npu` (both have
    `synchronize` and `set_sync_debug_mode`). Returns the last (state, output)."""
    for _ in range(3):
        state, out = step(state)
    device.synchronize()
    device.set_sync_debug_mode("error")
    try:
        for _ in range(steps):
            state, out = step(state)
    finally:
        device.set_sync_debug_mode("default")
    device.synchronize()
    return state, out
