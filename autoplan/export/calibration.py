"""Rebuild a plan's calibration batches, for plans whose weights depend on them (Wanda and
SparseGPT masks, GPTQ, NVFP4 activation scales).

The blocks are drawn again with ``autoplan.quality.text.load_text_dataset`` and must hash to
the plan's ``audit.calibration_hash``; the settings default to what the plan's audit records.
A plan file comes from someone else: its ``audit.calibration_source`` is used only when it
names autoplan's built-in text; a file is read only when the user passes it (``--calibration``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from autoplan.errors import UserInputError
from autoplan.export._prepare import needs_calibration
from autoplan.plan.schema import Plan

if TYPE_CHECKING:
    from autoplan.models import LoadedModel

BUILTIN_SOURCES = ("pydoc",)  # load_text_dataset's own text: no file is read


@dataclass(frozen=True)
class CalibrationArgs:
    """How to draw the calibration blocks; None fields take the plan's recorded settings."""

    source: str | None = None
    seq_len: int | None = None
    n_calib: int | None = None
    n_eval: int | None = None
    seed: int | None = None
    batch: int | None = None


_DEFAULTS = {"seq_len": 256, "n_calib": 32, "n_eval": 8, "seed": 0, "batch_size": 8}


def _settings(plan: Plan, args: CalibrationArgs) -> dict[str, int]:
    recorded = plan.audit.calibration
    base = dict(_DEFAULTS) if recorded is None else {k: getattr(recorded, k) for k in _DEFAULTS}
    given = {"seq_len": args.seq_len, "n_calib": args.n_calib, "n_eval": args.n_eval,
             "seed": args.seed, "batch_size": args.batch}
    return {k: (v if v is not None else base[k]) for k, v in given.items()}


def _source(plan: Plan, args: CalibrationArgs) -> str:
    if args.source is not None:
        return args.source
    source = plan.audit.calibration_source
    if source in BUILTIN_SOURCES:
        return source
    raise UserInputError(
        f"this plan was calibrated on '{source}', which autoplan does not open from a plan "
        "file: pass --calibration with that text")


def check_calibration(plan: Plan, args: CalibrationArgs) -> None:
    """Refuse, before the model is loaded, what ``plan_calibration`` would refuse after it: a
    text file that is not there, or a plan whose calibration text must be passed.

    Raises:
        UserInputError: one line naming the fix.
    """
    from autoplan.quality.text import check_text_source

    check_text_source(args.source, "--calibration")
    if needs_calibration(plan):
        _source(plan, args)


def plan_calibration(plan: Plan, loaded: LoadedModel, args: CalibrationArgs | None = None
                     ) -> list[Tensor] | None:
    """The plan's calibration batches, or None when its weights do not depend on them.

    Raises:
        UserInputError: the text is not given, or does not hash to the plan's audit.
    """
    if not needs_calibration(plan):
        return None
    ds, batch = plan_dataset(plan, loaded, args)
    return list(ds.calib.split(batch))


def plan_dataset(plan: Plan, loaded: LoadedModel, args: CalibrationArgs | None = None
                 ) -> tuple[Any, int]:
    """The plan's calibration and evaluation blocks (a ``TextDataset``, hash-checked) and
    its calibration batch size.

    Raises:
        UserInputError: the text is not given, or does not hash to the plan's audit.
    """
    args = args or CalibrationArgs()
    from autoplan.quality.text import load_text_dataset

    source = _source(plan, args)
    s = _settings(plan, args)
    if s["batch_size"] < 1:
        raise UserInputError(f"--calib-batch must be a positive integer, got {s['batch_size']}")
    ds = load_text_dataset(source, tokenizer=loaded.tokenizer, seq_len=s["seq_len"],
                           n_calib=s["n_calib"], n_eval=s["n_eval"], seed=s["seed"])
    if ds.content_hash != plan.audit.calibration_hash:
        raise UserInputError(
            f"calibration text '{source}' (seq_len {s['seq_len']}, {s['n_calib']} calib / "
            f"{s['n_eval']} eval blocks, seed {s['seed']}) does not hash to the plan's "
            f"{plan.audit.calibration_hash[:12]}: pass the --calibration/--seq-len/--n-calib/"
            "--n-eval/--seed the search used")
    return ds, s["batch_size"]


__all__ = ["BUILTIN_SOURCES", "CalibrationArgs", "check_calibration", "plan_calibration",
           "plan_dataset"]
