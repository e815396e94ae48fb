"""Content hashes of model weights and files, cached per file by (size, mtime).

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path

from autoplan.errors import UserInputError
from autoplan.models._cache import cache_root, models_dir, read_json, write_json_atomic
from autoplan.models.registry import ModelSource, resolve_model_arg

_CHUNK = 1 << 24


def _cache_file() -> Path:
    return cache_root() / "hashes.json"


def _stat_key(path: Path) -> tuple[str, list[int]]:
    st = path.stat()
    return str(path.resolve()), [st.st_size, st.st_mtime_ns]


def _cached(path: Path, kind: str, compute):  # noqa: ANN001, ANN202 - private helper
    """Return ``compute(path)``, memoized in the JSON cache under (kind, path, size, mtime)."""
    key, stamp = _stat_key(path)
    store = read_json(_cache_file()) or {}
    entry = store.get(kind, {}).get(key)
    if entry and entry.get("stamp") == stamp:
        return entry["value"]
    value = compute(path)
    store = read_json(_cache_file()) or {}  # re-read: another process may have added entries
    store.setdefault(kind, {})[key] = {"stamp": stamp, "value": value}
    try:
        write_json_atomic(_cache_file(), store)
    except OSError:  # a read-only cache only costs speed
        pass
    return value


def _tensor_digests(path: Path) -> dict[str, list]:
    """Per tensor: [dtype, shape, sha256 of its bytes], straight from the safetensors layout."""
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise UserInputError(f"{path} is not a safetensors file (too short); re-save the model")
        (n,) = struct.unpack("<Q", head)
        try:
            header = json.loads(fh.read(n))
        except ValueError:
            raise UserInputError(f"{path} has a corrupt safetensors header; re-save the model") from None
        base = 8 + n
        out: dict[str, list] = {}
        # Plain reads, not mmap: a mapping read end to end stays in this process's
        # resident set (a 2 GB shard would count 2 GB of peak RSS to a streamed run).
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            h = hashlib.sha256()
            fh.seek(base + start)
            for off in range(base + start, base + end, _CHUNK):
                h.update(fh.read(min(_CHUNK, base + end - off)))
            out[name] = [info["dtype"], list(info["shape"]), h.hexdigest()]
    return out


def weights_hash(folder: str | Path) -> str:
    """sha256 (hex) over all tensors in the folder's ``*.safetensors`` files.

    Raises:
        UserInputError: the folder holds no safetensors file.
    """
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise UserInputError(f"no *.safetensors files in '{folder}'; save the model with "
                             "save_pretrained(..., safe_serialization=True)")
    tensors: dict[str, list] = {}
    for f in files:
        tensors.update(_cached(f, "safetensors-v1", _tensor_digests))
    h = hashlib.sha256(b"autoplan-weights-v1\0")
    for name in sorted(tensors):
        dtype, shape, digest = tensors[name]
        h.update(f"{name}\0{dtype}\0{','.join(map(str, shape))}\0{digest}\n".encode())
    return h.hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_hash(path: str | Path) -> str:
    """sha256 (hex) of a whole file (e.g. a GGUF), cached by size and mtime."""
    return _cached(Path(path), "file-v1", _sha256_file)


def content_hash_of(model: str) -> str | None:
    """The content hash a loaded `model` would have (``LoadedModel.content_hash``: the
    weights hash of the HF folder it loads from), from the files alone (cached per file);
    None where that folder is not at hand: a bare config.json, or a GGUF not converted yet
    (converting it is minutes of work a report or fleet does not do)."""
    source = resolve_model_arg(model)
    if source.kind == "config":
        return None
    folder = source.path if source.kind == "hf" else converted_dir(source)
    return weights_hash(folder) if any(folder.glob("*.safetensors")) else None


def converted_dir(source: ModelSource) -> Path:
    """The cache folder a GGUF/alias source converts into (it may not exist yet)."""
    stem = re.sub(r"[^a-z0-9._-]+", "-", source.model_id.lower()).strip("-") or "model"
    return models_dir() / f"{stem}-{file_hash(source.path)[:8]}"


__all__ = ["content_hash_of", "converted_dir", "file_hash", "weights_hash"]
