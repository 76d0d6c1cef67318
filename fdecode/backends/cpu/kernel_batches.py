"""A CPU graph's C++ kernels built as a few shared libraries, not one library each
(docs/design.md, "What a cold CPU compile pays for").

Inductor writes each CPU kernel of a graph as a C++ file of its own and builds each into a shared library
with Python bindings, one g++ run per kernel. Every run pays the same fixed cost before it reaches the
kernel: loading Inductor's precompiled header (155 MB) and instantiating the templates of ATen's vector
headers that it pulls in, ~0.65 s of the ~1 s a kernel build takes on this project's CPU. A step graph has
30-60 kernels, so most of its C++ time is that fixed cost, paid again and again (`python bench/cold_start.py
--compare-batches` measures it).

While `batched_cpu_kernels()` is active, the kernels a generated graph module asks Inductor for
(`AsyncCompile.cpp_pybinding`, one call per kernel as the module loads) are collected instead of built.
When the module waits for its kernels (`AsyncCompile.wait`), they are written into as many C++ files as
Inductor has compile workers (one for each, balanced by source length; one file, built in the process,
where it compiles without workers, as fdecode's tests do), kernel i renamed `kernel_i` and bound as a
function of one Python module, and built through Inductor's own cache
(`CppPythonBindingsCodeCache.load_async`: its compiler flags, precompiled header, worker pool and file
locks); the module then holds the built functions, as it would have. The kernels' code is unchanged, so the
graph computes what it did. A kernel some library already holds (graphs of one step share most of their
kernels: every sampling plan's graph has the same layers) is taken from it rather than built again
(`BuiltKernels`: in the process, and across processes through a small file per kernel in Inductor's
cache folder), so a second graph builds only its new kernels, and a second process that loads a graph
builds none. A kernel whose arguments the bindings below do not parse and a batch that
fails to build fall back to Inductor's one-library-per-kernel path (the latter with a notice).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

from fdecode.progress import notice

# The one line of a kernel's signature Inductor writes (torch 2.13): renamed per kernel in a batch.
_ENTRY = 'extern "C"  void  kernel('
_INCLUDE = re.compile(r"^#include .*$", re.M)
# Scalar argument types the bindings parse; any pointer type is a tensor's data pointer.
_SCALARS = {"int64_t": "PyLong_AsSsize_t", "float": "PyFloat_AsDouble"}

_BINDINGS = r"""
// Python bindings of the kernels above, one function each in the module `kernel` (fdecode.backends.cpu.kernel_batches)
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <type_traits>

static void* (*fdecode_tensor_data)(PyObject*);

template <typename T> static inline T fdecode_arg(PyObject* args, Py_ssize_t n) {
    static_assert(std::is_pointer_v<T>, "a kernel argument is a pointer, int64_t or float");
    return static_cast<T>(fdecode_tensor_data(PyTuple_GET_ITEM(args, n)));
}
template <> inline int64_t fdecode_arg<int64_t>(PyObject* args, Py_ssize_t n) {
    auto value = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, n));
    if (value == -1 && PyErr_Occurred()) throw std::runtime_error("expected an int argument");
    return value;
}
template <> inline float fdecode_arg<float>(PyObject* args, Py_ssize_t n) {
    auto value = PyFloat_AsDouble(PyTuple_GET_ITEM(args, n));
    if (value == -1.0 && PyErr_Occurred()) throw std::runtime_error("expected a float argument");
    return static_cast<float>(value);
}

static void fdecode_check(PyObject* args, Py_ssize_t count) {
    if (!PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != count)
        throw std::runtime_error("a kernel called with the wrong number of arguments");
}

#define FDECODE_BINDING(name, count, call)                                          \
    static PyObject* name##_py(PyObject*, PyObject* args) {                         \
        try {                                                                       \
            fdecode_check(args, count);                                             \
            call;                                                                   \
            Py_RETURN_NONE;                                                         \
        } catch (std::exception const& error) {                                     \
            PyErr_SetString(PyExc_RuntimeError, error.what());                      \
            return nullptr;                                                         \
        } catch (...) {                                                             \
            PyErr_SetString(PyExc_RuntimeError, "a kernel raised an unknown error"); \
            return nullptr;                                                         \
        }                                                                           \
    }

{bindings}

static PyMethodDef fdecode_methods[] = {
{methods}
    {nullptr, nullptr, 0, nullptr}};

static struct PyModuleDef fdecode_module = {PyModuleDef_HEAD_INIT, "kernel", nullptr, -1, fdecode_methods};

