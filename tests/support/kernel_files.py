"""The kernel C++ files Inductor wrote in a cache folder: fdecode's batches (`fdecode.backends.cpu.kernel_batches`)
and Inductor's own one-kernel files."""

from __future__ import annotations

from pathlib import Path

ENTRY = 'extern "C"  void  kernel('  # how Inductor starts a kernel of its own


def kernel_files(folder: Path) -> dict[str, list[Path]]:
    """{"batched": [...], "single": [...]}: the C++ files under `folder`, sorted, by how they were built."""
    found: dict[str, list[Path]] = {"batched": [], "single": []}
    for path in sorted(folder.rglob("*.cpp")):
        text = path.read_text()
        if "fdecode_arg" in text:
            found["batched"].append(path)
        elif ENTRY in text:
            found["single"].append(path)
    return found
