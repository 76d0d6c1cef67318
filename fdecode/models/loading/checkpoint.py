"""A checkpoint folder's safetensors as a lazy mapping: key -> tensor, read one tensor at a time
(docs/design.md, "Mixture of experts: the MoE block, GLM-4.5, the DeepSeek-style MTP head").

`CheckpointTensors(folder)` lists the keys from `model.safetensors.index.json` (sharded checkpoints)
or from the headers of every `*.safetensors` file, and reads a tensor only when it is looked up,
through `safetensors.safe_open` (memory-mapped; nothing else of the file is read). The loader
converts and keeps each tensor as it goes, so loading never holds the whole checkpoint twice, or a
shard beyond the tensor at hand.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch


class CheckpointTensors(Mapping[str, torch.Tensor]):
    def __init__(self, folder: str | Path) -> None:
        from safetensors import safe_open  # local import: only needed for folders

        self.folder = Path(folder)
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._file_of = {key: self.folder / name for key, name in weight_map.items()}
            lost = sorted({str(p.name) for p in self._file_of.values() if not p.is_file()})
            if lost:
                raise FileNotFoundError(f"{index} names shard(s) the folder lacks: {', '.join(lost)}")
        else:
            self._file_of = {}
            for file in sorted(self.folder.glob("*.safetensors")):
                with safe_open(str(file), framework="pt") as handle:
                    self._file_of.update(dict.fromkeys(handle.keys(), file))
        if not self._file_of:
            raise FileNotFoundError(f"{self.folder} has no *.safetensors weights")
        self._open = safe_open
        self._handles: dict[Path, object] = {}

    def _handle(self, key: str):
        file = self._file_of[key]  # KeyError for a key the checkpoint lacks, as a Mapping should
        if file not in self._handles:
            self._handles[file] = self._open(str(file), framework="pt", device="cpu")
        return self._handles[file]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._handle(key).get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._file_of)

    def __len__(self) -> int:
        return len(self._file_of)

    def __repr__(self) -> str:
        return (
            f"CheckpointTensors({str(self.folder)!r}, {len(self)} tensors in {len(set(self._file_of.values()))} files)"
        )
