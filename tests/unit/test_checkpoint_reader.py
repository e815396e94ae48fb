"""The streamed checkpoint reader: exact tensors, and no shard mapped into the process while
a block is converted (a mapped bf16 shard doubled the streamed profile's peak)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from autoplan.errors import UserInputError
from autoplan.streaming.weights import CheckpointReader


def _shard(tmp_path: Path) -> Path:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight": torch.randn(33, 17, generator=gen).to(torch.bfloat16),
        "b.weight": torch.randn(8, 8, generator=gen).to(torch.float16),
        "c.bias": torch.randn(5, generator=gen),
        "d.codes": torch.randint(-128, 127, (4, 6), dtype=torch.int8, generator=gen),
        "e.scale": torch.randn(3, generator=gen).to(torch.float8_e4m3fn),
        "f.empty": torch.zeros(0, 4),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    return path


def test_reads_every_tensor_exactly_in_its_dtype_or_converted(tmp_path: Path) -> None:
    path = _shard(tmp_path)
    reader = CheckpointReader(tmp_path)
    want = load_file(str(path))
    got = reader.read(reader.names())
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), name
    as_f32 = reader.read(["a.weight", "d.codes"], dtype=torch.float32)
    assert torch.equal(as_f32["a.weight"], want["a.weight"].float())
    assert as_f32["d.codes"].dtype == torch.int8  # integer codes are never converted


def test_no_shard_is_mapped_while_tensors_are_converted(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    path = _shard(tmp_path)
    reader = CheckpointReader(tmp_path)
    mapped: list[bool] = []
    to = torch.Tensor.to

    def watching_to(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        mapped.append(str(path) in Path("/proc/self/maps").read_text())
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", watching_to)
    reader.read(["a.weight", "b.weight"], dtype=torch.float32)
    assert mapped and not any(mapped)


def test_a_truncated_shard_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    path = _shard(tmp_path)
    reader = CheckpointReader(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 10])
    with pytest.raises(UserInputError, match="truncated"):
        reader.read(reader.names())
