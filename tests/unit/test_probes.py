"""Probes never raise, say why a backend is missing, and match devices to the catalog."""

from __future__ import annotations

import json
import types

import pytest
from click.testing import CliRunner

from autoplan.backends.amd import probe as amd_probe
from autoplan.backends.registry import backend_names, get_backend
from autoplan.backends.cpu import local_target as lt
from autoplan.cli import cli
from autoplan.targets import get_target


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("autoplan-cache")


@pytest.fixture
def cached_env(cache_dir, monkeypatch):
    monkeypatch.setenv("AUTOPLAN_CACHE", str(cache_dir))
    return cache_dir


@pytest.fixture(scope="module")
def measured(cache_dir):
    # One real measurement for the module (a few seconds); later tests hit the cache.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOPLAN_CACHE", str(cache_dir))
        return lt.local_target(refresh=True)


def test_backends_are_registered_and_probes_never_raise(measured, cached_env):
    assert {"nvidia", "amd", "cpu"} <= set(backend_names())
    for name in backend_names():
        result = get_backend(name).probe()
        assert result.backend == name
        assert result.available or result.reason.startswith("unavailable: ")


def test_amdsmi_absence_reads_unavailable(monkeypatch):
    def broken(name):
        print("Unable to find libamd_smi.so library try installing amd-smi-lib")
        raise KeyError("libamd_smi.so")

    monkeypatch.setattr(amd_probe.importlib, "import_module", broken)
    result = amd_probe.probe_amd()
    assert not result.available
    assert result.reason.startswith("unavailable: ") and "libamd_smi" in result.reason


def test_fake_amdsmi_matches_mi300x(monkeypatch):
    fake = types.SimpleNamespace(
        amdsmi_init=lambda: None,
        amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: ["h0"],
        amdsmi_get_gpu_asic_info=lambda h: {"market_name": "AMD Instinct MI300X", "target_graphics_version": "gfx942"},
        AmdSmiMemoryType=types.SimpleNamespace(VRAM=0),
        amdsmi_get_gpu_memory_total=lambda h, kind: 192 * 10**9,
        amdsmi_get_power_cap_info=lambda h: {"power_cap": 750 * 10**6},
    )
    monkeypatch.setitem(__import__("sys").modules, "amdsmi", fake)
    result = amd_probe.probe_amd()
    assert result.available
    assert result.devices[0]["target"] == "mi300x" and result.devices[0]["power_limit_w"] == 750


def _fake_pynvml(name: str, fail_init: bool = False) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    def init():
        if fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: 2
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: name.encode()
    nvml.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=85_520_809_984)
    nvml.nvmlDeviceGetPowerManagementLimit = lambda h: 700_000
    nvml.nvmlSystemGetDriverVersion = lambda: b"560.35"
    return nvml


