"""Leaving a torch.distributed process group without aborting the interpreter's exit.

Gloo runs every collective on a worker thread of its own, and that thread lets go of the collective's
tensors after the caller has already seen it complete. Letting go of a tensor that Python also holds takes
the GIL. A process that ends right after its last collective (print, `destroy_process_group`, exit) can
reach the interpreter's finalisation first: the worker thread, still waiting for the GIL, is then ended
inside a C++ destructor and the process dies with "terminate called without an active exception" (SIGABRT,
1 run in 5 of `fdecode demo --tp 2` on the 2-core CI machine; pytorch/pytorch#179291 describes the same
race). `destroy_process_group` here first runs one last collective and waits, with the GIL free, until gloo
has let go of it too; the worker that ran the collective before it has had the GIL free to finish.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

RELEASE_TIMEOUT_S = 10.0  # a worker that has not let go by then is stuck elsewhere: leave anyway


def destroy_process_group(group: dist.ProcessGroup | None = None) -> None:
    """A barrier, then `torch.distributed.destroy_process_group(group)`, once no gloo worker holds a tensor."""
    last = torch.zeros(1)
    alone = sys.getrefcount(last)
    dist.all_reduce(last, group=group)
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    # While a C++ owner (the worker's finished collective) holds `last`, torch keeps its Python object alive
    # with one more reference; sleeping frees the GIL for the worker to drop it.
    while sys.getrefcount(last) > alone and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.001)  # one more free GIL for a worker still finishing the collective before `last`
    dist.destroy_process_group(group)
