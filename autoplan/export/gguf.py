"""`--format gguf`: one GGUF file for llama.cpp, each linear tensor in the type its plan chose.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from autoplan import __version__
from autoplan.atomic import atomic_dir, replace_files
from autoplan.errors import AutoplanError, UnsupportedFormatError, UserInputError
from autoplan.export._prepare import Prepared
from autoplan.export._write import AUDIT_FILE, PLAN_FILE, is_export, write_sidecars
from autoplan.export.kv import DEPLOY_JSON, DEPLOY_SH
from autoplan.formats import Precision, registered_formats
from autoplan.formats.gguf_blocks import MXFP4, block_format, gguf_type_name, pack_blocks
from autoplan.models.graph import get_linear

if TYPE_CHECKING:
    from autoplan.models import LoadedModel

GGUF_FILE = "model.gguf"


def ggml_type_name(precision: Precision) -> str:
    """The GGUF tensor type that stores a precision (``q4_1`` -> ``Q4_1``).

    Only formats simulated as ggml-cpu runs them have one: vLLM's ``mxfp4`` (MXFP4 inputs)
    is refused, since llama.cpp would run its bytes with Q8_0 inputs; ``gguf_mxfp4`` is
    ggml's MXFP4 with those inputs.

    Raises:
        UnsupportedFormatError: the precision has no GGUF type.
    """
    name = gguf_type_name(precision)  # the FormatSpec's name
    if name is not None:
        return name
    stored = ", ".join(s.name for s in registered_formats() if gguf_type_name(s.precision))
    raise UnsupportedFormatError(
        f"GGUF has no type for {precision.value}: plan with --runtime llama.cpp ({stored})")


def source_gguf(loaded: LoadedModel) -> Path:
    """The GGUF file the model was converted from.

    Raises:
        UserInputError: the model did not come from a GGUF (names the fix).
    """
    return check_gguf_source(getattr(loaded, "source", None), loaded.model_id)


def check_gguf_source(source: Any, model_id: str) -> Path:
    """The GGUF file of a model argument (a ``ModelSource``, or None for a model built in
    memory), refused before loading when it is not a GGUF.

    Raises:
        UserInputError: the model is not a GGUF file or a GGUF alias (names the fix).
    """
    if source is None or source.kind not in ("gguf", "alias") or \
            source.path.suffix.lower() != ".gguf":
        raise UserInputError(
            f"--format gguf needs a model planned from a GGUF file, but '{model_id}' is "
            "an HF folder: convert it first with llama.cpp's convert_hf_to_gguf.py "
            "(--outtype f32), then search and export on that .gguf")
    return source.path


def llama_permutation(rows: int, n_head: int) -> torch.Tensor:
    """Row index of llama.cpp's q/k ``permute``: gguf_rows = hf_rows[index]."""
    idx = torch.arange(rows)
    return idx.reshape(n_head, 2, rows // n_head // 2).transpose(1, 2).reshape(rows)


def row_order(hf_weight: torch.Tensor, source: torch.Tensor, heads: tuple[int, ...]
              ) -> torch.Tensor | None:
    """The row index that turns the model's weight into the source tensor (None: identity).

    Raises:
        AutoplanError: no known order reproduces the source tensor.
    """
    w = hf_weight.detach().float()
    if torch.equal(w, source):
        return None
    for n_head in dict.fromkeys(heads):
        if n_head and w.shape[0] % (2 * n_head) == 0:
            index = llama_permutation(w.shape[0], n_head)
            if torch.equal(w[index], source):
                return index
    raise AutoplanError("a model tensor matches its source GGUF tensor in no known row order: "
                        "re-convert the model from this GGUF")


@dataclass(frozen=True)
class _Planned:
    """A linear tensor written from the plan: its simulated layer and GGUF row order."""

    sim: Any
    order: torch.Tensor | None = None


@dataclass(frozen=True)
class _PlannedStack:
    """A stacked expert tensor (`ffn_*_exps` [E, out, in]) written from the plan: every
    expert's simulated layer, in expert order; they share one type (one decision unit).
    ``rows``: the rows of each expert's layer the tensor holds (gpt-oss: its interleaved
    gate_up split into gate and up); ``source``: the source GGUF's tensor of that name."""

    sims: tuple[Any, ...]
    rows: torch.Tensor | None = None
    source: Any = None

    @property
    def sim(self) -> Any:
        return self.sims[0]

    @property
    def out_rows(self) -> int:
        return self.sim.out_features if self.rows is None else len(self.rows)

    def data(self) -> tuple[np.ndarray, str]:
        parts = [_linear_bytes(s, self.rows) for s in self.sims]
        if len({kind for _, kind in parts}) != 1:
            raise UnsupportedFormatError(
                f"the experts of one stacked GGUF tensor are planned in "
                f"{sorted({kind for _, kind in parts})}: llama.cpp stores them with one type; "
                "re-plan with --runtime llama.cpp")
        data, kind = np.stack([data for data, _ in parts]), parts[0][1]
        if kind == MXFP4 and self.source is not None and \
                self.source.tensor_type.name == kind and _same_values(data, self.source):
            # the plan keeps the source's MXFP4: its own bytes. A block has more than one
            # encoding of the same values (largest code below 4, or a -0), and the source's
            # quantizer (OpenAI's, for gpt-oss) need not pick ggml's; llama.cpp's dot gives
            # the same result for either, so the file holds the model as it was
            return np.asarray(self.source.data).reshape(data.shape), kind
        return data, kind


def _same_values(data: np.ndarray, source: Any) -> bool:
    from gguf import GGMLQuantizationType, dequantize

    src = np.asarray(source.data)
    if src.nbytes != data.nbytes:
        return False
    with np.errstate(over="ignore"):
        mine = dequantize(data, GGMLQuantizationType.MXFP4)
        theirs = dequantize(src, GGMLQuantizationType.MXFP4)
    return np.array_equal(mine.reshape(-1), theirs.reshape(-1))


def mxfp4_blocks(codes: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """Plan MXFP4 (E2M1 codes [rows, cols] with the sign in bit 3, E8M0 scale codes [rows,
    cols / 32]) as ggml's ``block_mxfp4`` bytes [rows, cols / 32 * 17]: the scale byte, then
    16 bytes holding element j in the low nibble of byte j and element j + 16 in its high
    nibble (the inverse of ``gguf_gptoss``'s read)."""
    c = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, 32) & 0x0F
    qs = c[..., :16] | (c[..., 16:] << 4)
    raw = torch.cat([scales.to(torch.uint8).unsqueeze(-1), qs], dim=-1)
    return np.ascontiguousarray(raw.flatten(-2).numpy())


def _linear_bytes(sim: Any, index: torch.Tensor | None) -> tuple[np.ndarray, str]:
    """The plan's layer as GGUF tensor data (rows in GGUF order) and its type name."""
    precision = sim.choice.precision
    kind = ggml_type_name(precision)
    pick = (lambda t: t) if index is None else (lambda t: t[index])
    if kind == MXFP4:
        return mxfp4_blocks(pick(sim.quantized.codes),
                            pick(sim.quantized.scales["weight_scale"])), kind
    fmt = block_format(precision)
    if fmt is not None:
        scales = sim.quantized.scales
        minimum = scales.get("weight_min")
        data = pack_blocks(pick(sim.quantized.codes), pick(scales["weight_scale"]),
                           None if minimum is None else pick(minimum), fmt)
        return data, kind
    from gguf import GGMLQuantizationType, quantize

    # a float type (F32, F16, BF16): gguf's own conversion of the plan's exact weights
    return quantize(pick(sim.weight).float().numpy(), GGMLQuantizationType[kind]), kind


def _file_type(types: dict[str, tuple[str, int]]) -> int:
    """general.file_type: the llama.cpp ftype of the type holding most linear weights."""
    from gguf import LlamaFileType

    weight: dict[str, int] = {}
    for kind, params in types.values():
        weight[kind] = weight.get(kind, 0) + params
    top = max(weight, key=weight.get)
    floats = {"F32": LlamaFileType.ALL_F32, "F16": LlamaFileType.MOSTLY_F16,
              "BF16": LlamaFileType.MOSTLY_BF16, "MXFP4": LlamaFileType.MOSTLY_MXFP4_MOE}
    return int(floats[top] if top in floats else LlamaFileType[f"MOSTLY_{top}"])


def _copy_metadata(reader: Any, writer: Any) -> None:
    from gguf import GGUFValueType, Keys

    for field in reader.fields.values():
        if field.name == Keys.General.ARCHITECTURE or field.name.startswith("GGUF.") or \
                field.name in (Keys.General.FILE_TYPE, Keys.General.QUANTIZED_BY):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)


