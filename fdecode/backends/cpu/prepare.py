"""`inline_prepare`: an Inductor pass that compiles the fused prepare ops, `fdecode::prepare_next_draft` (a chain
step's) and `fdecode::prepare_tree_draft` (a tree step's), into a CPU step's own kernels (docs/host-time.md).

The fused op is one node in the graph Dynamo captures and AOTAutograd lowers (`fdecode.inspect` counts it
there), and on CUDA and the NPU it runs a kernel of its own. On the CPU its registered implementation is the
Python reference, so Inductor's wrapper called it as an extern: ~20 eager ATen ops dispatched from Python at
every step, the largest single host cost of a small CPU step. This pass, run after AOTAutograd on a CPU
graph only (`post_grad_custom_post_pass`), replaces each CPU node of the op by the trace of that same
reference (`prepare_next_draft_reference`; a tree step's op, `prepare_tree_draft_reference`), which Inductor then
fuses into C++ kernels like the rest of the step. The spec is the one function; tests/test_prepare_cpu.py pins the
compiled result to it.
"""

from __future__ import annotations

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.pattern_matcher import CallFunctionVarArgs, Match, PatternMatcherPass, register_graph_pattern

from fdecode.ops.prepare import prepare_next_draft_reference
from fdecode.ops.prepare_tree import prepare_tree_draft_reference

VERSION = 2  # bump when the replacement changes: Inductor's cache keys the pass by `uuid`


def _on_cpu(match: Match) -> bool:
    value = match.nodes[0].meta.get("val")
    return isinstance(value, (tuple, list)) and all(v.device.type == "cpu" for v in value)


def _patterns() -> PatternMatcherPass:
    patterns = PatternMatcherPass()
    ops = (
        (torch.ops.fdecode.prepare_next_draft.default, prepare_next_draft_reference),
        (torch.ops.fdecode.prepare_tree_draft.default, prepare_tree_draft_reference),
    )
    for op, spec in ops:
        _inline(op, spec, patterns)
    return patterns


def _inline(op, spec, patterns: PatternMatcherPass) -> None:
    """Register the replacement of each CPU call of `op` by the trace of `spec`, its reference."""

    @register_graph_pattern(CallFunctionVarArgs(op), pass_dict=patterns, extra_check=_on_cpu)
    def _(match: Match, *args, **kwargs):
        values = [*args, *kwargs.values()]  # make_fx traces positional arguments only
        tensors = [v for v in values if isinstance(v, torch.fx.Node)]
        places = [i for i, v in enumerate(values) if isinstance(v, torch.fx.Node)]

        def reference(*nodes):
            call = list(values)
            for i, node in zip(places, nodes):
                call[i] = node
            return spec(*call)

        match.replace_by_example(reference, tensors, run_functional_passes=False)


class InlinePrepare(CustomGraphPass):
    """Replaces every CPU `fdecode::prepare_next_draft` and `fdecode::prepare_tree_draft` node by the ATen ops of
    its reference."""

    def __init__(self):
        self._patterns: PatternMatcherPass | None = None  # built on first use: the op must be registered

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self._patterns is None:
            self._patterns = _patterns()
        self._patterns.apply(graph)

    def uuid(self) -> str:
        return f"fdecode-inline-prepare-v{VERSION}"


inline_prepare = InlinePrepare()
