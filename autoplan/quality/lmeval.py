"""lm-evaluation-harness tasks as quality gates, on the model autoplan holds in memory.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from pathlib import Path
from typing import Any

from torch import nn

from autoplan.errors import UserInputError

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _offline() -> None:
    for k, v in OFFLINE.items():
        os.environ.setdefault(k, v)


def _import_lm_eval() -> Any:
    _offline()
    try:
        import lm_eval  # noqa: F401
        from lm_eval import evaluator, tasks
    except ModuleNotFoundError as exc:
        raise UserInputError(f"an lm-eval budget needs lm-eval ({exc.name} is missing): "
                             "pip install 'autoplan[eval]'") from None
    for name in ("lm_eval", "lm-eval"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return evaluator, tasks


def task_manager(include_path: str | Path | None, task: str | None = None) -> Any:
    """lm-eval's TaskManager: ``include_path``'s tasks alone when it holds ``task`` (indexing
    lm-eval's own thousands of YAML files takes seconds), else lm-eval's as well."""
    _, tasks = _import_lm_eval()
    if include_path is not None and not Path(include_path).is_dir():
        raise UserInputError(f"lm-eval task folder '{include_path}' not found: pass a folder "
                             "of task YAML files")
    if include_path is not None:
        local = tasks.TaskManager(include_path=str(include_path), include_defaults=False)
        if task is None or task in local.all_tasks:
            return local
    return tasks.TaskManager(include_path=str(include_path) if include_path else None)


def check_task(task: str, include_path: str | Path | None) -> None:
    """Refuse an unknown task name before the model loads."""
    manager = task_manager(include_path, task)
    if task not in manager.all_tasks:
        raise UserInputError(f"lm-eval has no task '{task}'"
                             + (f" (nor does {include_path})" if include_path else "")
                             + ": pass its YAML folder with --lm-eval-tasks DIR")


def _missing(task: str, exc: Exception) -> UserInputError:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return UserInputError(f"lm-eval task '{task}' cannot load its data offline ({text[:200]}): "
                          "put the dataset in the local Hugging Face cache or give a local "
                          "task YAML with --lm-eval-tasks DIR")


class LmEvalGate:
    """One lm-eval task as a quality gate: ``score(model)`` in points (metric x 100).

    Args:
        task: the task name (lm-eval's registry or ``include_path``'s YAML).
        tokenizer: the model's tokenizer.
        include_path: a folder of local task YAML files (None: lm-eval's own tasks).
        metric: the metric to gate on (default: the task's first).
        limit: evaluate only the first N documents (None: all).
        batch_size: requests per forward pass.
    """

    def __init__(self, task: str, tokenizer: Any, *, include_path: str | Path | None = None,
                 metric: str | None = None, limit: int | None = None, batch_size: int = 8,
                 seed: int = 0) -> None:
        self.name = f"lm-eval:{task}"
        self.task, self.tokenizer, self.metric = task, tokenizer, metric
        self.limit, self.batch_size, self.seed = limit, batch_size, seed
        self.manager = task_manager(include_path, task)
        if task not in self.manager.all_tasks:
            check_task(task, include_path)
        self._task_dict = self._load_tasks()

    def _load_tasks(self) -> Any:
        try:
            with _quiet():
                return self.manager.load([self.task])
        except (ConnectionError, FileNotFoundError, OSError, ValueError) as exc:
            raise _missing(self.task, exc) from None
        except Exception as exc:  # datasets' own errors (DatasetNotFoundError, ...)
            if type(exc).__module__.startswith(("datasets", "huggingface_hub")):
                raise _missing(self.task, exc) from None
            raise

    def _lm(self, model: nn.Module) -> Any:
        from lm_eval.models.huggingface import HFLM

        with _quiet():
            return HFLM(pretrained=model, tokenizer=self.tokenizer, batch_size=self.batch_size,
                        max_length=getattr(model.config, "max_position_embeddings", None))

    def score(self, model: nn.Module) -> tuple[float, dict[str, float]]:
        evaluator, _ = _import_lm_eval()
        with _quiet():
            out = evaluator.evaluate(lm=self._lm(model), task_dict=self._task_dict,
                                     limit=self.limit, bootstrap_iters=0, log_samples=False,
                                     verbosity="ERROR")
        results = out["results"][self.task]
        metrics = {k.split(",")[0]: float(v) for k, v in results.items()
                   if "," in k and "_stderr" not in k and isinstance(v, int | float)}
        if not metrics:
            raise UserInputError(f"lm-eval task '{self.task}' reported no numeric metric")
        name = self.metric or next(iter(metrics))
        if name not in metrics:
            raise UserInputError(f"lm-eval task '{self.task}' has no metric '{name}' "
                                 f"(it reports {', '.join(metrics)})")
        return 100.0 * metrics[name], {k: 100.0 * v for k, v in metrics.items()}


@contextlib.contextmanager
def _quiet():  # noqa: ANN202 - a context manager
    """lm-eval and datasets print progress bars and warnings; keep stderr for autoplan's
    own output (a failure still raises, with its message)."""
    loggers = [logging.getLogger(n) for n in ("lm_eval", "datasets", "transformers")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:  # their tqdm bars write to sys.stderr, looked up when each bar starts
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, lv in zip(loggers, levels, strict=True):
            lg.setLevel(lv)


__all__ = ["LmEvalGate", "OFFLINE", "check_task", "task_manager"]
