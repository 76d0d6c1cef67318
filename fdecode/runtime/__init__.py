"""The host side: an engine that feeds the compiled step without blocking it
(docs/design.md, "The Engine")."""

from fdecode.runtime.allocator import BlockAllocator
from fdecode.runtime.engine import Engine, Event

__all__ = ["BlockAllocator", "Engine", "Event"]
