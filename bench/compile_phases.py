"""Wall seconds of a compile's phases, by timing the torch functions that run them (`bench/cold_start.py --phases`).

Each phase is the cumulative wall time of one function over the process, its outermost calls only (a
region's subgraph is lowered and generated inside its parent graph's call); phases nest inside each other
(code generation inside fx_codegen_and_compile inside aot_compile). A torch release that renames one of
these functions drops that phase from the report rather than failing.

    from compile_phases import CompilePhases
    phases = CompilePhases()   # installs the timers
    ...                        # compile
    phases.seconds()           # {"dynamo trace": 13.6, ...}
"""

from __future__ import annotations

import collections
import functools
import importlib
import time

# (phase, module, attribute): the function whose calls the phase is; "Class.method" for a method.
PHASES = (
    ("aot_compile (all of it)", "torch._dynamo.aot_compile", "aot_compile_fullgraph"),
    ("dynamo trace", "torch._dynamo.convert_frame", "fullgraph_capture"),
    ("post-grad passes", "torch._inductor.compile_fx", "_recursive_post_grad_passes"),
    ("inductor: fx_codegen_and_compile", "torch._inductor.compile_fx", "fx_codegen_and_compile"),
    ("inductor: lowering", "torch._inductor.graph", "GraphLowering.run"),
    ("inductor: fusion (Scheduler)", "torch._inductor.scheduler", "Scheduler.__init__"),
    ("inductor: code generation", "torch._inductor.graph", "GraphLowering.codegen"),
    ("inductor: waiting for C++ builds", "torch._inductor.async_compile", "AsyncCompile.wait"),
)


class CompilePhases:
    def __init__(self) -> None:
        self.totals: collections.Counter[str] = collections.Counter()
        self._depth: collections.Counter[str] = collections.Counter()
        for phase, module, attribute in PHASES:
            owner = importlib.import_module(module)
            *path, name = attribute.split(".")
            for part in path:
                owner = getattr(owner, part, None)
            if owner is not None and hasattr(owner, name):
                setattr(owner, name, self._timed(phase, getattr(owner, name)))

    def _timed(self, phase: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            self._depth[phase] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth[phase] -= 1
                if not self._depth[phase]:
                    self.totals[phase] += time.perf_counter() - start

        return timed

    def seconds(self) -> dict[str, float]:
        """Each phase's seconds so far, in `PHASES` order."""
        return {phase: round(self.totals[phase], 2) for phase, _, _ in PHASES if phase in self.totals}

    def since(self, before: dict[str, float]) -> dict[str, float]:
        """Each phase's seconds since `before` (an earlier `seconds()`)."""
        return {k: round(v - before.get(k, 0.0), 2) for k, v in self.seconds().items() if v - before.get(k, 0.0) > 0}
