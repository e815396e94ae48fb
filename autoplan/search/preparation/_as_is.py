""""As is": the model the user runs today, always a candidate of the search.

For an unquantized checkpoint that is the baseline (every unit at the space's baseline).
For a quantized source -- a GGUF file -- it is the file's own per-tensor types, when every
one of them is a choice of the search space: the search may then return the file unchanged,
and `choose` never returns a plan predicted slower than it and no better in quality. What
every candidate's quality is measured against is said in the plan (`AsIs.reference`).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.models import LoadedModel
from autoplan.search.optimize import SearchSpace


@dataclass(frozen=True)
class AsIs:
    picks: tuple[int, ...]
    label: str  # the name logs and plans give it
    reference: str  # what measured quality is relative to
    quantized_source: bool = False  # a quantized file (not the baseline) is the candidate
    note: str = ""  # why the source is not itself a candidate, when it is not
    kinds: str = ""  # the source's tensor types, for the plan's text
    # "" : quality against the fp32 checkpoint as loaded; "as-is": against the quantized
    # source as its engine runs it (_engine_frame.py)
    frame: str = ""


_CHECKPOINT = ("measured quality is relative to the checkpoint as loaded (the uncompressed "
               "model, which is also the 'as is' candidate)")


def _gguf_choices(loaded: LoadedModel) -> dict[str, str] | None:
    source = getattr(loaded, "source", None)
    if source is None or source.path.suffix.lower() != ".gguf":
        return None
    from autoplan.engines.ggml_microbench import source_decisions

    return source_decisions(loaded)


def as_is(loaded: LoadedModel, space: SearchSpace, base: tuple[int, ...]) -> AsIs:
    """The source of `loaded` as a candidate of `space`, whose baseline picks are `base`
    (see module doc)."""
    types = _gguf_choices(loaded)
    if types is None:
        return AsIs(base, "as is (baseline)", _CHECKPOINT)
    kinds = ", ".join(sorted({t.removeprefix("dense+") for t in types.values()}))
    # a file that is a candidate becomes the reference as llama.cpp runs it (_engine_frame)
    reference = (f"measured quality is relative to the source GGUF's weights ({kinds}) "
                 "dequantized to fp32, which holds them exactly, run without llama.cpp's own "
                 "activation rounding: the file is not itself a candidate here, so the file "
                 "as llama.cpp runs it cannot be the reference")
    picks, missing = [], []
    for unit in space.units:
        wanted = {types.get(la.name) for la in unit.layers}
        choice = next(iter(wanted)) if len(wanted) == 1 else None
        parsed = _parse(choice)
        if parsed is None or parsed not in unit.choices:
            missing.append(f"{unit.name} ({'/'.join(sorted(str(w) for w in wanted))})")
            continue
        picks.append(unit.choices.index(parsed))
    protected = [la.name for la in space.protected
                 if _parse(types.get(la.name)) != space.baseline]
    if missing or protected:
        why = (f"{len(missing)} unit(s) hold a type this search space does not offer, e.g. "
               f"{missing[0]}" if missing else
               f"protected layers differ from the baseline, e.g. {protected[0]}")
        return AsIs(base, "as is (baseline)", reference,
                    note=f"the source file is not a candidate: {why}", kinds=kinds)
    return AsIs(tuple(picks), "as is (the source GGUF)", reference, quantized_source=True,
                kinds=kinds)


def _parse(text: str | None) -> Choice | None:
    if text is None:
        return None
    try:
        return Choice.parse(text)
    except UserInputError:  # a GGUF type autoplan has no format for ("gguf:Q6_K")
        return None


__all__ = ["AsIs", "as_is"]
