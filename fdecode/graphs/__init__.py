"""Capture: backends, eligibility, the compiled `Step`, and graph inspection
(docs/design.md, "Backends and kernels")."""

from fdecode.graphs.backends import choose_backend
from fdecode.graphs.compile import Step, compile
from fdecode.graphs.inspect import GraphReport, inspect

__all__ = ["GraphReport", "Step", "choose_backend", "compile", "inspect"]
