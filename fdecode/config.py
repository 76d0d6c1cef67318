"""`DecodeConfig`: the static half of a decode step.

Everything here is a Python scalar that is baked into the captured graph
(shapes, K, block size, dtype, device), so the config is frozen and hashable.
Anything that changes per request (positions, budgets, stop ids, sampling
parameters) is a tensor in `DecodeState` instead, so it never causes a recompile.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field

import torch

BACKENDS = ("auto", "eager", "inductor", "aot_eager", "cudagraphs", "torchair")
# torchair graph modes: ACL graph capture (npugraph_ex, the default) or a GE graph (max-autotune).
TORCHAIR_MODES = ("reduce-overhead", "max-autotune")


@dataclass(frozen=True)
class DecodeConfig:
    num_draft_tokens: int  # K: drafts proposed and verified per step
    max_batch: int  # B: lanes; the step's shapes are fixed by it
    max_seq_len: int  # capacity of one lane: prompt + generated tokens
    block_size: int = 16  # tokens per KV block
    num_blocks: int | None = None  # KV pool size incl. scratch block 0; None: every lane at max length
    backend: str = "auto"
    dtype: torch.dtype = torch.float32  # KV cache and activation dtype
    device: str = "cpu"
    max_stop_ids: int = 4  # E: EOS ids a lane can stop on (padded with -1)
    sampling: bool = True  # allow random lanes; False captures a greedy-only step (no filters, no PRNG)
    torchair_mode: str = "reduce-overhead"  # backend "torchair": ACL graph (npugraph_ex) or "max-autotune" (GE graph)
    _resolved_num_blocks: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("num_draft_tokens", "max_batch", "max_seq_len", "block_size", "max_stop_ids"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DecodeConfig.{name} must be a positive int, got {value!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"DecodeConfig.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.torchair_mode not in TORCHAIR_MODES:
            raise ValueError(f"DecodeConfig.torchair_mode must be one of {TORCHAIR_MODES}, got {self.torchair_mode!r}")
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:
            raise TypeError(f"DecodeConfig.dtype must be a floating torch.dtype, got {self.dtype!r}")
        object.__setattr__(self, "device", _normalise_device(self.device))
        needed = 1 + self.max_batch * self.blocks_per_lane
        num_blocks = needed if self.num_blocks is None else self.num_blocks
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(f"DecodeConfig.num_blocks must be an int >= 2 (block 0 is scratch), got {num_blocks!r}")
        object.__setattr__(self, "_resolved_num_blocks", num_blocks)

    @property
    def device_type(self) -> str:
        """The device type ("cpu", "cuda", "npu", ...), known even where its torch extension is not installed."""
        return self.device.split(":")[0]

    @property
    def K(self) -> int:  # noqa: N802 - the paper's name
        return self.num_draft_tokens

    @property
    def W(self) -> int:  # noqa: N802
        """Verify window: the last committed token plus K drafts."""
        return self.num_draft_tokens + 1

    @property
    def blocks_per_lane(self) -> int:
        """Columns of the block table: enough blocks for one lane at `max_seq_len`."""
        return math.ceil(self.max_seq_len / self.block_size)

    @property
    def pool_blocks(self) -> int:
        """KV pool size in blocks, block 0 (scratch) included."""
        return self._resolved_num_blocks

    @property
    def num_slots(self) -> int:
        return self.pool_blocks * self.block_size


def _normalise_device(device: object) -> str:
    """str(torch.device(device)); an Ascend "npu[:i]" stays as given where torch_npu, which teaches
    torch that name, is absent, so backend eligibility can say so instead of a parse error."""
    try:
        return str(torch.device(device))
    except RuntimeError:
        name = str(device)
        if name.split(":")[0] != "npu":
            raise
        if importlib.util.find_spec("torch_npu") is not None:
            import torch_npu  # noqa: F401 - registers the "npu" device name

            return str(torch.device(name))
        return name
