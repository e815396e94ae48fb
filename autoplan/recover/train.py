"""The recovery pass: train a compressed model towards the original's output distribution.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autoplan.errors import AutoplanError
from autoplan.heap import frees_kept_for_reuse
from autoplan.models.graph import set_module
from autoplan.models.head import chunk_rows, row_chunks, split_lm
from autoplan.quant import SimulatedLinear
from autoplan.recover.checkpoint import (
    Checkpoint,
    adam_moments,
    clear_checkpoint,
    load_checkpoint,
    restore_moments,
    save_checkpoint,
)
from autoplan.recover.settings import RecoveryMethod, RecoverySettings
from autoplan.recover.trainable import RecoverableLinear

RISE_FACTOR = 1.1  # last window's mean loss over the unrecovered one that counts as rising
ADAPTER = "default"  # PEFT's adapter name


class RecoveryDiverged(AutoplanError):
    """The recovery loss became non-finite or rose; the unrecovered weights are kept."""


@dataclass
class RecoveryResult:
    """What a pass trained.

    Attributes:
        weights: layer -> recovered fp32 weight, exactly zero where its mask prunes, before
            its format is re-applied (for ``lora``: the adapter merged under the mask).
        adapters: ``lora`` only: layer -> {"lora_A": [r, in], "lora_B": [out, r]} and the
            adapters' scaling (alpha / r) in ``scaling``.
        losses: the loss of every step (the resumed steps' from the checkpoint).
        resumed_from: the step a checkpoint resumed (0: a fresh start).
        seconds: wall time of the steps run now; cpu_seconds: their process CPU time.
        adapter_model: ``lora`` only: the student with its adapters unmerged (inputs to the
            adapters unquantized), to measure the model an adapter-serving engine runs.
    """

    weights: dict[str, Tensor] = field(repr=False)
    adapters: dict[str, dict[str, Tensor]] = field(repr=False)
    losses: list[float]
    resumed_from: int
    seconds: float
    cpu_seconds: float
    scaling: float | None = None
    adapter_model: nn.Module | None = field(default=None, repr=False)


def block_order(n_blocks: int, step: int, batch: int, seed: int) -> list[int]:
    """The training blocks of ``step``: a seeded permutation of all blocks per epoch."""
    out = []
    for i in range(step * batch, (step + 1) * batch):
        epoch, pos = divmod(i, n_blocks)
        perm = torch.randperm(n_blocks, generator=torch.Generator().manual_seed(seed + epoch))
        out.append(int(perm[pos]))
    return out


def lr_factor(step: int, settings: RecoverySettings) -> float:
    """Linear warmup to the peak, then cosine decay to 10 % of it."""
    warm = settings.warmup_steps
    if step < warm:
        return (step + 1) / (warm + 1)
    progress = (step - warm) / max(1, settings.steps - warm)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def distillation_loss(teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
    """Mean per-position KL(P_teacher || P_student), full vocabulary, in nats."""
    t = torch.log_softmax(teacher_logits.float(), dim=-1)
    s = torch.log_softmax(student_logits.float(), dim=-1)
    return F.kl_div(s, t, log_target=True, reduction="none").sum(-1).mean()


def distill(teacher: nn.Module, student: nn.Module, batch: Tensor, *,
            backward: bool) -> float:
    """`distillation_loss` of the two models on `batch`, computed a chunk of positions at a
    time (the logits of a 262k vocabulary never exist for the whole batch); with
    `backward`, its gradient is accumulated into the student's parameters chunk by chunk
    and sent once through the student's decoder. Returns the loss."""
    ts, ss = split_lm(teacher), split_lm(student)
    if ts is None or ss is None:
        with torch.no_grad():
            target = teacher(input_ids=batch, use_cache=False).logits
        loss = distillation_loss(target, student(input_ids=batch, use_cache=False).logits)
        if backward:
            loss.backward()
        return float(loss.detach())
    rows = chunk_rows(student.config.vocab_size)
    with torch.no_grad():
        teacher_hidden = ts.body(batch)
        teacher_rows = teacher_hidden.reshape(-1, teacher_hidden.shape[-1])
    student_hidden = ss.body(batch)
    detached = student_hidden.detach().requires_grad_(backward)
    positions = teacher_rows.shape[0]
    total = 0.0
    for start, _part, logits in row_chunks(ss.head, detached, rows):
        with torch.no_grad():
            t = torch.log_softmax(ts.head(teacher_rows[start:start + logits.shape[0]]).float(),
                                  dim=-1)
        chunk = F.kl_div(torch.log_softmax(logits.float(), dim=-1), t, log_target=True,
                         reduction="sum") / positions
        if backward:
            chunk.backward()  # the head's own parameters, and the gradient at `detached`
        total += float(chunk.detach())
    if backward and student_hidden.requires_grad:
        student_hidden.backward(detached.grad)
    return total


def _rising(losses: list[float], window: int, initial: float) -> bool:
    if len(losses) < 2 * window:
        return False
    return sum(losses[-window:]) / window > RISE_FACTOR * initial


@torch.no_grad()
def initial_loss(student: nn.Module, teacher: nn.Module, blocks: Tensor,
                 settings: RecoverySettings, window: int) -> float:
    """The unrecovered model's mean loss on the first ``window`` steps' blocks."""
    total = 0.0
    for step in range(window):
        batch = blocks[block_order(blocks.shape[0], step, settings.batch, settings.seed)]
        total += distill(teacher, student, batch, backward=False)
    return total / window


def _swap_in(student: nn.Module, layers: Mapping[str, SimulatedLinear], trainable: bool
             ) -> dict[str, RecoverableLinear]:
    out = {}
    for name, sim in layers.items():
        out[name] = RecoverableLinear(sim, trainable=trainable)
        set_module(student, name, out[name])
    return out


def _inject_lora(student: nn.Module, names: list[str], settings: RecoverySettings) -> None:
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(settings.seed)  # PEFT's kaiming init of lora_A; lora_B starts at zero
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=0.0,
                        target_modules=names, bias="none")
    inject_adapter_in_model(config, student, adapter_name=ADAPTER)


