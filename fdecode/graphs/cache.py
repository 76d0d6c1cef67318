"""Where compiled steps are cached, and how to take the cache to another machine
(docs/design.md, "Backends and kernels").

Inductor caches what it compiles on disk, under `TORCHINDUCTOR_CACHE_DIR` (default
`/tmp/torchinductor_<user>`): a second process that compiles the same step (same models' shapes
and dtypes, same graph-shaping `DecodeConfig` fields) skips code generation and the kernel builds;
another torch, Inductor config, compiler or machine misses and compiles afresh (nothing stale is
ever used). To take compiled artifacts to a machine with an empty cache (a new container, a CI runner):

    step.warmup()                                   # compile every graph this process will run
    fdecode.save_compile_cache("step.cache")        # everything this process compiled, one file
    ...
    fdecode.load_compile_cache("step.cache")        # on the other machine, before fdecode.compile
    step = fdecode.compile(target, draft, cfg)      # its graphs load instead of compiling

The step graphs themselves (what Dynamo traced, which this file does not hold) are kept apart, in
`FDECODE_CACHE_DIR` (`fdecode.graphs.stored`): copy that folder too, and the other machine skips the
trace as well. Save the file in the process that compiled: a process that loaded its graphs from that
folder built nothing through these caches.
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
