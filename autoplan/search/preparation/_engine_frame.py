"""The quality reference of a search on a quantized source (a GGUF file): the file as its
engine runs it. llama.cpp rounds every matmul's activations to its 8-bit blocks, so the file
as it runs sits 0.002-0.003 nats from its weights dequantized to fp32 (SmolLM2-135M, Q4_1),
and a budget counted from fp32 reads that much tighter than a KL measured through llama.cpp's
logits against the file (docs/search-quality.md). So every candidate is measured against
the "as is" candidate instead, the file's own types with that rounding simulated, in memory
or streamed (`Evaluator.with_reference`); the plan says which reference it used.
"""

from __future__ import annotations

import dataclasses

from autoplan.compress import CompressionSettings
from autoplan.formats import Choice
from autoplan.search.preparation._as_is import AsIs
from autoplan.streaming.candidates import Evaluator

ENGINE_FRAME = "as-is"  # part of each measurement's key: KL against the file as it runs


def rebase_on_as_is(keep: AsIs, evaluator: Evaluator, decisions: dict[str, Choice],
                    settings: CompressionSettings, baseline: Choice) -> tuple[Evaluator, AsIs]:
    """(evaluator, as is) with quality measured against the quantized source as its engine
    runs it, when the source is a candidate; both unchanged otherwise."""
    if not keep.quantized_source:
        return evaluator, keep
    # the file's weights are on their own grids: round to nearest gives them back exactly
    # (a solver such as GPTQ would move them), whatever the candidates are solved with
    rtn = dataclasses.replace(settings, quant_method="rtn")
    rebased = evaluator.with_reference(decisions, rtn, baseline)
    reference = (f"measured quality is relative to the source GGUF as llama.cpp runs it: its "
                 f"own types ({keep.kinds}) with llama.cpp's activation rounding, simulated "
                 "(the 'as is' candidate), the frame of a KL through llama.cpp's logits "
                 "against the file; the fp32 dequantization of its weights is itself a "
                 "candidate measured against it")
    return rebased, dataclasses.replace(keep, reference=reference, frame=ENGINE_FRAME)


__all__ = ["ENGINE_FRAME", "rebase_on_as_is"]