// Inductor's loader puts the address of its tensor data-pointer function in this variable before loading.
PyMODINIT_FUNC PyInit_kernel(void) {
    const char* address = std::getenv("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
    char* end = nullptr;
    errno = 0;
    uintptr_t value = address == nullptr ? 0 : std::strtoull(address, &end, 10);
    if (value == 0 || errno != 0 || end == address) {
        PyErr_SetString(PyExc_RuntimeError, "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR is not set");
        return nullptr;
    }
    fdecode_tensor_data = reinterpret_cast<void* (*)(PyObject*)>(value);
    return PyModule_Create(&fdecode_module);
}
"""


def _parsed_type(argtype: str) -> str | None:
    """The C++ type a binding parses an argument of `argtype` as (Inductor's spelling), or None if it cannot."""
    plain = argtype.replace("const ", "").strip()
    if plain.endswith("*") or plain in _SCALARS:
        return plain
    return None


def batchable(argtypes: Sequence[str], source: str) -> bool:
    """Whether a kernel can go in a batch: one entry point as Inductor writes it, arguments the bindings parse."""
    return source.count(_ENTRY) == 1 and all(_parsed_type(t) is not None for t in argtypes)


def batch_source(kernels: Sequence[tuple[Sequence[str], str]]) -> str:
    """One C++ file holding `kernels` ((argtypes, source) each, `batchable`): kernel i renamed `kernel_i`, each
    bound as the function `kernel_i` of one Python module named `kernel`."""
    includes: dict[str, None] = {}
    bodies, bindings, methods = [], [], []
    for i, (argtypes, source) in enumerate(kernels):
        includes.update(dict.fromkeys(_INCLUDE.findall(source)))
        bodies.append(_INCLUDE.sub("", source).replace(_ENTRY, f'extern "C" void kernel_{i}('))
        args = ", ".join(f"fdecode_arg<{_parsed_type(t)}>(args, {n})" for n, t in enumerate(argtypes))
        bindings.append(f"FDECODE_BINDING(kernel_{i}, {len(argtypes)}, kernel_{i}({args}))")
        methods.append(f'    {{"kernel_{i}", kernel_{i}_py, METH_VARARGS, ""}},')
    tail = _BINDINGS.replace("{bindings}", "\n".join(bindings)).replace("{methods}", "\n".join(methods))
    return "\n".join([*includes, *bodies, tail])


def groups(sizes: Sequence[int], count: int) -> list[list[int]]:
    """Indices 0..len(sizes)-1 split into at most `count` groups of near-equal total size (largest first into
    the lightest group), each in ascending order; the same sizes always give the same groups."""
    count = max(1, min(count, len(sizes)))
    bins: list[list[int]] = [[] for _ in range(count)]
    totals = [0] * count
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        lightest = min(range(count), key=lambda b: (totals[b], b))
        bins[lightest].append(i)
        totals[lightest] += sizes[i]
    return [sorted(b) for b in bins if b]


class BuiltKernels:
    """Which library holds each kernel already built, so that a kernel two graphs share (the sampling plans'
    graphs share every layer's) is built once: in this process (a dict), and across processes on one
    Inductor cache (a small file per kernel in its folder `fdecode-kernels`, naming the library and the
    function). Keyed by the kernel's source and argument types, torch's version, the vector ISA and its
    flags, and Inductor's C++ options (`cpp.*`: the compiler among them), so a library is never taken for
    another CPU, torch or compiler."""

    def __init__(self) -> None:
        self.loaded: dict[tuple[Path, str], object] = {}  # (Inductor's cache folder, key) -> function

    @staticmethod
    def context() -> str:
        """What a library is built for besides its kernels' source: torch, the vector ISA, the C++ options."""
        import torch
        from torch._inductor import config
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        isa = pick_vec_isa()
        cpp = sorted(
            (name, repr(value)) for name, value in config.get_config_copy().items() if name.startswith("cpp.")
        )  # the compiler and its options
        return "\n".join([torch.__version__, str(isa), isa.build_arch_flags(), repr(cpp)])

    @staticmethod
    def key(context: str, argtypes: Sequence[str], source: str) -> str:
        text = "\n".join([context, ",".join(argtypes), source])
        return hashlib.sha256(text.encode()).hexdigest()[:40]

    @staticmethod
    def folder() -> Path:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return Path(cache_dir()) / "fdecode-kernels"

    def find(self, context: str, argtypes: Sequence[str], source: str):
        """The built function of this kernel (`context`: `context()`), or None where no library holds it."""
        key, folder = self.key(context, argtypes, source), self.folder()
        function = self.loaded.get((folder, key))
        if function is not None:
            return function
        try:
            library, name = (folder / key).read_text().split("\n")[:2]
            if not Path(library).exists():
                return None
            from torch._inductor.codecache import CppPythonBindingsCodeCache

            module = CppPythonBindingsCodeCache._load_library(library, Path(library).name.split(".")[0])
            function = self.loaded[folder, key] = getattr(module, name)
        except (OSError, ValueError, AttributeError, ImportError):  # not built, or a stale entry: build it
            return None
        return function

    def add(self, context: str, argtypes: Sequence[str], source: str, module, name: str) -> None:
        """Record that `module` (a library built for `context`) holds this kernel as `name`."""
        key, folder = self.key(context, argtypes, source), self.folder()
        self.loaded[folder, key] = getattr(module, name)
        with contextlib.suppress(OSError):  # the next process builds it again, nothing worse
            folder.mkdir(parents=True, exist_ok=True)
            entry = folder / f"{key}.{os.getpid()}.tmp"
            entry.write_text(f"{module.__file__}\n{name}\n")
            entry.replace(folder / key)


BUILT = BuiltKernels()


class _Batch:
    """The kernels one generated module (one `AsyncCompile`) has asked for and not yet built."""

    def __init__(self, async_compile, original) -> None:
        self.async_compile = async_compile
        self.original = original  # Inductor's `cpp_pybinding`: the fallback
        self.pending: list[tuple[Sequence[str], str, _BatchedKernel]] = []

    def add(self, argtypes: Sequence[str], source: str) -> _BatchedKernel:
        kernel = _BatchedKernel(self)
        self.pending.append((list(argtypes), source, kernel))
        return kernel

    def build(self) -> None:
        """Build every pending kernel that no library holds yet (`BUILT`), in as many libraries as Inductor has
        compile workers; the others come from the libraries that hold them."""
        from torch._inductor.async_compile import get_compile_threads
        from torch._inductor.codecache import CppPythonBindingsCodeCache

        context, pending = BUILT.context(), []
        for argtypes, source, kernel in self.pending:
            kernel.function = BUILT.find(context, argtypes, source)
            if kernel.function is None:
                pending.append((argtypes, source, kernel))
        self.pending = []
        workers = get_compile_threads()
        submit = self.async_compile.submit if workers > 1 else None  # one worker: built here, in turn
        loads = []
        for part in groups([len(source) for _, source, _ in pending], workers):
            kernels = [pending[i] for i in part]
            try:
                code = batch_source([(argtypes, source) for argtypes, source, _ in kernels])
                loads.append((kernels, CppPythonBindingsCodeCache.load_async(code, "cpu", submit_fn=submit)))
            except Exception as error:
                self._fallback(kernels, error)
        for kernels, load in loads:
            try:
                module = load()
            except Exception as error:
                self._fallback(kernels, error)
                continue
            for i, (argtypes, source, kernel) in enumerate(kernels):
                kernel.function = getattr(module, f"kernel_{i}")
                BUILT.add(context, argtypes, source, module, f"kernel_{i}")

    def _fallback(self, kernels, error: Exception) -> None:
        notice(
            f"could not build {len(kernels)} CPU kernels together ({type(error).__name__}: {error}); "
            "building each on its own"
        )
        for argtypes, source, kernel in kernels:
            kernel.function = self.original(self.async_compile, argtypes, source)


class _BatchedKernel(Future):
    """What the generated module holds for a collected kernel until `AsyncCompile.wait` asks for its result
    (it waits on every `Future` in the module): the first such call builds the batch."""

    def __init__(self, batch: _Batch) -> None:
        super().__init__()
        self.batch = batch
        self.function = None

    def result(self, timeout: float | None = None):
        if self.function is None:
            self.batch.build()
        function = self.function
        # A fallback's result is Inductor's own future of the kernel.
        return function.result(timeout) if hasattr(function, "result") else function


_lock = threading.Lock()
_active = 0
_originals: dict[str, object] = {}


def _collect(self, argtypes, source_code, *args, **kwargs):
    """`AsyncCompile.cpp_pybinding` while batching: a kernel joins its module's batch (or is built as usual)."""
    if args or kwargs or not batchable(argtypes, source_code):
        return _originals["cpp_pybinding"](self, argtypes, source_code, *args, **kwargs)
    batch = self.__dict__.get("_fdecode_batch")
    if batch is None:
        batch = self._fdecode_batch = _Batch(self, _originals["cpp_pybinding"])
    return batch.add(argtypes, source_code)


def _wait(self, scope: dict) -> None:
    """`AsyncCompile.wait` while batching: build the module's batch, put its kernels in the module, then wait
    for the rest as Inductor does (with one compile worker, Inductor's wait resolves nothing itself)."""
    batch = self.__dict__.get("_fdecode_batch")
    if batch is not None and batch.pending:
        batch.build()
    for name, value in list(scope.items()):
        if isinstance(value, _BatchedKernel):
            scope[name] = value.result()
    return _originals["wait"](self, scope)


@contextlib.contextmanager
def batched_cpu_kernels() -> Iterator[None]:
    """Inside it, CPU kernels of graphs that compile or load are built a few to a library (module docstring).
    Nests; Inductor's own path is back once the outermost exits."""
    global _active
    from torch._inductor.async_compile import AsyncCompile

    with _lock:
        _active += 1
        if _active == 1:
            _originals.update(cpp_pybinding=AsyncCompile.cpp_pybinding, wait=AsyncCompile.wait)
            AsyncCompile.cpp_pybinding, AsyncCompile.wait = _collect, _wait
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                AsyncCompile.cpp_pybinding = _originals["cpp_pybinding"]
                AsyncCompile.wait = _originals["wait"]
