"""One parsed GGUF header per file: shared while the file is unchanged, read again once it
is rewritten."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from autoplan.models.gguf_read import gguf_reader


def _write(path: Path, name: str) -> None:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_tensor("t", np.zeros((2, 32), dtype=np.float32))
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
