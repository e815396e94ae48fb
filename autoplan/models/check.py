"""Cheap checks that a weights file is whole, before anything spends minutes loading it.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from autoplan.errors import UserInputError
from autoplan.modelspec import ModelSpec
from autoplan.safetensors_io import read_header

# The safetensors library refuses headers above 100 MB; so do we, before reading one.
MAX_HEADER_BYTES = 100_000_000
_FIX = "re-download it, or re-save the model with save_pretrained(dir, safe_serialization=True)"


def _problem(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file, or None when it is."""
    size = path.stat().st_size
    if size < 8:
        return f"{size} bytes, too short for a header"
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > min(MAX_HEADER_BYTES, size - 8):
            return f"its header claims {n} bytes, the file has {size - 8} after the length"
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "its header is not JSON"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            return f"tensor '{name}' has no valid data_offsets"
        end = max(end, offsets[1])
    data = size - 8 - n
    if end > data:
        return f"truncated: its tensors need {end} bytes of data, the file holds {data}"
    if end < data:
        return f"{data - end} bytes follow the last tensor"
    return None


def _check_file(p: Path) -> None:
    try:
        problem = _problem(p)
    except OSError as exc:
        raise UserInputError(f"cannot read '{p}': {exc.strerror}") from None
    if not problem:
        problem = _library_problem(p)
    if problem:
        raise UserInputError(f"'{p}' is not a valid safetensors file ({problem}): {_FIX}")


def _library_problem(p: Path) -> str | None:
    """What the safetensors library says of the header, or None when it opens it."""
    from safetensors import safe_open

    try:
        with safe_open(str(p), framework="pt") as fh:
            fh.keys()
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError: all one message
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def check_safetensors(path: str | Path) -> None:
    """Refuse a `.safetensors` file that is empty, truncated, padded or not safetensors.

    Args:
        path: one `.safetensors` file, or an HF model folder (every `*.safetensors` in it).
            A path that does not exist is left to the model resolver to report.

    Raises:
        UserInputError: one line naming the file, what is wrong and the fix.
    """
    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p] if p.exists() else []
    for file in files:
        _check_file(file)


def tensor_shapes(folder: str | Path) -> dict[str, list[int]]:
    """Every tensor's shape in an HF folder's `*.safetensors` headers (no tensor is read;
    the files must have passed `check_safetensors`)."""
    shapes: dict[str, list[int]] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        for name, entry in read_header(file)[0].items():
            if name != "__metadata__" and isinstance(entry, dict):
                shapes[name] = list(entry.get("shape", []))
    return shapes


# which config.json fields set each role's weight shape [out, in], for the message
_SHAPE_FIELDS = {
    "q": ("num_attention_heads x head_dim", "hidden_size"),
    "k": ("num_key_value_heads x head_dim", "hidden_size"),
    "v": ("num_key_value_heads x head_dim", "hidden_size"),
    "qkv": ("(num_attention_heads + 2 x num_key_value_heads) x head_dim", "hidden_size"),
    "o": ("hidden_size", "num_attention_heads x head_dim"),
    "gate": ("intermediate_size", "hidden_size"), "up": ("intermediate_size", "hidden_size"),
    "gate_up": ("2 x intermediate_size", "hidden_size"),
    "down": ("hidden_size", "intermediate_size"), "lm_head": ("vocab_size", "hidden_size"),
}
_BLOCK_INDEX = re.compile(r"\.layers\.(\d+)\.")
_EMBEDDINGS = ("embed_tokens.weight", "embed_in.weight")


def check_config_matches(folder: str | Path, spec: ModelSpec, config: str = "config.json",
                         ) -> None:
    """Refuse a config.json whose sizes disagree with the checkpoint's tensors.

    transformers re-initializes (or raises on) every tensor whose shape the config gets
    wrong, and silently adds random blocks (or drops stored ones) when `num_hidden_layers`
    lies. Checked from the safetensors headers alone, for checkpoints that name their
    tensors as transformers does (others are left to the loader).

    Raises:
        UserInputError: one line naming the tensor, both shapes and the config fields.
    """
    check_safetensors(folder)  # the headers below are whole
    shapes = tensor_shapes(folder)
    expected = {f"{la.name}.weight": la for la in spec.layers  # routed experts: models/moe.py
                if not (la.role == "lm_head" and spec.tie_embeddings) and la.expert < 0}
    if not any(name in shapes for name in expected):
        return  # another naming: nothing to compare
    fix = f"fix {config} (or pass the folder the checkpoint came with)"
    for name, layer in expected.items():
        got = shapes.get(name)
        if got is None:
            if layer.role == "lm_head":
                continue  # tied in the checkpoint although the config does not say so
            raise UserInputError(
                f"{config} describes {spec.n_layers} blocks (num_hidden_layers) but the "
                f"checkpoint has no '{name}': {fix}")
        want = [layer.out_features, layer.in_features]
        if got != want:
            out_f, in_f = _SHAPE_FIELDS.get(layer.role, ("out", "in"))
            raise UserInputError(
                f"'{name}' is {got} in the checkpoint but {config} makes it {want} "
                f"([{out_f}, {in_f}]): {fix}")
    stored = {int(m.group(1)) for name in shapes if (m := _BLOCK_INDEX.search(name))}
    if stored and max(stored) >= spec.n_layers:
        raise UserInputError(
            f"the checkpoint has {max(stored) + 1} blocks but {config} says "
            f"num_hidden_layers {spec.n_layers}: {fix}")
    for name, got in shapes.items():
        if name.endswith(_EMBEDDINGS) and got != [spec.vocab, spec.hidden]:
            raise UserInputError(
                f"'{name}' is {got} in the checkpoint but {config} makes it "
                f"{[spec.vocab, spec.hidden]} ([vocab_size, hidden_size]): {fix}")


__all__ = ["check_config_matches", "check_safetensors", "tensor_shapes"]
