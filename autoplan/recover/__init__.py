"""Recovery after compression: a short distillation pass towards the original model.

Public API:
    RecoverySettings(method="distill"|"lora", steps, lr, rank, text, ...)
    recover(student, teacher, layers, blocks, settings, *, run_key, checkpoint_dir=None,
            on_step=None) -> RecoveryResult     (raises RecoveryDiverged)
    write_recovered / read_recovered: the recovered-weights file beside a plan
"""

from autoplan.lazy import lazy_exports

# each name's module is imported on first use (autoplan/lazy.py)
_EXPORTS = {
    "RecoveryMethod": "autoplan.recover.settings",
    "RecoverySettings": "autoplan.recover.settings",
    "RecoveryDiverged": "autoplan.recover.train",
    "RecoveryResult": "autoplan.recover.train",
    "recover": "autoplan.recover.train",
    "RecoveredWeights": "autoplan.recover.weights",
    "read_recovered": "autoplan.recover.weights",
    "resolve_weights_file": "autoplan.recover.weights",
    "weights_path_for": "autoplan.recover.weights",
    "write_recovered": "autoplan.recover.weights",
}
__getattr__ = lazy_exports(globals(), _EXPORTS)

__all__ = ["RecoveredWeights", "RecoveryDiverged", "RecoveryMethod", "RecoveryResult",
           "RecoverySettings", "read_recovered", "recover", "resolve_weights_file",
           "weights_path_for", "write_recovered"]
