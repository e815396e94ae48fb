"""Model configs by path or by name.

Canonical copies of the bundled HF configs live in autoplan/data/configs/ (package data, so
an installed autoplan finds them); examples/configs/ holds the user-facing copies of the
public ones, kept byte-identical by tests/unit/test_configs.py. Copies rather than symlinks
because symlinks do not survive wheels, sdists or Windows checkouts.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from importlib import resources
from pathlib import Path

from autoplan.errors import ModelConfigError, UnknownNameError, UserInputError
from autoplan.modelspec import ModelSpec


def bundled_configs() -> dict[str, str]:
    """Bundled config names (file stem) -> JSON text."""
    folder = resources.files("autoplan") / "data" / "configs"
    return {f.name[: -len(".json")]: f.read_text() for f in folder.iterdir()
            if f.name.endswith(".json")}


def resolve_config(model: str, *, command: str = "the cost model") -> ModelSpec:
    """A ModelSpec from a model argument, reading config.json only (no weights).

    The argument is resolved like every other model argument (``resolve_model_arg``: an HF
    folder, a config.json, a repo id in the local Hugging Face cache) except that a bundled
    config name wins over an alias of the same name, so no weights are ever converted.

    Args:
        model: path to a model folder or config file, a bundled name such as
            ``llama-3.1-8b`` (case-insensitive, ``.json`` optional), or ``ORG/NAME`` cached
            by Hugging Face.
        command: who asks, for the error on a GGUF file (``estimate``, ``fleet``).

    Raises:
        ModelConfigError: nothing matches, or the config is malformed or unsupported.
        UserInputError: a GGUF file or GGUF alias not converted yet (no config to read: a
            search or profile converts it), or a repo id that is not in the Hugging Face
            cache (the message names where it looked).
    """
    from autoplan.models.registry import resolve_model_arg

    key = model.strip().lower().removesuffix(".json")
    bundled = bundled_configs()
    if key in bundled and not Path(model).expanduser().exists():
        return ModelSpec.from_config(json.loads(bundled[key]), name=key)
    try:
        source = resolve_model_arg(model)
    except UnknownNameError:
        close = difflib.get_close_matches(key, bundled, n=1, cutoff=0.5)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ModelConfigError(
            f"no model config at '{model}': pass an HF model folder, a config.json file, "
            f"ORG/NAME from the Hugging Face cache, or a bundled name.{hint} Bundled: "
            f"{', '.join(sorted(bundled))}") from None
    if source.kind in ("gguf", "alias"):
        from autoplan.models.hashing import converted_dir

        converted = converted_dir(source)  # a search converted it: its config.json is the model's
        if (converted / "config.json").is_file():
            return dataclasses.replace(ModelSpec.from_path(converted), name=source.model_id)
        raise UserInputError(
            f"{command} takes a config (config.json), an HF folder or an alias with a bundled "
            f"config, not the GGUF file {source.path.name}: pass the config.json of the model "
            f"it was made from, or a bundled name ({', '.join(sorted(bundled))})")
    spec = ModelSpec.from_path(source.path)
    return dataclasses.replace(spec, name=source.model_id) if source.kind == "hf" else spec


__all__ = ["bundled_configs", "resolve_config"]