def _trainable(student: nn.Module) -> dict[str, nn.Parameter]:
    return {n: p for n, p in student.named_parameters() if p.requires_grad}


def _results(student: nn.Module, swapped: dict[str, RecoverableLinear],
             settings: RecoverySettings) -> tuple[dict[str, Tensor], dict, float | None]:
    weights: dict[str, Tensor] = {}
    adapters: dict[str, dict[str, Tensor]] = {}
    scaling = None
    for name, layer in swapped.items():
        w = layer.weight.detach().float()
        if settings.method is RecoveryMethod.LORA:
            lora = student.get_submodule(name)  # PEFT's LoraLayer around the layer
            delta = lora.get_delta_weight(ADAPTER).detach().float()
            adapters[name] = {"lora_A": lora.lora_A[ADAPTER].weight.detach().clone(),
                              "lora_B": lora.lora_B[ADAPTER].weight.detach().clone()}
            scaling = float(lora.scaling[ADAPTER])
            w = w + delta
        weights[name] = (w * layer.mask).contiguous()
    return weights, adapters, scaling


def recover(student: nn.Module, teacher: nn.Module, layers: Mapping[str, SimulatedLinear],
            blocks: Tensor, settings: RecoverySettings, *, run_key: str,
            checkpoint_dir: Path | None = None,
            on_step: Callable[[int, int, float], None] | None = None) -> RecoveryResult:
    """Train ``student`` (a compressed copy whose ``layers`` are SimulatedLinears) towards
    ``teacher`` (the original) on ``blocks`` [n, seq_len] of calibration tokens.

    The student's SimulatedLinears are replaced in place by RecoverableLinears (and, for
    lora, wrapped by PEFT); the caller re-applies each layer's format to
    ``RecoveryResult.weights`` (``autoplan.compress.recompress_linear``).

    Args:
        run_key: identifies what is trained (decisions, model, text, settings); a checkpoint
            in ``checkpoint_dir`` with another key is not resumed.
        checkpoint_dir: where to checkpoint every ``settings.checkpoint_every`` steps and
            resume from; removed when the pass completes. None: no checkpoints.
        on_step: called with (steps done, total steps, loss) after every step.

    Raises:
        RecoveryDiverged: the loss became NaN/inf or rose (names the step and the fix).
    """
    # a step frees and re-allocates the same ~1-2 GB; kept in the heap, not page-faulted
    # back from the OS every step (autoplan/heap.py: 5.35 -> 4.67 s a step on SmolLM2)
    with frees_kept_for_reuse():
        return _train(student, teacher, layers, blocks, settings, run_key=run_key,
                      checkpoint_dir=checkpoint_dir, on_step=on_step)


