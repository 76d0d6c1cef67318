"""Host-side KV block allocator: blocks 1 .. num_blocks-1 (block 0 is the scratch block)
(docs/design.md, "The Engine")."""

from __future__ import annotations


class BlockAllocator:
    """A free list of KV blocks; the engine decides who gets how many (lookahead policy in `Engine`)."""

    def __init__(self, num_blocks: int) -> None:
        self.capacity = num_blocks - 1
        self._free = list(range(num_blocks - 1, 0, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        """n blocks, or None (nothing taken) if fewer are free."""
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))

    def __repr__(self) -> str:
        return f"BlockAllocator(free={self.num_free}/{self.capacity})"
