"""`--recover`: finalists measured after a recovery pass (compress, train towards the original,
re-apply each layer's format under its mask, measure the model export will write), with the
passes' weights in a work folder beside the plan so a rerun reuses them. A diverging pass is
retried once at a quarter of its rate. docs/architecture.md, "Recovery and quality gates".
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from autoplan.compress import audit_digests, compressed_copy, recompress_linear
from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.models.graph import get_linear, set_module
from autoplan.plan import schema as ps
from autoplan.quality.evaluator import QualityResult
from autoplan.quality.text import is_eval_document, load_documents
from autoplan.quant import SimulatedLinear
from autoplan.recover import (
    RecoveryDiverged,
    RecoverySettings,
    read_recovered,
    recover,
    weights_path_for,
    write_recovered,
)
from autoplan.recover.weights import file_sha256
from autoplan.search.reporter import Reporter
from autoplan.search.verify import Measurement, RecoveredCandidate, Verifier


@dataclass(frozen=True)
class RecoveryText:
    """Training blocks from the calibration split of the recovery text."""

    blocks: Tensor = field(repr=False)  # int64 [n, seq_len]
    source: str
    content_hash: str


def recovery_text(settings: RecoverySettings, tokenizer: Any) -> RecoveryText:
    """The calibration split of ``settings.text`` (never its evaluation split), cut into
    ``seq_len`` blocks, the first ``max_blocks`` of a seeded order."""
    docs, source = load_documents(settings.text)
    text = "\n\n".join(t for k, t in sorted(docs) if not is_eval_document(k))
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
    n = len(ids) // settings.seq_len
    if n < settings.batch:
        raise UserInputError(f"recovery text '{source}' has {n} calibration blocks of "
                             f"{settings.seq_len} tokens, fewer than --recover-batch "
                             f"{settings.batch}: give more text or a shorter --recover-seq-len")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(settings.seed))
    picks = sorted(order[:settings.max_blocks].tolist())
    blocks = torch.tensor([ids[i * settings.seq_len:(i + 1) * settings.seq_len] for i in picks],
                          dtype=torch.long)
    h = hashlib.sha256(f"autoplan-recovery-text-v1\0{settings.seq_len}\0".encode())
    h.update(blocks.numpy().tobytes())
    return RecoveryText(blocks, source, h.hexdigest())


def run_key(model_hash: str, decisions: dict[str, Choice], compression: Any,
            settings: RecoverySettings, text_hash: str) -> str:
    """What a pass trains: a checkpoint or a finished file is reused only under this key."""
    doc = json.dumps({"model": model_hash, "decisions": {k: str(v) for k, v in
                                                         sorted(decisions.items())},
                      "compression": [str(compression.prune_score),
                                      str(compression.quant_method)],
                      "settings": settings.key(), "text": text_hash}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:24]


def plan_quality(q: QualityResult, surrogate: float, passed: bool) -> ps.Quality:
    return ps.Quality(kl=q.kl, ppl=q.ppl, ppl_ref=q.ppl_ref, suite_score=q.suite_score,
                      suite_ref=q.suite_score_ref, surrogate_kl=surrogate, budget_met=passed,
                      eval_tokens=q.n_tokens, slices=dict(q.slices),
                      gates={k: ps.GateScore(score=g.score, reference=g.reference,
                                             detail=dict(g.detail)) for k, g in q.gates.items()},
                      kl_long=q.kl_long)


def recovered_model(model: torch.nn.Module, sims: dict[str, SimulatedLinear]) -> torch.nn.Module:
    """A copy of ``model`` with ``sims`` swapped in (the model export will write)."""
    out = copy.deepcopy(model)
    for name, sim in sims.items():
        set_module(out, name, sim)
    return out


def _saved_losses(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as fh:
        return json.loads((fh.metadata() or {}).get("pass", "{}"))


RATE_BACKOFF = 0.25  # a diverged pass in a search is retried once at this fraction of its rate


@dataclass
class RecoveryStage:
    """Measures candidates after a recovery pass (`Verifier.recovery`)."""

    settings: RecoverySettings
    text: RecoveryText
    model_hash: str
    work_dir: Path
    reporter: Reporter = field(default_factory=Reporter)

    def _rates(self) -> tuple[RecoverySettings, ...]:
        """The pass's settings, then the same at a quarter of the rate: a rate that recovers
        a heavily pruned candidate can make a near-lossless one worse from its first steps
        (measured: lr 5e-4 on a KL-0.05 candidate, loss +30 % by step 10), and the search
        should measure that candidate recovered, not drop the pass."""
        return (self.settings, replace(self.settings, lr=self.settings.lr * RATE_BACKOFF))

    def measure(self, verifier: Verifier, m: Measurement) -> Measurement:
        """``m``'s candidate recovered and re-measured; ``m`` itself if the pass diverges at
        both rates (`_rates`)."""
        decisions = verifier.decisions(m.picks)
        baseline = verifier.space.baseline
        needs = verifier.settings.needs_hessian or any(
            c.sparsity.kind != "dense" and c != baseline for c in decisions.values())
        stats = verifier._calibration_stats() if needs else None
        done = None
        for settings in self._rates():
            # a fresh copy per pass: a diverged pass has trained its copy in place
            compressed, swapped = compressed_copy(verifier.model, decisions, stats,
                                                  verifier.settings, baseline=baseline)
            if not swapped:
                return m
            key = run_key(self.model_hash, decisions, verifier.settings, settings,
                          self.text.content_hash)
            self.reporter.stage(f"recovering {m.label} ({settings.method}, {settings.steps} "
                                f"steps, lr {settings.lr:g})")
            try:
                done = run_pass(verifier.model, compressed, swapped, stats, verifier.settings,
                                settings, self.text, key, self.work_dir, self.reporter)
                break
            except RecoveryDiverged as exc:
                self.reporter.note(f"{m.label}: {exc}")
        if done is None:
            return m
        quality = verifier.evaluator.evaluate(done.model)
        adapter_kl = None
        if done.adapter_model is not None:
            adapter_kl = verifier.evaluator.evaluate(done.adapter_model, slices=False).kl
        passed = verifier.passes(quality)
        record = done.record(plan_quality(m.quality, m.surrogate, m.passed), m.audit,
                             adapter_kl)
        return Measurement(m.picks, m.label, quality, m.surrogate,
                           verifier.budget.badness(quality), passed, audit_digests(done.sims),
                           recovery=RecoveredCandidate(record, done.weights_file))


@dataclass
class PassOutput:
    """A finished pass: the re-quantized layers, the model holding them, its record."""

    sims: dict[str, SimulatedLinear]
    model: torch.nn.Module
    weights_file: Path
    sha256: str
    info: dict
    settings: RecoverySettings
    text: RecoveryText
    adapter_model: torch.nn.Module | None = None

    def record(self, unrecovered: ps.Quality, unrecovered_tensors: dict,
               adapter_kl: float | None) -> ps.Recovery:
        i = self.info
        return ps.Recovery(
            method=self.settings.method.value, settings=self.settings.to_dict(),
            text_source=self.text.source, text_hash=self.text.content_hash,
            weights_file=self.weights_file.name, weights_sha256=self.sha256,
            layers=len(self.sims), steps_run=len(i["losses"]), resumed_from=i["resumed_from"],
            seconds=i["seconds"], cpu_seconds=i["cpu_seconds"], loss_first=i["losses"][0],
            loss_last=i["losses"][-1], unrecovered=unrecovered,
            unrecovered_tensors=unrecovered_tensors, adapter_kl=adapter_kl,
            lora_scaling=i.get("scaling"))


def run_pass(model: torch.nn.Module, compressed: torch.nn.Module,
             swapped: dict[str, SimulatedLinear], stats: dict | None, compression: Any,
             settings: RecoverySettings, text: RecoveryText, key: str, work_dir: Path,
             reporter: Reporter) -> PassOutput:
    """Train (or reuse a finished pass's file), then re-apply each layer's format."""
    path = work_dir / f"{key}.safetensors"
    adapter_model = None
    info = _saved_losses(path) if path.is_file() else {}
    if info.get("key") == key:
        reporter.note(f"reusing the finished recovery pass {path.name}")
        sha = file_sha256(path)
        rec = read_recovered(path, sha)
        weights = rec.weights
    else:
        result = recover(compressed, model, swapped, text.blocks, settings, run_key=key,
                         checkpoint_dir=work_dir / key,
                         on_step=lambda d, t, loss: reporter.progress("recover", d, t))
        info = {"key": key, "losses": result.losses, "resumed_from": result.resumed_from,
                "seconds": result.seconds, "cpu_seconds": result.cpu_seconds,
                "scaling": result.scaling}
        weights = result.weights
        sha = write_recovered(path, weights, result.adapters, result.scaling,
                              extra={"pass": json.dumps(info)})
        adapter_model = result.adapter_model
    sims = {}
    for name, w in weights.items():
        sim = swapped[name]
        sims[name] = recompress_linear(get_linear(model, name), sim.choice, sim.mask, w,
                                       stats.get(name) if stats else None, compression)
    # a reused file has no adapter model in memory: its adapter KL is not measured again
    return PassOutput(sims, recovered_model(model, sims), path, sha, info, settings, text,
                      adapter_model)


def keep_weights(m: Measurement, out: Path) -> ps.Recovery | None:
    """Move a chosen recovered candidate's weights beside the plan; its record, or None."""
    cand = m.recovery
    if cand is None:
        return None
    dest = weights_path_for(out)
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.copyfile(cand.weights_file, tmp)
    os.replace(tmp, dest)
    return cand.record.model_copy(update={"weights_file": dest.name})


def work_dir_for(out: Path) -> Path:
    return out.with_name(out.name + ".recovery")


__all__ = ["PassOutput", "RecoveryStage", "RecoveryText", "keep_weights",
           "plan_quality", "recovered_model", "recovery_text", "run_key", "run_pass",
           "work_dir_for"]
