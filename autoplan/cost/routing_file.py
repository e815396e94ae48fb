"""A mixture-of-experts model's routing shares from a file the user names: a plan (the
calibration routing its predictions assumed) or a sensitivity profile (the expert counts it
recorded). Without one, the cost model assumes uniform routing (top_k / E per expert)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from autoplan.cost.moe import Routing
from autoplan.errors import UserInputError
from autoplan.modelspec import ModelSpec

HINT = "give a plan.json from an MoE search or a profile JSON from `autoplan profile`"


def _doc(path: Path, flag: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserInputError(f"{flag} {path}: no such file; {HINT}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserInputError(f"{flag} {path}: not readable JSON ({exc}); {HINT}") from None
    except RecursionError:  # nesting deeper than any plan or profile
        raise UserInputError(f"{flag} {path}: JSON nested too deeply; {HINT}") from None
    if not isinstance(doc, dict):
        raise UserInputError(f"{flag} {path}: not a plan or profile; {HINT}")
    return doc


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _shares(block: int, row: object, flag: str, path: Path) -> tuple[float, ...]:
    """A block's shares: each the chance a token picks the expert, a number in [0, 1]."""
    if not isinstance(row, list) or not all(_number(x) and 0 <= x <= 1 for x in row):
        raise UserInputError(f"{flag} {path}: block {block}'s routing shares must be numbers "
                             "from 0 to 1, one per expert; re-run the search")
    return tuple(float(x) for x in row)


def _counts(block: str, row: object, flag: str, path: Path) -> list[int]:
    """A block's calibration counts: tokens that picked each expert, whole numbers >= 0."""
    if not isinstance(row, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                            and x >= 0 for x in row):
        raise UserInputError(f"{flag} {path}: block {block}'s routing counts must be whole "
                             "numbers >= 0, one per expert; re-run `autoplan profile`")
    return row


def read_routing(spec: ModelSpec, path: str | Path, flag: str = "--routing") -> Routing:
    """The routing shares `path` records for `spec`.

    Raises:
        UserInputError: `spec` is dense, the file is neither a plan nor a profile, records
            no routing, or records it for other blocks or another expert count.
    """
    path = Path(path)
    moe, model = spec.moe, spec.name or spec.model_type
    if moe is None:
        raise UserInputError(f"{flag}: {model} is not a mixture-of-experts model; "
                             f"drop {flag}")
    doc = _doc(path, flag)
    shape = f"{len(moe.moe_blocks)} MoE blocks of {moe.n_experts} experts"
    if "schema_version" in doc:  # a plan: the shares its predictions assumed
        routing = doc.get("routing")
        if not isinstance(routing, dict) or not isinstance(routing.get("shares"), dict):
            raise UserInputError(f"{flag} {path}: the plan records no routing (a dense "
                                 f"model's plan, or one from before MoE); {HINT}")
        shares = routing["shares"]
        if not all(isinstance(b, str) and b.isdigit() for b in shares):
            raise UserInputError(f"{flag} {path}: its routing is keyed by something other "
                                 "than block numbers; re-run the search")
        rows = {int(b): _shares(int(b), s, flag, path) for b, s in shares.items()}
        if set(rows) != set(moe.moe_blocks) or any(len(s) != moe.n_experts
                                                   for s in rows.values()):
            raise UserInputError(f"{flag} {path}: its routing is for another model "
                                 f"({len(rows)} blocks); {model} has {shape}")
        off = next((b for b, s in sorted(rows.items())
                    if abs(sum(s) - moe.top_k) > 1e-6 * moe.top_k), None)
        if off is not None:  # each token picks top_k experts: a block's shares sum to it
            raise UserInputError(f"{flag} {path}: block {off}'s shares sum to "
                                 f"{sum(rows[off]):g}, not {model}'s top_k {moe.top_k}: "
                                 "its routing is for another model")
        return Routing(rows, str(routing.get("source", "plan")))
    if "routing" in doc and "tokens" in doc:  # a profile: calibration counts per expert
        counts, tokens = doc["routing"], doc["tokens"]
        if not counts:
            raise UserInputError(f"{flag} {path}: the profile records no routing (profiled "
                                 f"on a dense model?); {HINT}")
        if (not isinstance(counts, dict) or not isinstance(tokens, int)
                or isinstance(tokens, bool) or tokens <= 0):
            raise UserInputError(f"{flag} {path}: its routing counts are malformed; "
                                 "re-run `autoplan profile`")
        if set(counts) != {str(b) for b in moe.moe_blocks}:
            raise UserInputError(f"{flag} {path}: its routing is for another model "
                                 f"({len(counts)} blocks); {model} has {shape}")
        rows = {b: _counts(b, row, flag, path) for b, row in counts.items()}
        return Routing.from_counts(spec, rows, tokens)
    raise UserInputError(f"{flag} {path}: not a plan or profile; {HINT}")


__all__ = ["read_routing"]
