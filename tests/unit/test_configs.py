"""Bundled model configs: the user-facing copies equal the canonical package data."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.cost import bundled_configs, resolve_config
from autoplan.errors import ModelConfigError

_EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"


@pytest.mark.parametrize("path", sorted(_EXAMPLES.glob("*.json")), ids=lambda p: p.stem)
def test_example_config_equals_bundled_copy(path: Path) -> None:
    assert bundled_configs()[path.stem] == path.read_text()


@pytest.mark.parametrize("name", sorted(bundled_configs()))
def test_bundled_config_loads(name: str) -> None:
    spec = resolve_config(name)
    assert spec.layers and spec.n_layers > 0


def test_public_shapes() -> None:
    spec = resolve_config("llama-3.1-8b")
    assert (spec.hidden, spec.intermediate, spec.n_layers, spec.n_kv_heads) == (4096, 14336, 32, 8)
    assert 8.0e9 < spec.total_params < 8.1e9
    assert 70.4e9 < resolve_config("llama-3.1-70b").total_params < 70.8e9
    assert 68.9e9 < resolve_config("llama-2-70b").total_params < 69.1e9  # "70B": 68.98e9
    assert 7.5e9 < resolve_config("qwen2.5-7b").total_params < 7.7e9
    assert 7.2e9 < resolve_config("mistral-7b-v0.3").total_params < 7.3e9


def test_unknown_name_lists_bundled() -> None:
    with pytest.raises(ModelConfigError, match="llama-3.1-8b"):
        resolve_config("llama-3.1-8")


def test_a_converted_gguf_is_costed_from_its_converted_config(tmp_path: Path,
                                                                monkeypatch) -> None:
    """estimate and fleet take a GGUF a search already converted (its cache folder holds
    the model's config.json); one never converted is refused in one line, as before."""
    from autoplan.errors import UserInputError
    from autoplan.models.hashing import converted_dir
    from autoplan.models.registry import resolve_model_arg

    monkeypatch.setenv("AUTOPLAN_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "my-model.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 64)
    with pytest.raises(UserInputError, match="not the GGUF file my-model.gguf"):
        resolve_config(str(gguf), command="fleet")
    folder = converted_dir(resolve_model_arg(str(gguf)))
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(bundled_configs()["smollm2-135m"])
    spec = resolve_config(str(gguf), command="fleet")
    bundled = resolve_config("smollm2-135m")
    assert spec.name == "my-model"
    assert (spec.model_type, spec.n_layers, spec.total_params) == (
        bundled.model_type, bundled.n_layers, bundled.total_params)
