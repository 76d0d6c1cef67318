"""Inductor's dtype rules bound once per compile (`fdecode.backends.cpu.codegen_rules`): the handler binds
its rules once however often the code generator asks for it, again when the rule tables grow, never outside
the context, and what Inductor generates inside it computes what eager does."""

from __future__ import annotations

import torch
import torch._inductor.lowering  # registers the op dtype rules, as any compile has by then
from torch._inductor import utils
from torch._inductor.dtype_propagation import DtypePropagationOpsHandler as Handler

from fdecode.backends.cpu.codegen_rules import rules_once


def counting_init(monkeypatch) -> list[int]:
    """Handler.__init__ wrapped so that each time it binds the rules is counted."""
    calls, original = [], Handler.__init__

    def init(self):
        calls.append(1)
        original(self)

    monkeypatch.setattr(Handler, "__init__", init)
    return calls


def test_rules_are_bound_once_inside_and_every_time_outside(monkeypatch):
    calls = counting_init(monkeypatch)
    wrapped = Handler.__init__
    with rules_once():
        first = [Handler() for _ in range(50)]
        assert len(calls) <= 1 and all(h is first[0] for h in first)
        assert callable(first[0].add) and callable(first[0].eq)  # the rules are bound on the singleton
    assert Handler.__init__ is wrapped  # restored on the way out
    before = len(calls)
    Handler(), Handler()
    assert len(calls) == before + 2  # Inductor's own behaviour outside the context


def test_rules_are_bound_again_when_a_rule_is_added(monkeypatch):
    calls = counting_init(monkeypatch)
    with rules_once():
        Handler()
        bound = len(calls)
        extra = dict(utils.op_dtype_propagation_rules)
        extra["fdecode_test_op"] = next(iter(extra.values()))
        monkeypatch.setattr(utils, "op_dtype_propagation_rules", extra)
        handler = Handler()
        assert len(calls) == bound + 1 and callable(handler.fdecode_test_op)
        Handler()
        assert len(calls) == bound + 1


def test_code_generated_inside_computes_what_eager_does():
    def mixed(x, i):  # int -> float promotion, a comparison cast back, a reduction
        return (x * i + (x > 0)).sum(-1), (i // 3).to(torch.float16) * x

    x, i = torch.randn(4, 37), torch.arange(37).expand(4, 37).contiguous()
    with rules_once(), torch._inductor.config.patch(fx_graph_cache=False):
        got = torch.compile(mixed, backend="inductor", fullgraph=True, dynamic=False)(x, i)
    want = mixed(x, i)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)
