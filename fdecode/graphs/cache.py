"""Where compiled steps are cached, and how to take the cache to another machine.

Inductor caches what it compiles on disk: the FX graph cache (generated code and built kernels,
keyed by the graph, its inputs' metadata, the Inductor config and the torch version) and the
AOTAutograd cache, under `TORCHINDUCTOR_CACHE_DIR` (default `/tmp/torchinductor_<user>`). A second
process that compiles the same step (same models' shapes and dtypes, same `DecodeConfig` fields that
shape the graph: K, max_batch, max_seq_len, block_size, sampling plan, layer_regions, device) finds
those entries and skips code generation and the C++ (or Triton) builds; Dynamo still traces the step.
A different torch version, Inductor config, compiler or CPU/GPU architecture, or an fdecode version
that traces another graph, misses the cache and compiles afresh (nothing stale is ever used).

To take compiled artifacts to a machine with an empty cache (a new container, a CI runner):

    step.warmup()                                   # compile every graph this process will run
    fdecode.save_compile_cache("step.cache")        # everything this process compiled, one file
    ...
    fdecode.load_compile_cache("step.cache")        # on the other machine, before fdecode.compile
    step = fdecode.compile(target, draft, cfg)      # its graphs load instead of compiling

(`torch.compiler.save_cache_artifacts` / `load_cache_artifacts`: the file holds the process's
Inductor, AOTAutograd and autotuning entries.)
"""

from __future__ import annotations

from pathlib import Path

import torch


def save_compile_cache(path: str | Path) -> dict[str, int]:
    """Write what this process compiled with Inductor (or loaded from its cache) to `path`, one file.
    Returns the entries per kind ({} and no file where nothing was compiled)."""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return {}
    data, info = saved
    Path(path).write_bytes(data)
    return _counts(info)


def load_compile_cache(path: str | Path) -> dict[str, int]:
    """Put the artifacts `save_compile_cache` wrote into this process's caches; call it before the steps
    compile. Returns the entries per kind."""
    info = torch.compiler.load_cache_artifacts(Path(path).read_bytes())
    return {} if info is None else _counts(info)


def _counts(info) -> dict[str, int]:
    return {kind: len(keys) for kind, keys in info.artifacts.items() if keys}
