"""The host side: an engine that feeds the compiled step without blocking it
(docs/design.md, "The Engine")."""

from fdecode.runtime.allocator import BlockAllocator
from fdecode.runtime.engine import Engine, Event
from fdecode.runtime.metrics import RequestMetrics, SpecMetrics

__all__ = ["BlockAllocator", "Engine", "Event", "RequestMetrics", "SpecMetrics"]