def _gptoss_gate_up(prep: Prepared, by_name: dict[str, Any]) -> dict[str, _PlannedStack]:
    """gpt-oss's stacked gate / up tensors from each expert's interleaved ``gate_up_proj``
    (gate row i at 2i, up row i at 2i + 1), in the source's layout: ``ffn_gate_exps`` (even
    rows) and ``ffn_up_exps`` (odd rows), as convert_hf_to_gguf.py's GptOssModel writes
    them, or one ``ffn_gate_up_exps`` (all gate rows, then all up rows).

    Raises:
        AutoplanError: a block's gate/up tensors are missing from the source GGUF.
    """
    from autoplan.models.gguf_gptoss import gate_up_tensors

    moe = prep.loaded.spec.moe
    out: dict[str, _PlannedStack] = {}
    for block in range(prep.loaded.spec.n_layers):
        names = [f"model.layers.{block}.mlp.experts.{e}.gate_up_proj"
                 for e in range(moe.n_experts)]
        if not all(n in prep.sims for n in names):
            continue
        sims = tuple(prep.sims[n] for n in names)
        rows = sims[0].out_features
        even, odd = torch.arange(0, rows, 2), torch.arange(1, rows, 2)
        try:
            gate, up = gate_up_tensors(by_name, block, "weight")
        except KeyError as missing:
            raise AutoplanError(f"the gpt-oss GGUF holds no {missing.args[0]}: re-convert the "
                                "model with llama.cpp's convert_hf_to_gguf.py") from None
        if up is None:  # one fused stack: all gate rows, then all up rows
            out[gate.name] = _PlannedStack(sims, torch.cat([even, odd]), gate)
            continue
        out[gate.name] = _PlannedStack(sims, even, gate)
        out[up.name] = _PlannedStack(sims, odd, up)
    return out


