"""Load a model for measurement (``load_model``) or only its architecture (``load_spec``).

Every weighted input ends up as an HF safetensors folder: HF folders are used as they are;
GGUF files and aliases are converted once into ``<cache>/models/<name>-<hash8>/`` (hash8 =
the first 8 hex digits of the GGUF file's sha256), so later loads are a plain safetensors
load. Pickle weights (.bin/.pt) are refused: loading them can run arbitrary code.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from autoplan.errors import UserInputError
from autoplan.modelspec import ModelSpec
from autoplan.models.gguf_convert import convert_gguf, quiet_transformers
from autoplan.models.gguf_moe import moe_config
from autoplan.models.gguf_read import TRANSFORMERS_GGUF_ERRORS, per_file
from autoplan.models.graph import verify_layer_graph
from autoplan.models.hashing import content_hash_of, converted_dir, weights_hash
from autoplan.models.moe import check_moe_checkpoint, source_quantization, unfuse_experts
from autoplan.models.registry import ModelSource, resolve_model_arg

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to measure.

    Attributes:
        model: the transformers CausalLM, in eval mode.
        tokenizer: its tokenizer.
        spec: the LayerGraph (ModelSpec) built from ``model.config``, verified against the model.
        model_id: short name for reports and plans.
        content_hash: sha256 over the safetensors tensors (see ``autoplan.models.hashing``).
        path: the HF folder the weights were loaded from.
        source: what the model argument pointed at (a GGUF's original file, for the GGUF
            exporter); None when the model was built in memory.
    """

    model: Any = field(repr=False)
    tokenizer: Any = field(repr=False)
    spec: ModelSpec = field(repr=False)
    model_id: str
    content_hash: str
    path: Path
    source: ModelSource | None = None


def _refuse_unweighted(source: ModelSource) -> None:
    """Refuse a config-only source, or an HF folder without safetensors weights."""
    if source.kind == "config":
        raise UserInputError(f"'{source.path}' is a config without weights; measuring quality "
                             "needs weights: pass an HF folder with *.safetensors, a .gguf file "
                             "or the alias smollm2-135m")
    if source.kind == "hf":
        folder = source.path
        if not any(folder.glob("*.safetensors")):
            pickles = sorted(p.name for p in folder.iterdir() if p.suffix in _PICKLE_SUFFIXES)
            if pickles:
                raise UserInputError(
                    f"'{folder}' has only pickle weights ({pickles[0]}); autoplan loads safetensors "
                    "only: re-save it where you trust it with save_pretrained(dir, "
                    "safe_serialization=True)")
            raise UserInputError(f"'{folder}' has no *.safetensors weights; pass a folder "
                                 "written by save_pretrained")


def ensure_hf_folder(source: ModelSource) -> Path:
    """An HF safetensors folder for a weighted source, converting a GGUF once if needed;
    its config.json checked field by field and against the checkpoint's tensor shapes.

    Raises:
        UserInputError: the source is config-only, an HF folder with pickle weights only, or
            its config breaks a field's rule or disagrees with the checkpoint.
    """
    _refuse_unweighted(source)
    if source.kind == "hf":
        _check_config(source.path)
        return source.path
    dest = converted_dir(source)
    if not (dest / "config.json").is_file():
        convert_gguf(source.path, dest)
    return dest


def _check_config(folder: Path) -> None:
    """Before transformers reads it: a config.json whose fields are sound and whose sizes
    match the checkpoint's tensors (headers only)."""
    from autoplan.models.check import check_config_matches

    config = folder / "config.json"
    if not config.is_file():  # the loader's own message names the missing file
        return
    spec = ModelSpec.from_path(config).require_weights_plannable()  # before any tensor
    check_config_matches(folder, spec, str(config))
    check_moe_checkpoint(folder)  # routed experts: as many as the config says
    from transformers import AutoConfig

    try:  # the fields autoplan does not use, as transformers' own config class checks them
        with quiet_transformers():
            AutoConfig.from_pretrained(folder)
    except Exception as exc:  # noqa: BLE001 - its validators raise ValueError, TypeError, ...
        first = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3]) if first else type(exc).__name__
        raise UserInputError(f"{config}: transformers cannot read it ({detail})") from None


def check_loadable(spec: str) -> ModelSource:
    """Refuse, from the config and file headers alone (no tensor is read), a model argument
    ``load_model`` would refuse only after seconds to minutes of loading or GGUF conversion:
    no weights, damaged safetensors, a GGUF transformers cannot read or autoplan cannot map.

    Returns:
        The resolved source.

    Raises:
        UserInputError: one line naming the file and the fix.
    """
    from autoplan.models.check import check_safetensors
    from autoplan.models.gguf_convert import check_name_map, gguf_architecture

    source = resolve_model_arg(spec)
    _refuse_unweighted(source)
    if source.kind == "hf":
        check_safetensors(source.path)
        _check_config(source.path)
    elif not (converted_dir(source) / "config.json").is_file():  # a GGUF not converted yet
        config = _gguf_config(source.path)
        check_name_map(str(config.get("model_type", "")), gguf_architecture(source.path))
        # a model autoplan cannot plan (MoE, unknown type, MLA)
        ModelSpec.from_config(config).require_weights_plannable()
    return source


def _gguf_config(path: Path) -> dict[str, Any]:
    """The config transformers reads from a GGUF's metadata (experts and gpt-oss added),
    parsed once per file per process: reading it parses the whole header (seconds), and
    a command asks for it before it loads (check_loadable) and again when it plans."""
    return copy.deepcopy(_parsed_gguf_config(path))


