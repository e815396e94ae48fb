"""Recovery after compression: a short distillation pass towards the original model.

Public API:
    RecoverySettings(method="distill"|"lora", steps, lr, rank, text, ...)
    recover(student, teacher, layers, blocks, settings, *, run_key, checkpoint_dir=None,
            on_step=None) -> RecoveryResult     (raises RecoveryDiverged)
    write_recovered / read_recovered: the recovered-weights file beside a plan
"""

from autoplan.recover.settings import RecoveryMethod, RecoverySettings
from autoplan.recover.train import RecoveryDiverged, RecoveryResult, recover
from autoplan.recover.weights import (
                                      RecoveredWeights,
                                      read_recovered,
                                      resolve_weights_file,
                                      weights_path_for,
                                      write_recovered,
)

__all__ = ["RecoveredWeights", "RecoveryDiverged", "RecoveryMethod", "RecoveryResult",
           "RecoverySettings", "read_recovered", "recover", "resolve_weights_file",
           "weights_path_for", "write_recovered"]
