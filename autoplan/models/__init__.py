"""Models: load any model argument (alias, HF folder, GGUF, config.json) and address its layers.

Reasoning and sources: docs/modules.md.
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
