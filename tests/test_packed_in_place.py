"""One copy of the weights (issue 53, item 2): a weight fdecode read from a checkpoint folder is packed in place
of the original (its pages given back, the packed layout stored for the next process); any other weight keeps
its packed copy beside it. The products and the prefill are the same either way, and the original still reads
as the checkpoint's bytes."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

import fdecode
from fdecode.backends.cpu import file_pages, onednn_packed
from fdecode.backends.cpu.onednn_blob import available as blob_available
from fdecode.backends.cpu.onednn_linear import available, onednn_linear, takes_weight
from fdecode.models import LlamaModel, ModelConfig, from_hf
from fdecode.models.loading.hf import save_hf

pytestmark = pytest.mark.skipif(
    not (available() and file_pages.on_linux() and blob_available()), reason="needs oneDNN, Linux and the AOTI C shim"
)
PROMPT = [5, 17, 300, 42, 7, 99, 1000, 3]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A float32 checkpoint whose linears are 1-4 MiB (oneDNN's from 1 MiB): q, o, gate, up, down, lm_head."""
    cfg = ModelConfig(
        vocab_size=2048, hidden_size=512, intermediate_size=1024, num_layers=2, num_heads=8, num_kv_heads=4, head_dim=64
    )
    path = tmp_path_factory.mktemp("ckpt")
    save_hf(LlamaModel.random(cfg, seed=0, std=0.05), path)
    return path


def config(**kw):
    return fdecode.DecodeConfig(num_draft_tokens=2, max_batch=1, max_seq_len=64, backend="inductor", **kw)


def packed_linears(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and takes_weight(m.weight, m.bias)]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FDECODE_CACHE_DIR", str(tmp_path / "steps"))
    return tmp_path / "steps" / "packed"


def test_a_checkpoint_folders_weights_are_packed_in_place_and_compute_the_same(folder, cache):
    step = fdecode.compile(folder, "ngram", config(), announce=False)
    linears = packed_linears(step.target)
    weights = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    assert len(linears) == 2 * 5 + 1
    assert (step.packing.in_place, step.packing.beside, step.packing.loaded) == (weights, 0, 0)
    assert step.packing.written == weights
    assert "packed weights: 0.02 GiB in place" in repr(step)
    assert len(list(cache.glob("*.packed"))) == len(linears)  # stored for the next process
    # The originals' pages are given back (a page at either end may hold a neighbour's bytes) ...
    assert all(onednn_packed.in_place(m.weight) for m in linears)
    assert all(file_pages.resident_bytes(m.weight) <= 2 * file_pages.PAGE for m in linears)
    plain = fdecode.compile(folder, "ngram", config(pack_weights=False), announce=False)
    first = step.prefill([PROMPT]).step_output.tokens.tolist()
    # ... and the prefill's products read the packed layout only: no original comes back.
    assert all(file_pages.resident_bytes(m.weight) <= 2 * file_pages.PAGE for m in linears)
    assert first == plain.prefill([PROMPT]).step_output.tokens.tolist()
    reference = from_hf(folder)  # another mapping of the same file, not packed
    gen = torch.Generator().manual_seed(0)
    for mine, ref in zip(linears, packed_linears(reference)):
        for rows in (1, 2, 5):
            x = torch.randn(rows, mine.in_features, generator=gen)
            torch.testing.assert_close(
                onednn_linear(x, mine.weight, None), F.linear(x, ref.weight), rtol=1e-5, atol=1e-5
            )
    # One row reads the packed layout too: the originals stay given back.
    assert all(file_pages.resident_bytes(m.weight) <= 2 * file_pages.PAGE for m in linears)
    for mine, ref in zip(linears, packed_linears(reference)):
        assert torch.equal(mine.weight, ref.weight)  # what still reads the original gets the file's bytes
    assert all(file_pages.resident_bytes(m.weight) >= m.weight.numel() * 4 - 2 * file_pages.PAGE for m in linears)


def test_a_second_compile_maps_the_stored_layout_without_packing(folder, cache):
    first = fdecode.compile(folder, "ngram", config(), announce=False)
    out = first.prefill([PROMPT]).step_output.tokens.tolist()
    del first
    gc.collect()
    again = fdecode.compile(folder, "ngram", config(), announce=False)
    assert again.packing.loaded == again.packing.in_place > 0 and again.packing.beside == again.packing.written == 0
    assert "stored by an earlier run" in repr(again)
    assert again.prefill([PROMPT]).step_output.tokens.tolist() == out


def test_weights_of_no_checkpoint_file_keep_their_packed_copy_beside_them(folder, cache):
    model = from_hf(folder)
    written = model.layers[0].mlp.gate_proj.weight
    expected = written.detach().clone() * 2
    with torch.no_grad():
        written.mul_(2)  # its pages are the process's own now, no longer the file's: never given back
    assert file_pages.file_backed(written) is None
    assert file_pages.file_backed(model.layers[1].self_attn.q_proj.weight) is not None  # far from it in the file
    step = fdecode.compile(model, "ngram", config(), announce=False)
    assert step.packing.beside >= written.numel() * 4 and step.packing.in_place > 0
    assert not onednn_packed.in_place(written) and torch.equal(written, expected)
    x = torch.randn(3, 512)
    torch.testing.assert_close(onednn_linear(x, written, None), F.linear(x, expected), rtol=1e-5, atol=1e-5)
    anonymous = LlamaModel.random(from_hf(folder).config, seed=1, std=0.05)  # a model built in memory
    step = fdecode.compile(anonymous, "ngram", config(), announce=False)
    assert step.packing.in_place == 0 and step.packing.beside > 0
    assert "0.00 GiB in place" in repr(step)


def test_one_row_products_can_read_the_original_again(folder, cache):
    model = from_hf(folder)
    linears = packed_linears(model)
    for m in linears:
        onednn_packed.pack(m.weight)
    assert all(onednn_packed.in_place(m.weight) for m in linears)
    onednn_packed.read_original_at_one_row(model)
    reference = from_hf(folder)
    gen = torch.Generator().manual_seed(0)
    for mine, ref in zip(linears, packed_linears(reference)):
        assert not onednn_packed.in_place(mine.weight)
        assert onednn_packed.packed(mine.weight, rows=1) is None and onednn_packed.packed(mine.weight) is not None
        for rows in (1, 2):
            x = torch.randn(rows, mine.in_features, generator=gen)
            torch.testing.assert_close(
                onednn_linear(x, mine.weight, None), F.linear(x, ref.weight), rtol=1e-5, atol=1e-5
            )
    # The one-row products read the originals: their pages came back from the file.
    assert all(file_pages.resident_bytes(m.weight) >= m.weight.numel() * 4 - 2 * file_pages.PAGE for m in linears)
