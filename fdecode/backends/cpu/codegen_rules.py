"""Inductor's dtype rules bound once per compile, not once per generated line of C++.

Inductor's code generator asks a `DtypePropagationOpsHandler()` for the dtype of every op it writes
(torch 2.13: `CSEProxy._default`, several times per op: scalar, vector and tail kernels). The handler is
a singleton, but Python runs its `__init__` at each of those calls, and that `__init__` binds a fresh
partial for each of several hundred op rules. On the full-feature test step (`tests/test_lossless.py`,
124 fused nodes) that was 45,649 runs, about a seventh of `compile_fx` under cProfile.

Inside `rules_once()` the rules are bound again only when the rule tables have grown since they were
last bound (Inductor adds rules as its modules load); outside it, Inductor is untouched. The handler's
answers are the same either way: it is stateless apart from those bound rules.
"""

from __future__ import annotations

import contextlib

_BOUND = "_fdecode_rules_bound"  # the rule tables' sizes when the singleton's rules were last bound


@contextlib.contextmanager
def rules_once():
    """Within: `DtypePropagationOpsHandler()` binds its rules only when the tables changed since last time."""
    from torch._inductor import utils
    from torch._inductor.codegen import common
    from torch._inductor.dtype_propagation import DtypePropagationOpsHandler as Handler

    original = Handler.__init__

    def init(self) -> None:  # `boolean_ops()`, the third table, is a constant
        sizes = (len(utils.op_dtype_propagation_rules), len(common.pointwise_overrides_data))
        if self.__dict__.get(_BOUND) != sizes:
            original(self)
            self.__dict__[_BOUND] = sizes

    Handler.__init__ = init
    try:
        yield
    finally:
        Handler.__init__ = original