def _train(student: nn.Module, teacher: nn.Module, layers: Mapping[str, SimulatedLinear],
           blocks: Tensor, settings: RecoverySettings, *, run_key: str,
           checkpoint_dir: Path | None,
           on_step: Callable[[int, int, float], None] | None) -> RecoveryResult:
    names = list(layers)
    lora = settings.method is RecoveryMethod.LORA
    for p in student.parameters():
        p.requires_grad_(False)
    swapped = _swap_in(student, layers, trainable=not lora)
    if lora:
        _inject_lora(student, names, settings)
        for n, p in student.named_parameters():
            p.requires_grad_(".lora_A." in n or ".lora_B." in n)
    params = _trainable(student)
    # fused: one kernel over all tensors, about a tenth of a step faster on SmolLM2 (2 CPU
    # cores) than the per-tensor loop torch picks for CPU; same update up to fp32 rounding
    opt = torch.optim.AdamW(list(params.values()), lr=settings.lr, betas=(0.9, 0.999),
                            weight_decay=0.0, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, settings))
    start, losses, before = 0, [], 0.0
    ck = load_checkpoint(checkpoint_dir, run_key)
    if ck is not None and set(ck.params) == set(params):
        with torch.no_grad():
            for n, t in ck.params.items():
                params[n].copy_(t)
        restore_moments(opt, params, ck.moments, ck.step)
        start, losses, before = ck.step, list(ck.losses), ck.elapsed_s
        with warnings.catch_warnings():  # stepping the schedule to `start` before opt.step()
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(start):
                sched.step()
    window = max(5, settings.steps // 20)
    student.eval()  # no dropout; gradients flow in eval mode too
    teacher.eval()
    initial = initial_loss(student, teacher, blocks, settings, window) if start == 0 \
        else (ck.initial if ck is not None else 0.0)
    t0, c0 = time.perf_counter(), time.process_time()
    by_id = {id(p): n for n, p in params.items()}
    for step in range(start, settings.steps):
        batch = blocks[block_order(blocks.shape[0], step, settings.batch, settings.seed)]
        opt.zero_grad(set_to_none=True)
        value = distill(teacher, student, batch, backward=True)
        losses.append(value)
        if not math.isfinite(value) or _rising(losses, window, initial):
            clear_checkpoint(checkpoint_dir)
            why = f"loss {value:.4g}" if not math.isfinite(value) else \
                f"loss rose from {initial:.4g} to {sum(losses[-window:]) / window:.4g}"
            raise RecoveryDiverged(
                f"recovery diverged at step {step + 1} ({why}); the plan is kept unrecovered: "
                f"lower --recover-lr (now {settings.lr:g})")
        if not lora:
            for layer in swapped.values():
                layer.mask_grad()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        sched.step()
        if not lora:
            for layer in swapped.values():
                layer.apply_mask()
        done = step + 1
        if on_step is not None:
            on_step(done, settings.steps, value)
        if checkpoint_dir is not None and settings.checkpoint_every and \
                done % settings.checkpoint_every == 0 and done < settings.steps:
            save_checkpoint(checkpoint_dir, run_key, Checkpoint(
                done, losses, before + time.perf_counter() - t0,
                {n: p.detach() for n, p in params.items()}, adam_moments(opt, by_id),
                initial))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    weights, adapters, scaling = _results(student, swapped, settings)
    clear_checkpoint(checkpoint_dir)
    return RecoveryResult(weights, adapters, losses, start, seconds, cpu, scaling,
                          student if lora else None)


__all__ = ["RecoveryDiverged", "RecoveryResult", "block_order", "distill", "distillation_loss",
           "initial_loss", "lr_factor", "recover"]
