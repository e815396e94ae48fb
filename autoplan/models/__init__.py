"""Models: load any model argument (alias, HF folder, GGUF, config.json) and address its layers.

Public API:
    load_model(spec, *, trust_remote_code=False, dtype=torch.float32) -> LoadedModel
    load_spec(spec) -> ModelSpec                      (no weights needed)
    check_loadable(spec) -> ModelSource               (headers only: refuse before loading)
    resolve_model_arg(text) -> ModelSource            (for the CLI; loads nothing)
    get_linear / set_module / is_tied / verify_layer_graph   (LayerGraph on a loaded model)
    weights_hash(folder), file_hash(path)             (content hashes, cached per file)
"""

from autoplan.models.graph import LayerGraphError, get_linear, is_tied, set_module, verify_layer_graph
from autoplan.models.hashing import file_hash, weights_hash
from autoplan.models.loader import (
    LoadedModel,
    check_loadable,
    converted_dir,
    ensure_hf_folder,
    load_model,
    load_spec,
)
from autoplan.models.registry import ModelSource, aliases, register_alias, resolve_model_arg

__all__ = [
    "LayerGraphError", "LoadedModel", "ModelSource", "aliases", "check_loadable", "converted_dir",
    "ensure_hf_folder", "file_hash", "get_linear", "is_tied", "load_model", "load_spec",
    "register_alias", "resolve_model_arg", "set_module", "verify_layer_graph", "weights_hash",
]
