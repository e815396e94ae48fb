"""A GGUF cut short (inside its header, metadata, tensor records or tensor data) is refused
with one line naming the file and the fix, by every reader and by the CLI: no traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autoplan.errors import UserInputError

_FIX = "the file is truncated or corrupt ("
_AGAIN = "); download or convert it again"


def _tiny(path: Path) -> Path:
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(1)
    w.add_token_list(["a", "b", "c"])
    w.add_tensor("token_embd.weight", np.ones((3, 64), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _cuts(path: Path) -> dict[str, int]:
    """Where to cut the file: one offset inside each part of it."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    name, tokens = reader.fields["general.name"], reader.fields["tokenizer.ggml.tokens"]
    first, last = reader.tensors[0], reader.tensors[-1]
    return {
        "header": 12,  # magic and version, then half the tensor count
        "metadata": name.offset + 5,  # inside a key's length
        "metadata-array": tokens.offset + 40,  # inside a string array
        "between-records": tokens.offset,  # a whole record missing
        "tensor-info": first.field.offset + 10,  # inside a tensor's name
        "data-start": reader.data_offset,  # every record, no data
        "tensor-data": last.data_offset + last.n_bytes // 2,
        "last-byte": last.data_offset + last.n_bytes - 1,
    }


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    return _tiny(tmp_path_factory.mktemp("gguf") / "whole.gguf")


def _cut(whole: Path, folder: Path, at: int) -> Path:
    path = folder / "cut.gguf"
    path.write_bytes(whole.read_bytes()[:at])
    return path


def _assert_refused(exc: pytest.ExceptionInfo[UserInputError], name: str) -> None:
    text = str(exc.value)
    assert text.startswith(f"cannot read GGUF '{name}': {_FIX}"), text
    assert text.endswith(_AGAIN), text
    assert "\n" not in text


def test_the_whole_file_reads(whole: Path) -> None:
    from autoplan.models.gguf_read import gguf_reader, open_gguf

    assert [t.name for t in open_gguf(whole).tensors] == ["token_embd.weight",
                                                          "output_norm.weight"]
    assert len(gguf_reader(whole).tensors) == 2


@pytest.mark.parametrize("part", ["header", "metadata", "metadata-array", "between-records",
                                  "tensor-info", "data-start", "tensor-data", "last-byte"])
def test_a_cut_gguf_is_refused_by_every_reader(part: str, whole: Path, tmp_path: Path) -> None:
    from autoplan.models import gguf_gptoss
    from autoplan.models.gguf_convert import _gguf_tensors
    from autoplan.models.gguf_moe import check_gguf_experts
    from autoplan.models.gguf_read import gguf_reader, open_gguf

    path = _cut(whole, tmp_path, _cuts(whole)[part])
    for read in (gguf_reader, open_gguf, _gguf_tensors, check_gguf_experts,
                 lambda p: gguf_gptoss.gptoss_checkpoint(p, None),
                 lambda p: gguf_gptoss.verify_gptoss(None, p)):
        with pytest.raises(UserInputError) as exc:
            read(path)
        _assert_refused(exc, "cut.gguf")


@pytest.mark.parametrize("part", ["metadata", "tensor-data"])
def test_a_cut_gguf_is_refused_before_planning(part: str, whole: Path, tmp_path: Path,
                                               monkeypatch) -> None:
    from autoplan.models.loader import load_spec

    monkeypatch.setenv("AUTOPLAN_CACHE", str(tmp_path / "cache"))
    path = _cut(whole, tmp_path, _cuts(whole)[part])
    with pytest.raises(UserInputError) as exc:
        load_spec(str(path))
    _assert_refused(exc, "cut.gguf")
    assert "needs at least" in str(exc.value)


def test_an_empty_file_is_a_truncated_gguf(tmp_path: Path) -> None:
    from autoplan.models.gguf_read import open_gguf

    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(UserInputError) as exc:
        open_gguf(path)
    _assert_refused(exc, "empty.gguf")
    assert "(0 bytes, but it needs at least 24)" in str(exc.value)


def test_a_file_that_is_not_a_gguf_is_named_so(tmp_path: Path) -> None:
    """Not cut short: still the ValueError gguf-py raised, for callers that skip it."""
    from autoplan.models.gguf_read import CorruptGGUFError, open_gguf

    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 60)
    with pytest.raises(CorruptGGUFError, match="it is not a GGUF file") as exc:
        open_gguf(path)
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize("part", ["metadata", "tensor-data"])
def test_the_cli_refuses_a_cut_gguf_in_one_line(part: str, whole: Path, tmp_path: Path,
                                                monkeypatch) -> None:
    from click.testing import CliRunner

    from autoplan.cli import cli

    monkeypatch.setenv("AUTOPLAN_CACHE", str(tmp_path / "cache"))
    path = _cut(whole, tmp_path, _cuts(whole)[part])
    result = CliRunner().invoke(
        cli, ["profile", "--model", str(path), "--dry-run", "--device", "cpu"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot read GGUF 'cut.gguf': {_FIX}"), lines[0]
