"""Flat calls of a stored step graph: Inductor's compiled graph called with the state's leaves in an order
learnt once (docs/host-time.md, "Flat calls of a trusted graph").

A trusted call (`fdecode.graphs.trusted`) skips Dynamo's guards, yet every step still ran Dynamo's bytecode
(read each leaf and weight by attribute, call the graph through `torch._dynamo.disable` wrappers, build the
new state field by field) and AOTAutograd's runtime wrapper (bump the mutated inputs' versions, switch grad
off, check the outputs): ~0.06-0.09 ms of the micro model's ~1 ms step. `FlatCall` learns once what those
layers do for one graph and then does only that:

- which state leaf, weight or window size each graph input is, and where each output goes in the returned
  `(state, out)`: from Dynamo's own bytecode run once on a probe (a state whose leaves are markers, a
  backend that records its arguments and returns markers), so nothing is guessed from values;
- that AOTAutograd hands Inductor's `CompiledFxGraph` those inputs as they are and returns its outputs as
  they are, bumping the versions of the same inputs each time: by watching the first real call, which must
  agree with the probe's map in every input, output and version, or the graph keeps its usual call.

Only `StoredGraph.unguarded` makes one, so only a state whose guards passed runs it: one `TrustedStates` vouches
for (the layout of the graph that made it, guards checked once per pair of graphs), or one whose guards were
just checked for it alone (a prefilled or primed state, after the Step's checks); a state the guards refuse
goes through Dynamo as before.
The step function is pure (`fdecode.step`), so the bytecode replays no side effect a flat call would skip:
all it does besides the graph call is read the inputs and build the result.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import torch
from torch._inductor.output_code import CompiledFxGraph

_WATCH = threading.Lock()  # one watched first call at a time: it swaps `CompiledFxGraph.__call__`


class Unmapped(Exception):
    """The bytecode did something a flat call does not replay (the graph keeps its usual call)."""


class _Marker:
    """A probe value: stands for an input of the step function, `expr` reads it from a call's `state` and
    `extra` (the arguments after the state)."""

    __slots__ = ("expr",)

    def __init__(self, expr: str):
        self.expr = expr


class _Extra:
    """The probe of an extra tensor argument (the window of the graph of every window): only its sizes are read."""

    def __init__(self, index: int):
        self.index = index

    def size(self, dim: int) -> _Marker:
        if type(dim) is not int:
            raise Unmapped(f"a size read as size({dim!r})")
        return _Marker(f"extra[{self.index}].size({dim})")


class _Outputs:
    """What the probe's backend returns: indexing it gives the output markers."""

    def __getitem__(self, index):
        if type(index) is not int:
            raise Unmapped(f"graph outputs read as [{index!r}]")
        return _Marker(f"outs[{index}]")