def test_fake_pynvml_matches_h100_sxm(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", _fake_pynvml("NVIDIA H100 80GB HBM3"))
    result = get_backend("nvidia").probe()
    assert result.available and len(result.devices) == 2
    device = result.devices[0]
    assert device["target"] == "h100-sxm"
    assert device["compute_capability"] == "9.0" and device["power_limit_w"] == 700
    assert "h100-sxm" in result.reason


def test_unknown_gpu_and_missing_driver(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", _fake_pynvml("NVIDIA H100 NVL"))
    result = get_backend("nvidia").probe()
    assert result.available and result.devices[0]["target"] is None
    assert "no catalog entry" in result.reason
    monkeypatch.setitem(__import__("sys").modules, "pynvml", _fake_pynvml("x", fail_init=True))
    result = get_backend("nvidia").probe()
    assert not result.available and result.reason.startswith("unavailable: ")


def test_local_target_has_measured_figures(measured):
    assert measured.name == "local" and measured.measured and measured.kind == "cpu"
    assert measured.bandwidth_gbps.source == "measured" and measured.bandwidth > 0
    assert measured.peak_tflops["fp32"].source == "measured" and measured.peak("fp32") > 0
    assert measured.memory_gb.source == "measured" and measured.memory_bytes > 0


def test_local_target_is_cached_and_refresh_measures_again(measured, cached_env, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("should have used the cache")

    monkeypatch.setattr(lt, "measure_bandwidth", boom)
    assert get_target("local") == measured  # from the cache, no measurement
    monkeypatch.setattr(lt, "measure_bandwidth", lambda: (12.5, "fake"))
    monkeypatch.setattr(lt, "measure_matmul", lambda kind: (0.5, 64))
    fresh = lt.local_target(refresh=True)
    assert fresh.bandwidth_gbps.value == 12.5
    assert lt.local_target().bandwidth_gbps.value == 12.5  # the refresh was cached


def test_corrupt_cache_is_measured_again(cached_env, monkeypatch):
    from autoplan.backends.cpu.probe import cpu_info

    lt.cache_path(cpu_info()).write_text("{not json")
    monkeypatch.setattr(lt, "measure_bandwidth", lambda: (7.0, "fake"))
    monkeypatch.setattr(lt, "measure_matmul", lambda kind: (0.25, 64))
    assert lt.local_target().bandwidth_gbps.value == 7.0


def test_cli_probe_json(cached_env, measured):
    result = CliRunner().invoke(cli, ["probe", "--json"])
    assert result.exit_code == 0, result.output
    by_name = {r["backend"]: r for r in json.loads(result.output)}
    assert by_name["cpu"]["available"] and by_name["cpu"]["devices"][0]["target"] == "local"
    assert set(by_name) >= {"nvidia", "amd", "cpu"}


def test_cli_targets_json_and_bad_vendor():
    runner = CliRunner()
    result = runner.invoke(cli, ["targets", "--json", "--vendor", "amd"])
    assert result.exit_code == 0, result.output
    names = {t["name"] for t in json.loads(result.output)}
    assert {"mi300x", "mi325x", "mi355x", "epyc-9654", "epyc-turin"} == names
    result = runner.invoke(cli, ["targets", "--vendor", "ibm"])
    assert result.exit_code == 2
    table = runner.invoke(cli, ["targets"])
    assert table.exit_code == 0 and "autoplan targets" in table.output


def test_probe_under_load_says_so(monkeypatch):
    """Other jobs on the cores lower every measured figure: the target's description says
    when it was measured under load and how to re-measure."""
    from autoplan.backends.cpu.probe import cpu_info

    info = cpu_info()
    monkeypatch.setattr(lt, "measure_bandwidth", lambda: (10.0, "stub"))
    monkeypatch.setattr(lt, "_peaks", lambda _info: {"fp32": lt._measured(0.1, "stub")})
    monkeypatch.setattr(lt.os, "getloadavg", lambda: (4.0 * info.cores, 0.0, 0.0))
    assert "probe --refresh" in lt.measure_local_target(info).description
    monkeypatch.setattr(lt.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert "probe --refresh" not in lt.measure_local_target(info).description


def test_the_machine_tells_cpu_generations_apart_where_the_name_does_not(cached_env,
                                                                          monkeypatch):
    """A VM may name every EPYC generation "AMD EPYC": the machine a plan records carries
    the CPU's family, model and stepping, and a cached target of another CPU is measured
    again rather than read as this one."""
    import dataclasses

    from autoplan.backends.cpu import probe

    fields, _ = probe._cpuinfo_fields("model name\t: AMD EPYC\ncpu family\t: 25\nmodel\t\t: 17\n"
                                      "stepping\t: 1\nflags\t\t: avx2\n")
    assert probe._cpuid(fields) == "family 25 model 17 stepping 1"
    arm, _ = probe._cpuinfo_fields("CPU implementer\t: 0x41\nCPU part\t: 0xd40\n")
    assert probe._cpuid(arm) == "implementer 0x41 part 0xd40"
    assert probe._cpuid({}) == ""
    info = probe.CpuInfo(model="AMD EPYC", arch="x86_64", cores=2, threads=2,
                         flags=frozenset(), cpuid="family 25 model 17 stepping 1")
    assert lt.machine_of(info) == "AMD EPYC (family 25 model 17 stepping 1), 2 cores, 2 threads"
    other = dataclasses.replace(info, cpuid="family 23 model 49 stepping 0")
    assert lt.machine_of(other) != lt.machine_of(info)

    monkeypatch.setattr(lt, "measure_bandwidth", lambda: (7.0, "fake"))
    monkeypatch.setattr(lt, "measure_matmul", lambda kind: (0.25, 64))
    monkeypatch.setattr(lt, "cpu_info", lambda: info)
    assert lt.local_target().machine == lt.machine_of(info)
    monkeypatch.setattr(lt, "cpu_info", lambda: other)  # same cache file: name and cores
    monkeypatch.setattr(lt, "measure_bandwidth", lambda: (9.0, "fake"))
    again = lt.local_target()
    assert again.machine == lt.machine_of(other) and again.bandwidth_gbps.value == 9.0
