"""QuantMethod: how weights are rounded onto a format's grid (the vocabulary, defined once)."""

from __future__ import annotations

from autoplan.textenum import TextEnum


class QuantMethod(TextEnum):
    """``rtn``: round to nearest; ``gptq``: GPTQ with the layer's input Hessian."""

    __noun__ = "quantization method"

    RTN = "rtn"
    GPTQ = "gptq"


__all__ = ["QuantMethod"]
