"""Formats defined outside autoplan: modules other packages list in the ``autoplan.formats``
entry-point group, imported once when ``autoplan.formats`` loads (each defines its precision
and registers its FormatSpec)."""

from __future__ import annotations

from importlib.metadata import entry_points

from autoplan.errors import AutoplanError

GROUP = "autoplan.formats"


def load_plugins() -> list[str]:
    """Import every module registered under ``autoplan.formats``; their names.

    Raises:
        AutoplanError: a plugin failed to import (named, with the error, in one line).
    """
    loaded = []
    for ep in entry_points(group=GROUP):
        try:
            ep.load()
        except Exception as exc:  # noqa: BLE001 - any plugin failure is reported the same way
            raise AutoplanError(f"number format plugin '{ep.name}' ({ep.value}) failed to "
                                f"load: {type(exc).__name__}: {exc}; fix or uninstall it")
        loaded.append(ep.name)
    return loaded


__all__ = ["GROUP", "load_plugins"]
