"""A weight read straight from a checkpoint file, and giving its memory back once it is packed.

`fdecode.models.from_hf` reads a checkpoint folder through safetensors, which maps the file into the
process: a weight of the dtype it is loaded in is the file's own bytes, resident only once touched, and
the kernel can always read them again from the file. Once `onednn_packed` holds a weight's packed layout,
`release` drops the original's pages from the process (`madvise(MADV_DONTNEED)`): the packed copy then
replaces the original in memory, and whatever still reads the original (an eager baseline, `save_hf`, an
embedding tied to the LM head) gets the same bytes back from the file, page by page. Nothing is freed
that cannot come back unchanged: `file_backed` takes a weight only where every page the process holds
of it is still the file's (`/proc/self/pagemap`: a page written since, copy-on-write, is not).

`file_backed` also names the bytes (file, inode, size, modification time, offset), which is what keys the
packed layout kept on disk (`packed_store`). Linux only; elsewhere nothing is file-backed.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass

import torch

PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4
_FILE_PAGE = 61  # pagemap bits: a page of a file (or shared memory), not a private anonymous one
_PRESENT = 63


@dataclass(frozen=True)
class FileBytes:
    """Where a weight's bytes lie in a file the process maps."""

    path: str  # the mapped file
    inode: int
    size: int  # the file's bytes and modification time when mapped: a changed file is another key
    mtime_ns: int
    offset: int  # the weight's first byte in the file


def file_mappings() -> list[tuple[int, int, int, int, str]]:
    """(start, end, file offset, inode, path) of the process's file mappings."""
    out = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith("/") or parts[5].rstrip().endswith("(deleted)"):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            out.append((start, end, int(parts[2], 16), int(parts[4]), parts[5].rstrip("\n")))
    return out


def _span(weight: torch.Tensor) -> tuple[int, int]:
    start = weight.data_ptr()
    return start, start + weight.numel() * weight.element_size()


def _pagemap(start: int, end: int) -> torch.Tensor:
    """The `/proc/self/pagemap` entries of the pages over [start, end), as int64."""
    first, last = start // PAGE, (end - 1) // PAGE
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        data = bytearray(pagemap.read((last - first + 1) * 8))
    return torch.frombuffer(data, dtype=torch.int64)


def _bit(entries: torch.Tensor, bit: int) -> torch.Tensor:
    return (entries >> bit) & 1 == 1  # int64 holds bit 63 as the sign; the shift keeps it


def _pages_are_the_files(start: int, end: int) -> bool:
    """Whether every page of [start, end) the process holds is still a page of the mapped file."""
    entries = _pagemap(start, end)
    return bool((~_bit(entries, _PRESENT) | _bit(entries, _FILE_PAGE)).all())


def file_backed(weight: torch.Tensor, mappings: list | None = None) -> FileBytes | None:
    """Where `weight`'s bytes lie in a file the process maps, or None: a CPU tensor of no mapped file, over
        two mappings, or written since it was mapped (its version counter, or a page of it the process copied on
    writing, a neighbour's write on a page they share included). mappings: `file_mappings()`, read once for many
        weights."""
    if weight.device.type != "cpu" or not weight.is_contiguous() or weight.numel() == 0 or not on_linux():
        return None
    if not weight.is_inference() and weight._version:  # written in place since it was made
        return None
    start, end = _span(weight)
    for lo, hi, offset, inode, path in file_mappings() if mappings is None else mappings:
        if lo <= start and end <= hi:
            try:
                stat = os.stat(path)
            except OSError:
                return None
            if stat.st_ino != inode or not _pages_are_the_files(start, end):
                return None
            return FileBytes(path, inode, stat.st_size, stat.st_mtime_ns, offset + start - lo)
    return None


def release(weight: torch.Tensor) -> int:
    """Drop the whole pages of `weight` (file-backed: `file_backed`) from the process; bytes given back.
    The pages come back from the file when read again."""
    start, end = _span(weight)
    lo, hi = -(-start // PAGE) * PAGE, end // PAGE * PAGE  # whole pages only: the edges may hold a neighbour
    if hi <= lo:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) != 0:
        return 0
    return hi - lo


def resident_bytes(weight: torch.Tensor) -> int:
    """Bytes of `weight`'s pages the process holds now (`/proc/self/pagemap`)."""
    return PAGE * int(_bit(_pagemap(*_span(weight)), _PRESENT).sum())


def on_linux() -> bool:
    """Whether the process can read its page map and file mappings (`/proc/self/pagemap`, Linux)."""
    return os.path.exists("/proc/self/pagemap")
