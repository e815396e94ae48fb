"""The OpenVINO GenAI peer as bench Sides: INT8 and INT4 weight-compressed IR of the model's
HF folder, timed by a persistent openvino_worker.py subprocess in the openvino engine's venv.

Conversion is what an OpenVINO user runs: `optimum-cli export openvino --weight-format int8`
(NNCF: asymmetric per-channel INT8 weights) and `--weight-format int4 --group-size G`
(NNCF: asymmetric INT4 in groups of G for the decoder blocks' linear layers; NNCF keeps the
embedding, tied to lm_head on SmolLM2, in INT8 as its backup precision). The default group of
128 does not divide SmolLM2-135M's hidden size (576), so G defaults to 32, the group of
autoplan's own default INT4 side. Converted folders are cached under
`$AUTOPLAN_CACHE/openvino/`, keyed by the source weights' content hash and the arguments.

Quality: the same IR is compiled by openvino.Core in a second worker and returns every
position's logits for the evaluation blocks (one prefill per block); autoplan's own metric
code (autoplan.bench.quality.logits_quality) scores them against the original model.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from _worker_client import WorkerGenerator, worker_side

from autoplan.bench import Side
from autoplan.errors import AutoplanError, UserInputError
from autoplan.atomic import atomic_new_dir  # noqa: E402
from autoplan.cache_dir import cache_root

WORKER = Path(__file__).with_name("openvino_worker.py")
CACHE_VERSION = 1  # bump when the conversion's arguments or layout change
_CLI = "import sys; from optimum.commands.optimum_cli import main; sys.exit(main())"


def export_args(fmt: str, int4_group_size: int) -> list[str]:
    """optimum-cli's weight-compression arguments for ``int8`` or ``int4``."""
    if fmt == "int8":
        return ["--weight-format", "int8"]
    if fmt == "int4":
        return ["--weight-format", "int4", "--group-size", str(int4_group_size)]
    raise UserInputError(f"unknown OpenVINO format '{fmt}': use int8 or int4")


def convert(python: Path, hf_folder: Path, content_hash: str, fmt: str,
            int4_group_size: int = 32, extra: tuple[str, ...] = ()) -> Path:
    """The OpenVINO IR folder of ``hf_folder`` compressed to ``fmt`` (converted once, cached).

    Args:
        extra: further optimum-cli arguments (e.g. NNCF's ``--ratio 0.8``), part of the key.

    Raises:
        AutoplanError: optimum-cli failed; the message holds its last lines.
    """
    args = ["--task", "text-generation-with-past", *export_args(fmt, int4_group_size), *extra]
    key = hashlib.sha256(json.dumps([CACHE_VERSION, content_hash, args]).encode()).hexdigest()
    dest = cache_root() / "openvino" / f"{hf_folder.name}-{fmt}-{key[:16]}"
    if (dest / "openvino_model.xml").is_file():
        return dest
    with atomic_new_dir(dest, complete=lambda d: (d / "config.json").is_file()) as tmp:
        cmd = [str(python), "-c", _CLI, "export", "openvino", "--model", str(hf_folder), *args,
               str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        # the converter's bit-width table (which layers got which precision) is kept beside it
        (tmp / "autoplan_convert.log").write_text(f"$ {' '.join(cmd[:1] + cmd[3:])}\n"
                                                  f"{proc.stdout}\n{proc.stderr}")
        if proc.returncode or not (tmp / "openvino_model.xml").is_file():
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
            raise AutoplanError(f"optimum-cli export openvino {' '.join(args)} failed "
                                f"(exit {proc.returncode}): {tail}")
    return dest


def _hint(python: Path) -> str:
    return (f"check `import openvino_genai` works in {python} (`autoplan engines install "
            "openvino`), or run benchmarks/openvino_worker.py by hand to see why")


def openvino_side(python: Path, ir_dir: Path, name: str, threads: int) -> Side:
    """A bench Side generating through openvino_genai.LLMPipeline, batch 1."""
    gen = WorkerGenerator("OpenVINO", [str(python), str(WORKER), "generate", str(ir_dir),
                                       str(threads)], _hint(python))
    side = worker_side(name, "openvino", gen, (ir_dir / "openvino_model.bin").stat().st_size)
    return side


class _WorkerLogits:
    """``model(input_ids=[B, S]) -> .logits [B, S, V]`` through a logits-mode worker."""

    def __init__(self, gen: WorkerGenerator, folder: Path) -> None:
        self.gen, self.folder = gen, folder

    def __call__(self, input_ids: Any, use_cache: bool = False) -> SimpleNamespace:
        import torch

        ids, logits = self.folder / "ids.npy", self.folder / "logits.npy"
        np.save(ids, np.ascontiguousarray(input_ids.numpy(), dtype=np.int64))
        self.gen.request({"ids_npy": str(ids), "logits_npy": str(logits)})
        return SimpleNamespace(logits=torch.from_numpy(np.load(logits)))


# CPU plugin properties that make the IR's arithmetic exact up to fp32: no bf16 compute, no
# dynamic int8 quantization of activations, an fp32 KV cache. Its KL is the weight
# compression's own error, apart from what the runtime's defaults add.
EXACT_ARITHMETIC = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
                    "KV_CACHE_PRECISION": "f32"}


def openvino_quality(python: Path, ir_dir: Path, ref: Any, threads: int,
                     overrides: dict | None = None) -> dict:
    """KL and perplexity of the IR's own logits vs the original model on ``ref``'s tokens,
    plus the precisions the CPU plugin chose for it.

    Args:
        overrides: CPU plugin properties replacing its defaults (None: the defaults, which
            the pipeline runs; EXACT_ARITHMETIC: the weight compression's error alone).
    """
    from autoplan.bench.quality import logits_quality

    gen = WorkerGenerator("OpenVINO", [str(python), str(WORKER), "logits", str(ir_dir),
                                       str(threads), *([json.dumps(overrides)] if overrides
                                                       else [])],
                          _hint(python))
    try:
        with tempfile.TemporaryDirectory(prefix="ov-logits-") as tmp:
            q = logits_quality(_WorkerLogits(gen, Path(tmp)), ref)
    finally:
        gen.close()
    return {**q, **{k: gen.hello.get(k) for k in ("inference_precision", "kv_cache_precision",
                                                  "dynamic_quantization_group_size")},
            "overrides": overrides or {},
            "how": "every position's logits of the same IR via openvino.Core, one prefill per "
                   "evaluation block"}


__all__ = ["EXACT_ARITHMETIC", "convert", "export_args", "openvino_quality", "openvino_side"]