def _probe(value: object, expr: str, probes: dict[int, str]) -> object:
    """A probe of the state `value` read by `expr`: a dataclass of probes, a marker for anything else."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and hasattr(value, "__dict__"):
        probe = object.__new__(type(value))
        for name, leaf in vars(value).items():
            if not name.isidentifier():
                raise Unmapped(f"a state attribute named {name!r}")
            vars(probe)[name] = _probe(leaf, f"{expr}.{name}", probes)
        probes[id(probe)] = expr
        return probe
    return _Marker(expr)


class _Source:
    """The generated code's globals: each object the expressions name (weights' owners, classes, constants)."""

    def __init__(self) -> None:
        self.globals: dict[str, object] = {"_new": _new}
        self._names: dict[int, str] = {}

    def name(self, value: object) -> str:
        name = self._names.get(id(value))
        if name is None:
            name = self._names[id(value)] = f"_g{len(self._names)}"
            self.globals[name] = value
        return name

    def function(self, args: str, body: str) -> Callable:
        code = f"def generated({args}):\n    return {body}\n"
        namespace = dict(self.globals)
        exec(compile(code, "<fdecode flat call>", "exec"), namespace)
        return namespace["generated"]


def _new(cls: type, fields: dict) -> object:
    new = cls.__new__(cls)  # as Dynamo's bytecode builds it: no __init__, the attributes set directly
    vars(new).update(fields)
    return new


def _weights(models, source: _Source) -> dict[int, str]:
    """id -> expression of every parameter, buffer and tensor attribute of `models`, read from its module's
    dict at each call (as Dynamo's bytecode does: a weight replaced by another object is the new one)."""
    found: dict[int, str] = {}
    for model in models:
        if not isinstance(model, torch.nn.Module):
            continue
        for module in model.modules():
            for owner in (module._parameters, module._buffers, vars(module)):
                for key, tensor in owner.items():
                    if isinstance(tensor, torch.Tensor) and id(tensor) not in found:
                        found[id(tensor)] = f"{source.name(owner)}[{source.name(key)}]"
    return found


def _input(arg: object, weights: dict[int, str]) -> str:
    if isinstance(arg, _Marker):
        return arg.expr
    if isinstance(arg, torch.Tensor) and id(arg) in weights:
        return weights[id(arg)]
    raise Unmapped(f"a graph input ({type(arg).__name__}) that is neither a state leaf nor a model's weight")


def _output(value: object, probes: dict[int, str], source: _Source) -> str:
    """The expression that makes `value` of the probe's result from a call's state, extra and graph outputs."""
    if isinstance(value, _Marker):
        return value.expr
    if id(value) in probes:  # a part of the input state passed through whole
        return probes[id(value)]
    if type(value) is tuple:
        return "(" + "".join(f"{_output(v, probes, source)}, " for v in value) + ")"
    if value is None or type(value) in (int, float, bool, str):
        return source.name(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and hasattr(value, "__dict__"):
        fields = ", ".join(f"{name!r}: {_output(v, probes, source)}" for name, v in vars(value).items())
        return f"_new({source.name(type(value))}, {{{fields}}})"
    raise Unmapped(f"the step returns a {type(value).__name__} the flat call cannot rebuild")


class FlatCall:
    """`compiled` (an `aot_compile`d step: Dynamo's bytecode function `compiled.fn` over its backend) called
    flat: the inputs read in their learnt order, Inductor's compiled graph called, the outputs placed.
    `FlatCall.make` returns None where the probe cannot map the bytecode; the first call is watched, and if it
    disagrees with the map, every call runs the bytecode (`compiled.fn`) as before."""

    def __init__(self, compiled, inputs: Callable, result: Callable, graph: CompiledFxGraph, plain: Callable):
        self._fn = compiled.fn
        self._plain = plain
        self._backend = compiled._artifacts.backend_id
        self._inputs = inputs
        self._result = result
        self._graph = graph
        self._bumped: tuple[int, ...] = ()  # inputs whose version AOTAutograd's wrapper bumps (mutated in place)
        self.flat: bool | None = None  # None: the first call is still to be watched; False: the bytecode runs
        self.watched = 0  # calls watched so far (one, unless `flat` is set back to None)

    @classmethod
    def make(cls, compiled, args: tuple, models, plain: Callable[[tuple], tuple]) -> FlatCall | None:
        """The flat call of `compiled` for arguments of the layout of `args` (the state, then the window argument
        of the graph of every window), or None where the bytecode cannot be mapped (`Unmapped`) or its graph is
        not Inductor's. models: what the step closes over (their weights are graph inputs); plain: what the
        bytecode's arguments go through (`fdecode.graphs.stored.plain`)."""
        state, extra = args[0], args[1:]
        graph = _compiled_graph(compiled)
        if graph is None:
            return None
        probes: dict[int, str] = {}
        source = _Source()
        calls = []

        def backend(*args):
            calls.append(args)
            return _Outputs()

        globals_ = compiled.fn.__globals__
        name = compiled._artifacts.backend_id
        real, globals_[name] = globals_[name], backend
        try:
            probe = _probe(state, "state", probes)  # (held: `probes` is by id)
            result = compiled.fn(probe, *(_Extra(i) for i in range(len(extra))))
            if len(calls) != 1:
                raise Unmapped(f"the bytecode calls its graph {len(calls)} times")
            weights = _weights(models, source)
            inputs = source.function("state, extra", "[" + ", ".join(_input(a, weights) for a in calls[0]) + "]")
            plan = source.function("state, extra, outs", _output(result, probes, source))
        except Exception:  # anything the probe cannot stand in for (`Unmapped`, a marker used as a value, ...)
            return None
        finally:
            globals_[name] = real
        return cls(compiled, inputs, plan, graph, plain)

    def __call__(self, state, *extra):
        if not self.flat:
            if self.flat is None:
                return self._watched(state, extra)
            return self._fn(*self._plain((state, *extra)))
        args = self._inputs(state, extra)
        mutated = [args[i] for i in self._bumped]
        grad = torch.is_grad_enabled()
        if grad:
            torch._C._set_grad_enabled(False)
        try:
            outs = self._graph(args)  # Inductor's call empties `args`
        finally:
            if grad:
                torch._C._set_grad_enabled(True)
        if mutated:
            torch.autograd.graph.increment_version(mutated)
        return self._result(state, extra, outs)

    def _watched(self, state, extra: tuple):
        """The first call, through the bytecode and AOTAutograd as usual, watched: the flat calls start only if
        the graph got exactly the map's inputs, returned the outputs unchanged and bumped the same versions."""
        self.watched += 1
        args = self._inputs(state, extra)
        seen: dict[str, object] = {}
        globals_, real = self._fn.__globals__, self._fn.__globals__[self._backend]
        graph, call, thread = self._graph, CompiledFxGraph.__call__, threading.get_ident()

        def backend(*inputs):
            seen["inputs"], seen["before"] = inputs, _versions(inputs)
            outs = real(*inputs)
            seen["outs"], seen["after"] = outs, _versions(inputs)
            return outs

        def watch(compiled_graph, inputs):
            if compiled_graph is not graph or threading.get_ident() != thread:
                return call(compiled_graph, inputs)
            seen.setdefault("graph", []).append(list(inputs))
            seen["graph_before"] = _versions(inputs)
            outs = call(compiled_graph, inputs)
            seen["graph_outs"], seen["graph_after"] = outs, _versions(seen["graph"][-1])
            return outs

        with _WATCH:
            globals_[self._backend] = backend
            CompiledFxGraph.__call__ = watch
            try:
                result = self._fn(*self._plain((state, *extra)))
            finally:
                CompiledFxGraph.__call__ = call
                globals_[self._backend] = real
        try:
            rebuilt = self._result(state, extra, seen["outs"])
        except Exception:  # the outputs are not what the probe read (`seen` without them: no graph call)
            rebuilt = None
        self.flat = rebuilt is not None and agrees(args, seen, result, rebuilt)
        if self.flat:  # the inputs AOTAutograd's wrapper bumps (the graph's own in-place writes bump their own)
            wrapper = [a - b for a, b in zip(seen["after"], seen["before"])]
            own = [a - b for a, b in zip(seen["graph_after"], seen["graph_before"])]
            self._bumped = tuple(i for i, (w, g) in enumerate(zip(wrapper, own)) if w - g == 1)
            self.flat = all(w - g in (0, 1) for w, g in zip(wrapper, own))
        return result


def _compiled_graph(compiled) -> CompiledFxGraph | None:
    """Inductor's compiled graph behind an `aot_compile`d function's backend (AOTAutograd's wrappers are
    `functools.wraps` of it), or None."""
    fn = getattr(compiled._artifacts.compiled_fn, "compiled_fn", None)
    for _ in range(16):
        if fn is None or isinstance(fn, CompiledFxGraph):
            return fn
        fn = getattr(fn, "__wrapped__", None)
    return None


def _versions(values) -> list[int]:
    return [v._version if isinstance(v, torch.Tensor) else 0 for v in values]


def agrees(args: list, seen: dict, result, rebuilt) -> bool:
    """Whether the watched call ran exactly what the flat call would: the same inputs (the very objects; sizes
    equal), one graph call with them, its outputs returned as they are, and the same result rebuilt."""
    inputs, graph = seen.get("inputs"), seen.get("graph")
    if inputs is None or graph is None or len(graph) != 1 or len(inputs) != len(args):
        return False
    if not all(a is b or (type(a) is int and type(b) is int and a == b) for a, b in zip(args, inputs)):
        return False
    if len(graph[0]) != len(inputs) or not all(a is b for a, b in zip(graph[0], inputs)):
        return False
    outs, graph_outs = seen["outs"], seen["graph_outs"]
    if len(outs) != len(graph_outs) or not all(a is b for a, b in zip(outs, graph_outs)):
        return False
    if any(hasattr(out, "_dynamo_dynamic_indices") for out in outs):  # AOTAutograd marked them: not replayed
        return False
    return _same(result, rebuilt)


def _same(a, b) -> bool:
    """The same objects at every leaf, the same types and attributes of the objects rebuilt."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if type(a) is tuple:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) or not hasattr(a, "__dict__"):
        return a == b if type(a) in (int, float, bool, str) else False
    va, vb = vars(a), vars(b)
    return va.keys() == vb.keys() and all(_same(va[k], vb[k]) for k in va)
