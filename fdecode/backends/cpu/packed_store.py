"""oneDNN's packed layout of a checkpoint's weights, kept on disk: a warm start maps it instead of packing.

Packing a weight writes a new copy of it, and on a small CPU writing fresh memory is what costs: the real
Qwen2.5-Coder pair's 7.6 GiB of linear weights took most of a 15 s warm start to pack. A weight read
straight from a checkpoint file (`file_pages.file_backed`) is packed once: the packed bytes go to a file
here, and every process, the first included, maps that file (`onednn_blob.over`) instead of keeping a copy
in its own memory. A later process maps it without packing anything; its pages come from the page cache
as the step first reads them.

Where: `packed/` in the stored graphs' folder (`FDECODE_CACHE_DIR`, `fdecode.graphs.stored`), off with it.
A file is named by the sha256 of the weight's source (file, inode, size, modification time, offset), its
shape and dtype, torch's version and ATen's CPU capability: a changed checkpoint or another machine is
another name, and nothing stale is loaded. One file per weight: a header (the layout's description) and
the packed bytes, page-aligned; written under a temporary name and renamed, so a file is whole or absent.
It costs disk as large as the packed weights (7.6 GiB for the real pair); fdecode never deletes these
files: delete the folder to reclaim them.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import torch

from fdecode.backends.cpu import onednn_blob
from fdecode.backends.cpu.file_pages import PAGE, FileBytes

_MAGIC = b"fdpack01"
_HEADER = struct.Struct("<8sQQ")  # magic, description bytes, packed bytes


def folder() -> Path | None:
    """Where packed layouts are kept, or None where the stored graphs are off (`FDECODE_CACHE_DIR=off`)."""
    from fdecode.graphs.stored import cache_dir

    steps = cache_dir()
    return None if steps is None else steps / "packed"


def _path(where: Path, source: FileBytes, weight: torch.Tensor) -> Path:
    key = (
        source.path,
        source.inode,
        source.size,
        source.mtime_ns,
        source.offset,
        tuple(weight.shape),
        str(weight.dtype),
        torch.__version__,
        torch.backends.cpu.get_cpu_capability(),
    )
    return where / f"{hashlib.sha256(repr(key).encode()).hexdigest()[:32]}.packed"


def _map(path: Path, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(packed weight, the mapped bytes it lies in) from a stored file, or None if it is not a whole one."""
    try:
        with open(path, "rb") as file:
            magic, described, nbytes = _HEADER.unpack(file.read(_HEADER.size))
            description = file.read(described)
        start = -(-(_HEADER.size + described) // PAGE) * PAGE
        if magic != _MAGIC or len(description) != described or path.stat().st_size != start + nbytes:
            return None
    except (OSError, struct.error):
        return None
    mapped = torch.from_file(str(path), shared=False, size=start + nbytes, dtype=torch.uint8)
    memory = mapped[start:]
    return onednn_blob.over(memory, weight.shape, weight.dtype, description), memory


def load(source: FileBytes, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The stored packed layout of `weight` (read from `source`) as (packed weight, its mapped bytes), or None."""
    where = folder()
    if where is None or not onednn_blob.available():
        return None
    path = _path(where, source, weight)
    return _map(path, weight) if path.is_file() else None


def save(source: FileBytes, weight: torch.Tensor, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Store `packed` (`weight`'s packed layout) and return it mapped from the file as `load` does, or None
    where nothing can be stored (off, no room: the caller keeps `packed` in memory)."""
    where = folder()
    if where is None or not onednn_blob.available():
        return None
    path = _path(where, source, weight)
    data, description = onednn_blob.as_bytes(packed)
    header = _HEADER.pack(_MAGIC, len(description), data.nbytes) + description
    header += b"\0" * (-len(header) % PAGE)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        where.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as file:
            file.write(header)
            file.write(data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return None
    return _map(path, weight)
