"""Lazy package front doors (PEP 562): a package names what it exports and the module each
name lives in, and a name's module is imported on its first use.

So `from autoplan.quant import QuantMethod` costs the small module that defines it, not
every module the package exports (torch, transformers): that is how the CLI parses its
options and answers `--help` and usage errors without importing the stack (click's
"parse first, work later"). Call sites and `__all__` stay as they were.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(namespace: dict[str, Any], exports: Mapping[str, str]
                 ) -> Callable[[str], Any]:
    """The module-level `__getattr__` of a package whose globals are `namespace`:
    `exports` maps each exported name to the module that defines it."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:  # noqa: N807 - the PEP 562 hook
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups are plain attribute reads
        return value

    return __getattr__


__all__ = ["lazy_exports"]