@per_file(maxsize=4)
def _parsed_gguf_config(path: Path) -> dict[str, Any]:
    from transformers import AutoConfig

    from autoplan.models import gguf_gptoss
    from autoplan.models.gguf_convert import gguf_architecture
    from autoplan.models.gguf_moe import check_gguf_experts

    check_gguf_experts(path)  # stacked experts as many as the metadata says
    try:
        if gguf_architecture(path) == gguf_gptoss.ARCH:  # transformers' reader fails on it
            return gguf_gptoss.gptoss_config(path).to_dict()
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        return moe_config(config, path).to_dict()  # a llama GGUF with experts: Mixtral
    except TRANSFORMERS_GGUF_ERRORS as exc:
        raise UserInputError(f"cannot read GGUF '{path}': {exc}".splitlines()[0]) from None


def load_spec(spec: str) -> ModelSpec:
    """The ModelSpec of any model argument, without loading weights, for the commands that
    measure or plan it (cost-only architectures are refused: `require_weights_plannable`).

    GGUF files and aliases are read from their converted folder when it exists, else from
    the GGUF metadata (no tensors are read).
    """
    source = resolve_model_arg(spec)
    if source.kind in ("hf", "config"):
        found = dataclasses.replace(ModelSpec.from_path(source.path), name=source.model_id)
    elif ((folder := converted_dir(source)) / "config.json").is_file():
        found = dataclasses.replace(ModelSpec.from_path(folder), name=source.model_id)
    else:
        found = ModelSpec.from_config(_gguf_config(source.path), name=source.model_id)
    return found.require_weights_plannable()


def load_config_dict(spec: str) -> dict[str, Any]:
    """The config (config.json's object, or a GGUF's metadata as transformers reads it) of
    any model argument, without loading weights: for checks that need more than ModelSpec
    keeps (rope variants, attention flags)."""
    source = resolve_model_arg(spec)
    folder = source.path if source.kind in ("hf", "config") else converted_dir(source)
    path = folder if folder.suffix == ".json" else folder / "config.json"
    if source.kind not in ("hf", "config") and not path.is_file():
        return _gguf_config(source.path)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserInputError(f"cannot read '{path}': {exc}".splitlines()[0]) from None
    if not isinstance(cfg, dict):
        raise UserInputError(f"'{path}' must hold a JSON object")
    return cfg


def _tokenizer(folder: Path, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as exc:
        raise UserInputError(f"no usable tokenizer in '{folder}' ({type(exc).__name__}); save "
                             "the tokenizer next to the weights with tokenizer.save_pretrained")


def open_checkpoint(spec: str, *, trust_remote_code: bool = False
                    ) -> tuple[Path, ModelSource, Any, ModelSpec, str]:
    """Everything about a weighted model but its weights: (HF folder, source, tokenizer,
    ModelSpec from config.json, content hash). Streamed execution reads the weights later,
    one block at a time."""
    source = resolve_model_arg(spec)
    folder = ensure_hf_folder(source)
    model_spec = dataclasses.replace(ModelSpec.from_path(folder).require_weights_plannable(),
                                     name=source.model_id)
    tokenizer = _tokenizer(folder, trust_remote_code)
    return folder, source, tokenizer, model_spec, weights_hash(folder)


def load_model(spec: str, *, trust_remote_code: bool = False,
               dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a model argument (alias, HF folder, GGUF file) for measurement.

    Args:
        spec: an alias (``smollm2-135m``), an HF folder, or a .gguf file.
        trust_remote_code: run the model folder's own Python code; off unless asked.
        dtype: parameter dtype; float32 keeps CPU evaluation exact.

    Raises:
        UserInputError: config-only input, pickle-only folder, missing tokenizer, or a folder
            whose code must be trusted.
    """
    from transformers import AutoModelForCausalLM

    source = resolve_model_arg(spec)
    folder = ensure_hf_folder(source)
    if (folder / "config.json").is_file():  # refused before minutes of loading
        ModelSpec.from_path(folder).require_weights_plannable()
    quantized = source_quantization(folder)  # gpt-oss MXFP4: read at its exact values
    try:
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(
                folder, use_safetensors=True, trust_remote_code=trust_remote_code, dtype=dtype,
                **quantized)
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise UserInputError(f"'{folder}' needs its own Python code to load; pass "
                                 "trust_remote_code=True (--trust-remote-code) if you trust it") from None
        raise UserInputError(f"cannot load '{folder}': {exc}".splitlines()[0]) from None
    except (TypeError, AssertionError, ArithmeticError) as exc:
        # what transformers' model classes raise on a config they cannot build (not
        # RuntimeError: an allocation failure is the caller's out-of-memory message)
        raise UserInputError(f"cannot load '{folder}' ({type(exc).__name__}: "
                             f"{str(exc).strip()[:200]})".splitlines()[0]) from None
    tokenizer = _tokenizer(folder, trust_remote_code)
    model.eval()
    config = model.config.to_dict()
    if quantized and not config.get("quantization_config"):  # dropped once dequantized
        config["quantization_config"] = {"quant_method": "mxfp4"}
    model_spec = ModelSpec.from_config(config, name=source.model_id)
    unfuse_experts(model, model_spec)  # MoE: each routed expert's projections as nn.Linear
    verify_layer_graph(model, model_spec)
    return LoadedModel(model, tokenizer, model_spec, source.model_id, weights_hash(folder), folder,
                       source)


__all__ = ["LoadedModel", "check_loadable", "content_hash_of", "converted_dir", "ensure_hf_folder",
           "load_config_dict", "load_model", "load_spec", "open_checkpoint"]
