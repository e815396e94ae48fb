"""Model configs by path or by name.

Canonical copies of the bundled HF configs live in autoplan/data/configs/ (package data, so
an installed autoplan finds them); examples/configs/ holds the user-facing copies of the
public ones, kept byte-identical by tests/unit/test_configs.py. Copies rather than symlinks
because symlinks do not survive wheels, sdists or Windows checkouts.
"""

from __future__ import annotations

import difflib
import json
from importlib import resources
from pathlib import Path

from autoplan.errors import ModelConfigError
from autoplan.modelspec import ModelSpec


def bundled_configs() -> dict[str, str]:
    """Bundled config names (file stem) -> JSON text."""
    folder = resources.files("autoplan") / "data" / "configs"
    return {f.name[: -len(".json")]: f.read_text() for f in folder.iterdir()
            if f.name.endswith(".json")}


def resolve_config(model: str) -> ModelSpec:
    """A ModelSpec from an HF folder, a config.json path, or a bundled config name.

    Args:
        model: path to a model folder or config file, or a bundled name such as
            ``llama-3.1-8b`` (case-insensitive, ``.json`` optional).

    Raises:
        ModelConfigError: nothing matches, or the config is malformed or unsupported.
    """
    path = Path(model).expanduser()
    if path.exists():
        return ModelSpec.from_path(path)
    key = model.strip().lower().removesuffix(".json")
    bundled = bundled_configs()
    if key in bundled:
        return ModelSpec.from_config(json.loads(bundled[key]), name=key)
    close = difflib.get_close_matches(key, bundled, n=1, cutoff=0.5)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise ModelConfigError(
        f"no model config at '{model}': pass an HF model folder, a config.json file, or a "
        f"bundled name.{hint} Bundled: {', '.join(sorted(bundled))}"
    )


__all__ = ["bundled_configs", "resolve_config"]