def write_gguf(prep: Prepared, path: Path) -> dict[str, dict[str, Any]]:
    """Write the plan as one GGUF at ``path``; returns the per-tensor audit (type, sha256).

    Raises:
        UserInputError: the model did not come from a GGUF.
        AutoplanError: the model and its source GGUF disagree.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter, dequantize

    from autoplan.models.gguf_convert import hf_to_gguf_names
    from autoplan.models.gguf_read import open_gguf

    src = source_gguf(prep.loaded)
    reader = open_gguf(src)  # its own: the cached header reader would keep the data mapped
    model = prep.loaded.model
    names: dict[str, list[str]] = {}  # GGUF tensor -> HF parameters (a stack: every expert's)
    for h, g in hf_to_gguf_names(model, prep.loaded.spec.n_layers).items():
        names.setdefault(g, []).append(h)
    by_name = {t.name: t for t in reader.tensors}
    spec = prep.loaded.spec
    heads = (spec.n_heads, spec.n_kv_heads)
    plan: list[tuple[str, Any]] = []  # (gguf name, source tensor or _Planned)
    gate_up = _gptoss_gate_up(prep, by_name) if spec.model_type == "gpt_oss" else {}
    for tensor in reader.tensors:
        if tensor.name in gate_up:
            plan.append((tensor.name, gate_up[tensor.name]))
            continue
        hfs = [h.removesuffix(".weight") for h in names.get(tensor.name, [])]
        if len(hfs) > 1 and all(h in prep.sims for h in hfs):  # routed experts, stacked
            plan.append((tensor.name, _PlannedStack(tuple(prep.sims[h] for h in hfs),
                                                    source=tensor)))
            continue
        hf = hfs[0] if hfs else ""
        if hf in prep.sims:
            deq = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy())
            order = row_order(get_linear(model, hf).weight, deq, heads)
            plan.append((tensor.name, _Planned(prep.sims[hf], order)))
        else:
            plan.append((tensor.name, tensor))
    lm = next((layer.name for layer in spec.layers if layer.role == "lm_head"), None)
    if lm in prep.sims and "output.weight" not in by_name:
        embd = by_name.get("token_embd.weight")
        sim = prep.sims[lm]
        data, kind = _linear_bytes(sim, None)
        tied = embd is not None and embd.tensor_type.name == kind and \
            np.array_equal(data, np.asarray(embd.data).reshape(data.shape))
        if not tied:
            plan.append(("output.weight", _Planned(sim)))

    writer = GGUFWriter(str(path), reader.fields["general.architecture"].contents())
    _copy_metadata(reader, writer)
    audit: dict[str, dict[str, Any]] = {}
    linear_types: dict[str, tuple[str, int]] = {}
    for name, item in plan:
        if isinstance(item, (_Planned, _PlannedStack)):
            sim = item.sim
            kind = ggml_type_name(sim.choice.precision)
            qtype = GGMLQuantizationType[kind]
            block, size = GGML_QUANT_SIZES[qtype]
            cols = sim.in_features
            if cols % block:
                raise UnsupportedFormatError(f"{name} has {cols} inputs, not a multiple of the "
                                             f"{kind} block ({block}); re-plan it")
            shape = (sim.out_features, cols) if isinstance(item, _Planned) else \
                (len(item.sims), item.out_rows, cols)
            count = int(np.prod(shape))
            writer.add_tensor_info(name, shape, np.dtype(np.float32), count // block * size,
                                   raw_dtype=qtype)
            linear_types[name] = (kind, count)
        else:
            writer.add_tensor_info(name, item.data.shape, item.data.dtype, item.data.nbytes,
                                   item.tensor_type)
    writer.add_key_value("general.file_type", _file_type(linear_types), GGUFValueType.UINT32)
    writer.add_key_value("general.quantized_by", f"autoplan {__version__}", GGUFValueType.STRING)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, item in plan:
        if isinstance(item, _Planned):
            data, kind = _linear_bytes(item.sim, item.order)
        elif isinstance(item, _PlannedStack):
            data, kind = item.data()
        else:
            data, kind = np.asarray(item.data), item.tensor_type.name
        writer.write_tensor_data(np.ascontiguousarray(data))
        audit[name] = {"type": kind, "sha256": hashlib.sha256(
            np.ascontiguousarray(data).view(np.uint8).tobytes()).hexdigest(),
            "source": "copied" if not isinstance(item, (_Planned, _PlannedStack)) else "plan"}
    writer.close()
    return audit


class GgufExporter:
    """Writes ``model.gguf`` into a folder, or a single ``FILE.gguf`` with its sidecars
    (``FILE.autoplan_plan.json``, ``FILE.autoplan_export.json``) beside it."""

    name = "gguf"
    runtimes = ("llama.cpp",)

    def write(self, prep: Prepared, out_dir: str | Path) -> Path:
        """Write atomically; returns the GGUF file's path."""
        source_gguf(prep.loaded)  # refuse an HF-folder model before any work
        for name, choice in prep.choices.items():
            ggml_type_name(choice.precision)
            if choice.sparsity.kind != "dense":
                raise UnsupportedFormatError(f"{name} is planned {choice}: llama.cpp has no "
                                             "sparse kernels; re-plan with --runtime llama.cpp")
        out = Path(out_dir)
        layers = {n: str(c) for n, c in sorted(prep.choices.items())}
        if out.suffix.lower() != ".gguf":
            with atomic_dir(out, is_ours=is_export) as tmp:
                audit = write_gguf(prep, tmp / GGUF_FILE)
                write_sidecars(tmp, prep.plan, self.name, prep.runtime, layers,
                               {"gguf_tensors": audit}, artifact=out / GGUF_FILE)
            return out / GGUF_FILE
        return _write_file(prep, out, self.name, layers)


