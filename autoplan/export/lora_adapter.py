"""A recovered plan's LoRA adapter as a PEFT adapter folder, for engines that serve adapters.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from autoplan.atomic import atomic_dir
from autoplan.errors import UserInputError
from autoplan.plan.schema import Plan
from autoplan.recover.weights import RecoveredWeights

if TYPE_CHECKING:
    from autoplan.models import LoadedModel

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def write_lora_adapter(plan: Plan, loaded: LoadedModel, recovered: RecoveredWeights,
                       out_dir: str | Path) -> Path:
    """Write the plan's adapter into ``out_dir`` (atomically); return the folder.

    Raises:
        UserInputError: the plan was not recovered with LoRA.
    """
    if plan.recovery is None or plan.recovery.method != "lora" or not recovered.adapters:
        raise UserInputError("--lora-adapter needs a plan recovered with --recover lora")
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    names = sorted(recovered.adapters)
    rank = int(next(iter(recovered.adapters.values()))["lora_A"].shape[0])
    scaling = recovered.scaling if recovered.scaling is not None else 2.0
    config = LoraConfig(r=rank, lora_alpha=scaling * rank, lora_dropout=0.0,
                        target_modules=names, bias="none")
    base = copy.deepcopy(loaded.model)
    base.config.name_or_path = plan.model.id  # what PEFT records as the adapter's base
    model = get_peft_model(base, config)
    state = {}
    for name, ad in recovered.adapters.items():
        state[f"base_model.model.{name}.lora_A.weight"] = ad["lora_A"].to(torch.float32)
        state[f"base_model.model.{name}.lora_B.weight"] = ad["lora_B"].to(torch.float32)
    result = set_peft_model_state_dict(model, state)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing:
        raise UserInputError(f"the adapter does not fit the model ({missing[0]}): pass the "
                             "plan's own model and recovered weights")
    with atomic_dir(out_dir, is_ours=lambda d: (d / ADAPTER_FILES[0]).is_file()) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
    return Path(out_dir)


__all__ = ["ADAPTER_FILES", "write_lora_adapter"]
