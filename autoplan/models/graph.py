"""The LayerGraph on a loaded model: find, check and swap the linear layers ModelSpec names.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

from torch import nn

from autoplan.errors import AutoplanError
from autoplan.modelspec import ModelSpec


class LayerGraphError(AutoplanError):
    """A ModelSpec layer does not exist in the loaded model, or has another shape."""


def get_linear(model: nn.Module, name: str) -> nn.Linear:
    """The ``nn.Linear`` at dotted path ``name`` (e.g. ``model.layers.0.self_attn.q_proj``).

    Raises:
        LayerGraphError: no module there, or it is not an ``nn.Linear``.
    """
    try:
        module = model.get_submodule(name)
    except AttributeError:
        raise LayerGraphError(f"model has no module '{name}'; the model does not match its "
                              "config (re-export it or pass the matching config)") from None
    if not isinstance(module, nn.Linear):
        raise LayerGraphError(f"'{name}' is a {type(module).__name__}, not nn.Linear; autoplan "
                              "plans plain linear layers only (load the unquantized model)")
    return module


def set_module(model: nn.Module, name: str, module: nn.Module) -> nn.Module:
    """Replace the submodule at dotted path ``name`` with ``module``; return the old one.

    Raises:
        LayerGraphError: the parent path does not exist.
    """
    parent_name, _, child = name.rpartition(".")
    try:
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
    except AttributeError:
        raise LayerGraphError(f"model has no module '{name}' to replace") from None
    setattr(parent, child, module)
    return old


def is_tied(model: nn.Module, name: str) -> bool:
    """True when the linear ``name`` shares its weight tensor with the input embedding."""
    get_emb = getattr(model, "get_input_embeddings", None)
    emb = get_emb() if callable(get_emb) else None
    return emb is not None and get_linear(model, name).weight is emb.weight


def verify_layer_graph(model: nn.Module, spec: ModelSpec) -> None:
    """Check every ``spec.layers`` entry is an ``nn.Linear`` of shape [out, in] in ``model``.

    Raises:
        LayerGraphError: names all mismatches found (up to three, plus a count).
    """
    problems: list[str] = []
    for layer in spec.layers:
        try:
            lin = get_linear(model, layer.name)
        except LayerGraphError as exc:
            problems.append(str(exc).split(";")[0])
            continue
        expect = (layer.out_features, layer.in_features)
        if tuple(lin.weight.shape) != expect:
            problems.append(f"{layer.name} has shape {tuple(lin.weight.shape)}, config says {expect}")
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise LayerGraphError(f"model does not match its layer graph: {'; '.join(problems[:3])}"
                              f"{more}; load the model with the config it was saved with")


__all__ = ["LayerGraphError", "get_linear", "is_tied", "set_module", "verify_layer_graph"]
