"""A number format registered from outside the core (examples/formats/int8_g128.py, the
compressed-tensors W8A16 preset): its numerics are the library's bit for bit, compressed-tensors
names it by that preset, and the CLI knows it once its package lists it in the
``autoplan.formats`` entry-point group."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autoplan.errors import UnknownNameError
from autoplan.formats import Choice, Precision, format_spec, registered_formats
from autoplan.formats import registry as formats_registry
from autoplan.quant import quantize_weight

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "formats" / "int8_g128.py"


@pytest.fixture()
def plugin():  # noqa: ANN201 - the imported module
    """The plugin imported here, and undone afterwards (other tests see the core formats)."""
    defined = dict(Precision._defined)
    entries = dict(formats_registry._FORMATS.entries)
    spec = importlib.util.spec_from_file_location("int8_g128_plugin", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    for name in set(Precision._defined) - set(defined):
        delattr(Precision, Precision._defined[name].name)
    Precision._defined.clear()
    Precision._defined.update(defined)
    formats_registry._FORMATS.entries.clear()
    formats_registry._FORMATS.entries.update(entries)


def test_the_core_does_not_know_it_until_it_is_registered() -> None:
    with pytest.raises(UnknownNameError, match="int8_g128"):
        Choice.parse("dense+int8_g128")


def test_it_is_one_more_format_everywhere_the_registry_is_asked(plugin) -> None:  # noqa: ANN001
    prec = Precision.parse("int8_g128")
    assert prec is plugin.INT8_G128 is Precision.INT8_G128 and prec in list(Precision)
    assert format_spec("int8_g128") is plugin.SPEC and plugin.SPEC in registered_formats()
    assert str(Choice.parse("dense+int8_g128")) == "dense+int8_g128"
    assert plugin.SPEC.info.value_bits + plugin.SPEC.info.scale_bits == 8.125
    with pytest.raises(Exception, match="registered twice|defined twice"):
        Precision.define("int8_g128")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_numerics_are_compressed_tensors_w8a16_bit_for_bit(plugin, dtype) -> None:  # noqa: ANN001
    ct = pytest.importorskip("compressed_tensors.quantization")
    from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = ct.QuantizationArgs(num_bits=8, type="int", strategy="group", symmetric=True,
                               group_size=128)
    w = (torch.randn(16, 512, generator=torch.Generator().manual_seed(3)) * 0.02).to(dtype)
    groups = w.reshape(16, -1, 128)
    scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
    q = quantize_weight(w, Precision.parse("int8_g128"))
    assert q.scales["weight_scale"].dtype == dtype
    assert torch.equal(q.scales["weight_scale"], scale)
    if dtype is torch.float32:
        codes = quantize(w, scale, zp, args, dtype=torch.int8)
        assert torch.equal(q.codes.to(torch.int16), codes.to(torch.int16))
        assert torch.equal(q.dequant, dequantize(codes, scale, zp, args))


def test_compressed_tensors_names_it_by_the_preset(plugin) -> None:  # noqa: ANN001
    ct = pytest.importorskip("compressed_tensors.quantization")
    named = plugin.SPEC.exported_as("compressed-tensors")
    weights = ct.preset_name_to_scheme(named.preset, ["Linear"]).weights
    assert (weights.num_bits, weights.strategy, weights.group_size, weights.symmetric) == \
        (8, "group", 128, True)


def test_the_cli_knows_it_through_the_entry_point_group(tmp_path) -> None:
    """A distribution on the path that lists the module under ``autoplan.formats``: the
    CLI's precision check accepts it (what it refuses next is the runtime matrix's answer:
    no engine row names it), and without the distribution it is an unknown precision."""
    dist = tmp_path / "int8_g128_format-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: int8-g128-format\n"
                                   "Version: 0.1\n")
    (dist / "entry_points.txt").write_text("[autoplan.formats]\nint8_g128 = int8_g128\n")

    def estimate(path: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), path])}
        return subprocess.run(
            [sys.executable, "-m", "autoplan.cli", "estimate", "--model", "smollm2-135m",
             "--target", "h100", "--precision", "int8_g128"],
            capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)

    with_plugin = estimate(os.pathsep.join([str(tmp_path), str(PLUGIN.parent)]))
    assert "unknown precision" not in with_plugin.stderr, with_plugin.stderr
    assert "int8_g128" in with_plugin.stderr + with_plugin.stdout
    without = estimate(str(PLUGIN.parent))
    assert without.returncode == 2 and "unknown precision 'int8_g128'" in without.stderr
