"""Models: load any model argument (alias, HF folder, GGUF, config.json) and address its layers.

Reasoning and sources: docs/modules.md.
"""

from autoplan.lazy import lazy_exports

# each name's module is imported on first use (autoplan/lazy.py): resolving a model argument
# or reading a config must not import torch
_EXPORTS = {
    "LayerGraphError": "autoplan.models.graph",
    "get_linear": "autoplan.models.graph",
    "is_tied": "autoplan.models.graph",
    "set_module": "autoplan.models.graph",
    "verify_layer_graph": "autoplan.models.graph",
    "file_hash": "autoplan.models.hashing",
    "weights_hash": "autoplan.models.hashing",
    "LoadedModel": "autoplan.models.loader",
    "check_loadable": "autoplan.models.loader",
    "converted_dir": "autoplan.models.hashing",
    "ensure_hf_folder": "autoplan.models.loader",
    "load_model": "autoplan.models.loader",
    "load_spec": "autoplan.models.loader",
    "ModelSource": "autoplan.models.registry",
    "aliases": "autoplan.models.registry",
    "register_alias": "autoplan.models.registry",
    "resolve_model_arg": "autoplan.models.registry",
}
__getattr__ = lazy_exports(globals(), _EXPORTS)

__all__ = [
    "LayerGraphError", "LoadedModel", "ModelSource", "aliases", "check_loadable", "converted_dir",
    "ensure_hf_folder", "file_hash", "get_linear", "is_tied", "load_model", "load_spec",
    "register_alias", "resolve_model_arg", "set_module", "verify_layer_graph", "weights_hash",
]
