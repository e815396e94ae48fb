"""One parsed GGUF header per file: shared while the file is unchanged, read again once it
is rewritten."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from autoplan.models.gguf_read import gguf_reader


def _write(path: Path, name: str, shape: tuple[int, int] = (2, 32),
           dtype: type = np.float32) -> None:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_tensor("t", np.zeros(shape, dtype=dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _name(path: Path) -> str:
    field = gguf_reader(path).fields["general.name"]
    return bytes(field.parts[field.data[0]]).decode()


def test_a_gguf_is_parsed_once_and_again_when_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    _write(path, "first")
    assert gguf_reader(path) is gguf_reader(str(path)) is gguf_reader(tmp_path / "." / "m.gguf")
    assert _name(path) == "first"
    replacement = tmp_path / "new.gguf"
    _write(replacement, "second-name")  # another size, another inode: what a rewrite does
    os.replace(replacement, path)
    assert _name(path) == "second-name"


def test_a_rewrite_in_place_that_restores_the_mtime_is_read_again(tmp_path: Path) -> None:
    path, other = tmp_path / "m.gguf", tmp_path / "o.gguf"
    _write(path, "aaaa")
    _write(other, "aaaa", (2, 64), np.float16)  # the same size, another tensor type
    before = os.stat(path)
    assert gguf_reader(path).tensors[0].tensor_type.name == "F32"
    path.write_bytes(other.read_bytes())  # same inode, same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # as cp -p / rsync -t do
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns)
    # a stale reader would keep the old record's type (parsed once, at open)
    assert gguf_reader(path).tensors[0].tensor_type.name == "F16"


def test_tensor_data_is_read_through_a_reader_of_its_own(tmp_path: Path) -> None:
    """A cached reader keeps its memory map: tensors read through it would stay resident."""
    from autoplan.models import gguf_read
    from autoplan.models.gguf_convert import _gguf_tensors

    path = tmp_path / "m.gguf"
    _write(path, "first")
    gguf_read.gguf_reader.cache_clear()
    assert set(_gguf_tensors(path)) == {"t"}
    assert gguf_read.gguf_reader.cache_info().currsize == 0