def sidecar_deploy(gguf_file: Path, name: str) -> Path:
    """Where a single-file GGUF export's deploy sidecar ``name`` goes (FILE.name)."""
    stem = gguf_file.with_suffix("")
    return stem.with_name(f"{stem.name}.{name}")


def sidecar_paths(gguf_file: Path) -> tuple[Path, Path]:
    """(plan, audit) sidecar paths of a single-file GGUF export."""
    stem = gguf_file.with_suffix("")
    return (stem.with_name(f"{stem.name}.{PLAN_FILE}"), stem.with_name(f"{stem.name}.{AUDIT_FILE}"))


def _write_file(prep: Prepared, out: Path, fmt: str, layers: dict[str, str]) -> Path:
    plan_path, audit_path = sidecar_paths(out)
    if out.exists() and (out.is_dir() or not audit_path.is_file()):
        raise UserInputError(f"'{out}' exists and is not an autoplan export: choose a new --out "
                             "or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as name:
        tmp = Path(name)
        try:
            audit = write_gguf(prep, tmp / GGUF_FILE)
            write_sidecars(tmp, prep.plan, fmt, prep.runtime, layers, {"gguf_tensors": audit},
                           artifact=out)
            deploy = {tmp / name: sidecar_deploy(out, name) for name in (DEPLOY_JSON, DEPLOY_SH)
                      if (tmp / name).is_file()}
            # the GGUF goes last: a sidecar without its file is never mistaken for an export
            replace_files({tmp / PLAN_FILE: plan_path, tmp / AUDIT_FILE: audit_path, **deploy,
                           tmp / GGUF_FILE: out})
        except OSError as err:
            raise AutoplanError(f"cannot write the export to '{out}': {err}") from err
    return out


def read_audit(gguf_file: Path) -> dict[str, Any]:
    """The export audit of a GGUF written by this exporter (folder or single-file form)."""
    beside = gguf_file.parent / AUDIT_FILE
    path = beside if beside.is_file() else sidecar_paths(gguf_file)[1]
    return json.loads(path.read_text())


__all__ = ["GGUF_FILE", "GgufExporter", "ggml_type_name", "llama_permutation", "mxfp4_blocks",
           "read_audit", "row_order", "sidecar_paths", "source_gguf", "write_gguf"]
