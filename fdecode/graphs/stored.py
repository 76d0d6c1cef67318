"""Compiled step graphs kept on disk, so that a second process skips Dynamo's trace
(docs/design.md, "Backends and kernels").

Inductor's own caches (`TORCHINDUCTOR_CACHE_DIR`) let a second start skip code generation, but Dynamo
still traces the whole step again: on the real Qwen2.5-Coder pair that trace is most of a warm start.
An Inductor step here is therefore compiled ahead of its first call with Dynamo's `aot_compile` (the
same graph, guards and Inductor code as `torch.compile`) and written to one file per graph; a later
process with the same key loads the file and runs it without tracing anything.

Where: `FDECODE_CACHE_DIR`, by default `$XDG_CACHE_HOME/fdecode/steps` (`~/.cache/fdecode/steps`);
`FDECODE_CACHE_DIR=off` turns it off. A file is named by the key of everything its graph is compiled
from (`graph_key`): fdecode's source, torch, Python, the platform and ATen's CPU capability, Inductor's
config, the backend, the step function and what it closes over (the `DecodeConfig`, sampling plan, window
and depth) and each model's layout (`model_layout`: module classes, config, parameter, buffer and tensor
attribute names, shapes, strides, dtypes, devices, tied weights). The weights' values are not in it: they
are inputs of the graph, so the file serves any checkpoint of that architecture. Anything else changed
gives another key; nothing stale is ever loaded. To take a cache to another machine of the same kind, copy this folder (and, to skip the C++ builds too,
Inductor's cache or `fdecode.save_compile_cache`'s file). fdecode never deletes a file there (a new fdecode
writes files of new keys beside the old): delete the folder to reclaim its space.

Where a file cannot be loaded (damaged, stale) or a loaded graph's guards refuse its inputs, the step says
so in one line, compiles the graph ahead of time again and replaces the file; where a graph cannot be
stored (a guard Dynamo cannot serialize, a model it cannot name), it runs the plain `torch.compile` of the
same function.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import sysconfig
import types
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from fdecode.backends import cpu
from fdecode.graphs.flat import FlatCall
from fdecode.progress import notice

OFF = ("off", "0", "false", "no", "none", "")
FORMAT = 1  # bump when what a file holds changes


def cache_dir() -> Path | None:
    """The folder stored step graphs live in (`FDECODE_CACHE_DIR`), or None where it is turned off."""
    value = os.environ.get("FDECODE_CACHE_DIR")
    if value is None:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(base) / "fdecode" / "steps"
    return None if value.strip().lower() in OFF else Path(value).expanduser()


@functools.cache
def source_digest() -> str:
    """sha256 of fdecode's Python source: an edited step never loads a graph of the old code."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache
def platform() -> str:
    """What the compiled code depends on beyond the graph: torch, Python, the CPU's architecture and vector
    ISA (ATen's dispatch level, which is what Inductor's own pick, slower to ask, builds on)."""
    return (
        f"torch {torch.__version__}; python {sys.version}; {sysconfig.get_platform()}; "
        f"isa {torch.backends.cpu.get_cpu_capability()}"
    )


def inductor_config() -> str:
    """Inductor's config as its cache keys it (the settings that change generated code)."""
    from torch._inductor import config

    return repr(sorted(config.save_config_portable().items()))


def model_layout(model: torch.nn.Module) -> list:
    """A model's layout without its values: module classes, config, every parameter, buffer and plain tensor
    attribute (name, shape, strides, storage offset, dtype, device) and which are one tensor (tied weights):
    all a compiled graph assumes of its weights, so their guards can go (`serializable_guards`)."""
    first: dict[int, str] = {}
    tensors = []
    for name, module in model.named_modules(remove_duplicate=False):
        tensors.append((name, type(module).__module__, type(module).__qualname__))
        members = [
            *module._parameters.items(),
            *module._buffers.items(),
            *((k, v) for k, v in vars(module).items() if isinstance(v, torch.Tensor)),
        ]
        for attr, tensor in members:
            if tensor is None:
                continue
            full = f"{name}.{attr}" if name else attr
            alias = first.setdefault(id(tensor), full)
            tensors.append(
                (
                    full,
                    tuple(tensor.shape),
                    tensor.stride(),
                    tensor.storage_offset(),
                    str(tensor.dtype),
                    str(tensor.device),
                    alias,
                )
            )
    return [repr(getattr(model, "config", None)), tensors]


def describe(value) -> object:
    """What a value the step function closes over contributes to its key."""
    if isinstance(value, torch.nn.Module):
        return model_layout(value)
    if isinstance(value, types.FunctionType):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


