"""Convert a GGUF file into an HF safetensors folder once, verified, written atomically.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from autoplan.errors import AutoplanError, UserInputError
from autoplan.atomic import atomic_new_dir
from autoplan.models._cache import is_model_folder
from autoplan.modelspec import ModelSpec
from autoplan.models import gguf_gptoss
from autoplan.models.gguf_moe import (check_gguf_experts, expert_value, moe_config, moe_state,
                                      stacked_stem)
from autoplan.models.gguf_read import TRANSFORMERS_GGUF_ERRORS, open_gguf

# GGUF block types whose values lie on a 4-bit grid per 32-weight block.
_FOUR_BIT = {"Q4_0", "Q4_1"}
_BLOCK = 32


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' own tqdm bars (ours or none are shown); restore the state after."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _tensor_progress(bar: Progress) -> Iterator[None]:
    """Route the GGUF reader's per-tensor tqdm loop into a rich sub-task.

    transformers' GGUF reader iterates with a module-level ``tqdm``; swapping that name for
    the duration of the call is the only hook it offers. If a transformers version renames
    it, the conversion still works, just without the per-tensor bar.
    """
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)

    def rich_iter(items, desc: str = "", **_: object):  # noqa: ANN001, ANN202 - tqdm's signature
        items = list(items)
        task = bar.add_task("  tensors", total=len(items))
        for item in items:
            yield item
            bar.advance(task)
        bar.remove_task(task)

    if original is not None:
        gguf_utils.tqdm = rich_iter
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original


def _gguf_tensors(path: Path) -> dict[str, tuple[str, torch.Tensor]]:
    """GGUF name -> (type name, dequantized float32 tensor in HF [out, in] layout)."""
    from gguf import dequantize

    reader = open_gguf(path)  # its own: a cached reader would keep every page mapped
    return {t.name: (t.tensor_type.name, torch.from_numpy(dequantize(t.data, t.tensor_type).copy()))
            for t in reader.tensors}


# HF model_type -> gguf-py architecture name where the two are not the same word up to "_"
# versus "-" or no separator (qwen2_moe = qwen2moe, gpt_oss = gpt-oss, gpt_neox = gptneox);
# transformers' own GGUF loader uses the same spellings (get_gguf_hf_weights_map), and
# llama.cpp writes Mistral models as "llama".
_GGUF_ALIASES = {"cohere": "command-r", "gemma3_text": "gemma3", "gemma4_text": "gemma4",
                 "umt5": "t5", "mistral": "llama", "mixtral": "llama"}
# llama.cpp's convert_hf_to_gguf.py stores these architectures' RMSNorm weights as 1 + w
# (the multiplier the kernel applies); transformers subtracts the 1 again on the way in.
_NORMS_PLUS_ONE = {"gemma", "gemma2", "gemma3", "gemma3n", "gemma4", "gemma-embedding",
                   "nemotron"}


def gguf_arch(model_type: str, gguf_architecture: str | None = None):  # noqa: ANN201 - a gguf.MODEL_ARCH member, or None
    """gguf-py's MODEL_ARCH for an HF ``model_type`` (its tensor name map), or None.

    ``gguf_architecture`` (a file's ``general.architecture``) is used when gguf-py knows it;
    otherwise the HF name is spelled the way gguf-py spells it.
    """
    from gguf import MODEL_ARCH_NAMES

    by_name = {v: k for k, v in MODEL_ARCH_NAMES.items()}
    if gguf_architecture in by_name:
        return by_name[gguf_architecture]
    name = _GGUF_ALIASES.get(model_type, model_type)
    for spelling in (name, name.replace("_", "-"), name.replace("_", "")):
        if spelling in by_name:
            return by_name[spelling]
    return None


def check_name_map(model_type: str, gguf_architecture: str | None = None) -> None:
    """Refuse, naming the architecture, a model whose GGUF tensor names autoplan cannot map.

    Called on the config alone, before any tensor is dequantized: without a name map the
    verification would fail only after minutes of conversion and gigabytes of tensors.
    """
    if gguf_arch(model_type, gguf_architecture) is None:
        named = f"'{gguf_architecture}' (HF model type '{model_type}')" \
            if gguf_architecture and gguf_architecture != model_type else f"'{model_type}'"
        raise UserInputError(
            f"GGUF architecture {named} has no tensor name map in gguf-py, so autoplan "
            "cannot verify its conversion; convert the model to an HF safetensors folder "
            "and pass that folder instead")


def _stored_value(arch: str, gguf_name: str, values: torch.Tensor) -> torch.Tensor:
    """What the HF tensor must hold for a GGUF tensor's dequantized values (``arch``: the
    gguf-py architecture name)."""
    if arch in _NORMS_PLUS_ONE and gguf_name.endswith("norm.weight"):
        return values - 1
    return values


# llama.cpp sizes Gemma 2/3's attention scale from the model size, not from a key: the 27B
# models (46 / 62 blocks) use hidden / heads, the others head_dim (llama-model.cpp,
# LLM_TYPE_27B); transformers' GGUF reader leaves query_pre_attn_scalar at its default 256.
_GEMMA_27B_BLOCKS = {"gemma2": 46, "gemma3": 62}


def apply_dropped_keys(config, path: Path) -> None:  # noqa: ANN001 - an HF config
    """Set the config values a GGUF holds but transformers' GGUF reader does not map.

    Attention and final logit soft-caps (Gemma 2), the sliding window (Phi-3), linear RoPE
    scaling (Gemma 3's global layers in the 4B and larger models) and Gemma's attention
    scale; without them the converted model would not be the one llama.cpp runs.

    Raises:
        UserInputError: the GGUF sets a RoPE scaling this cannot carry over.
    """
    from autoplan.models.gguf_read import gguf_reader

    fields = gguf_reader(path).fields
    arch = gguf_architecture(path) or ""

    def value(key: str):  # noqa: ANN202 - a GGUF scalar
        field = fields.get(f"{arch}.{key}")
        return None if field is None else field.contents()

    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if value(key) is not None and hasattr(config, key):
            setattr(config, key, float(value(key)))
    window = value("attention.sliding_window")  # read for Gemma, dropped for Phi-3
    if window and hasattr(config, "sliding_window"):
        config.sliding_window = int(window)
    kind = value("rope.scaling.type")
    if kind == "linear" and value("rope.scaling.factor"):
        factor = float(value("rope.scaling.factor"))
        rope = dict(config.rope_parameters)
        if "full_attention" in rope:  # per layer type: llama.cpp scales the global layers only
            rope["full_attention"] = {**rope["full_attention"], "rope_type": "linear",
                                      "factor": factor}
        else:
            rope.update(rope_type="linear", factor=factor)
        config.rope_parameters = rope
    elif kind not in (None, "none", "linear"):
        raise UserInputError(f"GGUF '{path.name}' sets '{kind}' RoPE scaling, which "
                             "transformers' GGUF reader drops; convert the model from its HF "
                             "folder instead")
    if arch in _GEMMA_27B_BLOCKS:
        config.query_pre_attn_scalar = (
            config.hidden_size // config.num_attention_heads
            if _GEMMA_27B_BLOCKS[arch] == config.num_hidden_layers else config.head_dim)


def gguf_architecture(path: Path) -> str | None:
    """``general.architecture`` of a GGUF file (header only, no tensor is read)."""
    try:
        from autoplan.models.gguf_read import gguf_reader

        field = gguf_reader(path).fields.get("general.architecture")
        return None if field is None else bytes(field.parts[field.data[0]]).decode()
    except Exception:  # noqa: BLE001 - only used to word the refusal better
        return None


def hf_to_gguf_names(model: torch.nn.Module, n_layers: int) -> dict[str, str]:
    """HF parameter name -> GGUF tensor name, for every parameter llama.cpp names (``model``
    an in-memory module or a StreamedModel, whose meta-device skeleton holds the names)."""
    from gguf import get_tensor_name_map

    check_name_map(model.config.model_type)
    name_map = get_tensor_name_map(gguf_arch(model.config.model_type), n_layers)
    module = model if isinstance(model, torch.nn.Module) else model.model
    out = {}
    for hf_name in module.state_dict():
        stem, _, suffix = hf_name.rpartition(".")
        gguf_stem = name_map.get_name(stacked_stem(stem)[0])  # an expert: its stacked tensor
        if gguf_stem is not None:
            out[hf_name] = f"{gguf_stem}.{suffix}"
    return out


def _on_4bit_grid(w: torch.Tensor, max_blocks: int = 4096) -> bool:
    """At most 16 distinct values in each checked 32-weight block along the input dim.

    Checks an evenly strided sample of ``max_blocks`` blocks: sorting every block of a
    large model costs a minute on two cores, and a wrong dequantization breaks all blocks.
    """
    if w.ndim != 2 or w.shape[1] % _BLOCK:
        return False
    blocks = w.detach().reshape(-1, _BLOCK)
    blocks = blocks[:: max(1, blocks.shape[0] // max_blocks)].sort(dim=1).values
    distinct = (blocks[:, 1:] != blocks[:, :-1]).sum(dim=1) + 1
    return bool((distinct <= 16).all())


def _same_rows(got: torch.Tensor, expect: torch.Tensor) -> bool:
    """Bit-equal up to a permutation of rows (llama.cpp permutes q/k rows per head)."""
    got, expect = got.detach().float(), expect.float()
    if got.shape != expect.shape:
        return False
    if torch.equal(got, expect):
        return True
    if got.ndim != 2:
        return False
    # Compare the multisets of rows: unique rows sorted lexicographically, with counts.
    rows_g, count_g = torch.unique(got, dim=0, return_counts=True)
    rows_e, count_e = torch.unique(expect, dim=0, return_counts=True)
    return torch.equal(rows_g, rows_e) and torch.equal(count_g, count_e)


def verify_against_gguf(model: torch.nn.Module, gguf_path: Path) -> dict[str, int]:
    """Check the model's tensors against an independent dequantization of the GGUF file.

    Returns:
        Counts: ``tensors`` compared and ``four_bit`` tensors found on a 4-bit grid.

    Raises:
        AutoplanError: a tensor is missing or differs.
    """
    from gguf import MODEL_ARCH_NAMES

    ref = _gguf_tensors(gguf_path)
    state = model.state_dict()
    arch = MODEL_ARCH_NAMES[gguf_arch(model.config.model_type)]
    mapping = hf_to_gguf_names(model, model.config.num_hidden_layers)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    unmapped = set(ref) - set(mapping.values())
    if unmapped:
        raise AutoplanError(f"GGUF tensors not loaded into the model: {sorted(unmapped)[:3]}")
    four_bit = 0
    for hf_name, gguf_name in mapping.items():
        if hf_name in tied or gguf_name not in ref:
            continue
        kind, expect = ref[gguf_name]
        expect = expert_value(expect, hf_name)  # a routed expert: its row of the stack
        if not _same_rows(state[hf_name], _stored_value(arch, gguf_name, expect)):
            raise AutoplanError(f"converted tensor {hf_name} differs from GGUF {gguf_name}")
        if kind in _FOUR_BIT:
            if not _on_4bit_grid(state[hf_name]):
                raise AutoplanError(f"{hf_name} is {kind} but not on a 4-bit grid")
            four_bit += 1
    return {"tensors": len(ref), "four_bit": four_bit}


def _process_start() -> float:
    """When this process started (psutil if present, else when this module was imported)."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - psutil is optional
        return _IMPORTED


_IMPORTED = time.time()


def _lock_dir(path: Path, *, wait: bool) -> int | None:
    """An open fd holding an exclusive flock on folder ``path``; None if another holds it.

    The lock lives as long as the fd (and dies with the process, even on kill -9), which is
    what tells a live conversion's temp folder from one a killed run left behind.
    """
    try:
        import fcntl
    except ImportError:  # no flock (Windows): nothing is ever judged stale
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError:
        os.close(fd)
        return None
    return fd


def remove_stale_temps(dest: Path) -> list[Path]:
    """Delete the temp folders of conversions of ``dest`` that were killed.

    A temp folder (``.NAME.*.tmp`` beside ``dest``, made by ``atomic_new_dir``) is stale when it
    is older than this process and no live process holds its lock; a conversion holds the
    lock on its own temp folder from creation until after the rename. Returns what was
    removed.
    """
    removed = []
    started = _process_start()
    for tmp in dest.parent.glob(f".{dest.name}.*.tmp"):
        try:
            if not tmp.is_dir() or tmp.is_symlink() or tmp.stat().st_mtime >= started:
                continue
        except OSError:
            continue
        fd = _lock_dir(tmp, wait=False)
        if fd is None:
            continue  # a live conversion (or no flock here): leave it
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
        finally:
            os.close(fd)
    return removed


def convert_gguf(gguf_path: str | Path, dest: str | Path, *, console: Console | None = None) -> Path:
    """Convert ``gguf_path`` into the HF folder ``dest`` (config, safetensors, tokenizer).

    Shows a rich progress bar on stderr. ``dest`` appears only once complete and verified.

    Raises:
        UserInputError: the file is not a readable GGUF of a supported architecture.
        AutoplanError: verification failed.
    """
    from transformers import AutoConfig

    src, dest = Path(gguf_path), Path(dest)
    steps = ["read config", "read tokenizer", "dequantize tensors", "verify against GGUF",
             "write safetensors", "read back"]
    console = console or Console(stderr=True)
    t0 = time.perf_counter()
    with quiet_transformers(), Progress(
        TextColumn("[bold]converting[/] {task.description}"), BarColumn(),
        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
        console=console, transient=False,
    ) as bar:
        task = bar.add_task(steps[0], total=len(steps))

        def step(i: int) -> None:
            bar.update(task, completed=i, description=steps[i] if i < len(steps) else "done")

        check_gguf_experts(src)  # stacked experts as many as the metadata says
        gptoss = gguf_architecture(src) == gguf_gptoss.ARCH
        try:
            config = gguf_gptoss.gptoss_config(src) if gptoss else \
                AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
        except TRANSFORMERS_GGUF_ERRORS as exc:
            raise UserInputError(f"cannot read GGUF '{src}': {exc}".splitlines()[0]) from None
        check_name_map(config.model_type, gguf_architecture(src))  # before any tensor
        config = moe_config(config, src)  # a llama GGUF with experts is a Mixtral
        ModelSpec.from_config(config.to_dict())  # a model autoplan cannot plan: refused now
        if not gptoss:  # gptoss_config reads those keys itself
            apply_dropped_keys(config, src)
        remove_stale_temps(dest)
        lock = None
        try:
            with atomic_new_dir(dest, complete=is_model_folder) as tmp:
                lock = _lock_dir(tmp, wait=True)  # held until after the rename
                _convert_into(tmp, src, config, bar, step, t0)
        finally:
            if lock is not None:
                os.close(lock)
    return dest


def _convert_into(tmp: Path, src: Path, config, bar: Progress,  # noqa: ANN001 - an HF config
                  step: Callable[[int], None], t0: float) -> None:
    """Read the tokenizer and tensors of ``src``, verify them, and write them into ``tmp``."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    step(1)
    if config.model_type == "gpt_oss":  # its MXFP4 experts kept as the checkpoint's bytes
        step(2)
        counts = gguf_gptoss.convert_gptoss_into(tmp, src, config)
        step(5)
        _write_source(tmp, src, counts["tensors"], 0, t0, mxfp4_tensors=counts["mxfp4_tensors"])
        step(6)
        return
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    step(2)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    spec = ModelSpec.from_config(config.to_dict())
    if spec.moe is not None:
        _convert_moe(tmp, src, model, spec, tokenizer, step, t0)
        return
    with _tensor_progress(bar):
        tensors = load_gguf_checkpoint(str(src), return_tensors=True,
                                       model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise AutoplanError(f"GGUF tensors do not fit {type(model).__name__}: missing "
                            f"{sorted(set(missing) - tied)[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    del tensors
    step(3)
    counts = verify_against_gguf(model, src)
    step(4)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    step(5)
    saved: dict[str, torch.Tensor] = {}
    for f in sorted(tmp.glob("*.safetensors")):
        saved.update(load_file(str(f)))
    for name, value in model.state_dict().items():
        if name in saved and not torch.equal(saved[name], value):
            raise AutoplanError(f"{name} did not survive the safetensors round trip")
    _write_source(tmp, src, counts["tensors"], counts["four_bit"], t0)
    step(6)


def _write_source(tmp: Path, src: Path, tensors: int, four_bit: int, t0: float,
                  **extra: int) -> None:
    """autoplan_source.json: what the folder was converted from, and how long it took."""
    (tmp / "autoplan_source.json").write_text(json.dumps({
        "gguf": src.name, "gguf_tensors": tensors, "four_bit_tensors": four_bit,
        "convert_seconds": round(time.perf_counter() - t0, 2), "dtype": "float32", **extra,
    }, indent=1, sort_keys=True))


def _convert_moe(tmp: Path, src: Path, model, spec: ModelSpec, tokenizer,  # noqa: ANN001
                 step: Callable[[int], None], t0: float) -> None:
    """An MoE GGUF: every expert a row of its stacked tensor (models/gguf_moe.py), verified
    against the GGUF, written with the checkpoint's own tensor names."""
    from gguf import MODEL_ARCH_NAMES
    from safetensors.torch import load_file, save_file

    from autoplan.models.moe import checkpoint_name, unfuse_experts

    unfuse_experts(model, spec)
    names = hf_to_gguf_names(model, spec.n_layers)
    arch = MODEL_ARCH_NAMES[gguf_arch(spec.model_type)]
    state = moe_state(model, names, _gguf_tensors(src), arch)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if set(missing) - {"lm_head.weight"} or unexpected:
        raise AutoplanError(f"GGUF tensors do not fit the MoE model: missing {missing[:3]}, "
                            f"unexpected {unexpected[:3]}")
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.get_input_embeddings().weight
    step(3)
    counts = verify_against_gguf(model, src)
    step(4)
    stored = {}
    for name, value in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        module, _, kind = name.rpartition(".")
        stored[f"{checkpoint_name(module, spec.model_type)}.{kind}"] = value.contiguous()
    save_file(stored, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    step(5)
    back = load_file(str(tmp / "model.safetensors"))
    if any(not torch.equal(back[k], v) for k, v in stored.items()):
        raise AutoplanError("an MoE tensor did not survive the safetensors round trip")
    _write_source(tmp, src, counts["tensors"], counts["four_bit"], t0)
    step(6)


__all__ = ["apply_dropped_keys", "check_name_map", "convert_gguf", "gguf_arch", "gguf_architecture",
           "hf_to_gguf_names", "quiet_transformers", "verify_against_gguf"]