def graph_key(fn: Callable, backend: str) -> str:
    """The key of `fn`'s graph under `backend` (see the module docstring)."""
    cells = [describe(cell.cell_contents) for cell in fn.__closure__ or ()]
    parts = [FORMAT, source_digest(), platform(), inductor_config(), backend, fn.__code__.co_name, cells]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def serializable_guards(models: Sequence[str]) -> Callable[[Sequence], list[bool]]:
    """Dynamo's guard filter for a stored graph whose function closes over `models` (their names): keep the
    guards a file can hold on what the key does not fix (the state's tensors, constants), drop the ones on
    globals and object identities and the tensor guards on the models' weights (hundreds on a real model,
    each checked at every call), all of which the key covers (`model_layout`)."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    roots = tuple(f"{name}." for name in models)

    def keep(entry) -> bool:
        if entry.is_global or entry.guard_type in unsupported or unsupported & set(entry.derived_guard_types):
            return False
        return not (entry.guard_type == "TENSOR_MATCH" and entry.name.startswith(roots))

    return lambda entries: [keep(entry) for entry in entries]


def plain(args: tuple) -> tuple:
    """`args` with each tensor marked dynamic replaced by an unmarked view of it: a loaded graph's guards
    check sizes against its symbolic ranges but refuse the marking itself."""
    return tuple(a.detach() if hasattr(a, "_dynamo_dynamic_indices") else a for a in args)


class StoredGraph:
    """One step graph kept on disk under its key. The first call loads the file or compiles ahead of time
    (`aot_compile`) and writes it; every call then runs the compiled graph. Where storing or loading fails,
    it runs `fallback()` (the plain `torch.compile` of the same function) and says why, once.

    fn: the pure step function; models: what it closes over that a file cannot hold (the target and draft:
    their parameters are the graph's inputs, given again at load); ahead: `fn` under `torch.compile` with
    `serializable_guards`; fallback: makes the plain capture."""

    def __init__(
        self, fn: Callable, path: Path, models: dict[str, object], ahead: Callable, fallback: Callable[[], Callable]
    ):
        self.fn = fn
        self.path = path
        self.models = models
        self._ahead = ahead
        self._fallback = fallback
        self._run: Callable | None = None
        self._ahead_of_time = False  # whether `_run` is an `aot_compile`d graph (stored or loaded)
        self.loaded = False  # whether the graph came from the file
        self._flat: FlatCall | bool | None = None  # its flat call (False: none; None: not tried yet)

    @property
    def flat_call(self) -> FlatCall | None:
        """The flat call of this graph's trusted states (`fdecode.graphs.flat`), None where there is none (yet)."""
        return self._flat or None

    def __repr__(self) -> str:
        how = "loaded" if self.loaded else "compiled" if self._run is not None else "not run yet"
        return f"StoredGraph({self.fn.__name__}, {how}, path={str(self.path)!r})"

    def __call__(self, *args):
        if self._run is None:
            with cpu.loading():  # the first call loads or builds the graph's CPU kernels (`fdecode.backends.cpu`)
                self._run = self._first(args)
                return self._call(args)
        return self._call(args)

    def _call(self, args: tuple):
        if not self._ahead_of_time:
            return self._run(*args)
        try:
            return self._run(*plain(args))
        except RuntimeError as error:
            if not str(error).startswith("GuardManager check failed"):
                raise
            notice(f"the stored step graph {self.path.name} refuses these inputs ({error}); compiling it afresh")
            if self.loaded:  # the key missed what these inputs differ in: compile for them, store that instead
                self.loaded = False
                self._run, self._flat = self._compile(args), None
                return self(*args)
            self._run, self._ahead_of_time = self._fallback(), False  # inputs that vary: Dynamo's own guards
            return self._run(*args)

    def unguarded(self, *args) -> Callable | None:
        """The compiled function behind the guard check, to call with arguments of the layout of `args`
        (`fdecode.graphs.trusted`): None where the graph is not compiled ahead of time yet or its guards
        refuse `args` now. The caller answers for every later call's layout."""
        if self._run is None or not self._ahead_of_time or not self._run.guard_check(*plain(args)):
            return None
        if self._flat is None:  # Inductor's graph called with the leaves in a learnt order (`fdecode.graphs.flat`)
            self._flat = FlatCall.make(self._run, args, self.models.values(), plain) or False
        if self._flat:
            return self._flat
        compiled = self._run.fn
        return lambda *call: compiled(*plain(call))

    def _first(self, args: tuple) -> Callable:
        if self.path.exists():
            try:
                return self._load()
            except Exception as error:
                notice(
                    f"could not load the stored step graph {self.path} ({type(error).__name__}: {error}); "
                    "compiling it afresh"
                )
        return self._compile(args)

    def _compile(self, args: tuple) -> Callable:
        """Compile ahead of time for `args` and store the graph; the plain capture where that fails."""
        self._ahead_of_time = True
        try:
            compiled = self._ahead.aot_compile((args, {}))
        except Exception as error:
            notice(f"this step graph cannot be stored ({type(error).__name__}: {error}); compiling it as usual")
            self._ahead_of_time = False
            return self._fallback()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            compiled.save_compiled_function(str(self.path), external_data=self.models)
        except Exception as error:
            notice(f"could not store the step graph in {self.path} ({type(error).__name__}: {error})")
        return compiled

    def _load(self) -> Callable:
        from torch._guards import TracingContext, tracing

        # Unpickling the guards installs guards of their own, which needs a tracing context to go into.
        with self.path.open("rb") as file, tracing(TracingContext(None)):
            compiled = torch.compiler.load_compiled_function(
                file, f_globals=self.fn.__globals__, external_data=self.models
            )
        self.loaded = self._ahead_of_time = True
        return compiled
