"""The shared backend conformance suite (Optuna's SamplerTestCase pattern): one base class of
tests, run over every registered backend and over a fake one written here, so a new backend
is checked by declaring it, and the interface cannot quietly mean less than it says."""

from __future__ import annotations


import pytest

from autoplan.backends.base import Backend, KernelEntry, ProbeResult, named_by_format
from autoplan.backends.registry import backend_names, get_backend
from autoplan.errors import UnsupportedFormatError
from autoplan.export import exporter_names, get_exporter
from autoplan.formats import Choice, registered_formats
from autoplan.runtimes import get_runtime, runtime_names
from autoplan.targets import load_catalog, target_names

CHOICES = [Choice.parse(t) for t in ("fp32", "bf16", "fp8_e4m3", "2:4+fp8_e4m3", "int8",
                                     "int8a8_g128", "int4_g32", "uint4a8_g32", "nvfp4", "q4_0",
                                     "channel@25+int4a8_g64", "block32@50+bf16")]


class FakeBackend(Backend):
    """A backend with no hardware of its own: it drives CPU targets and times on torch."""

    name = "fake"
    platforms = ("cpu",)
    exporters = ("onnx",)
    kernels = (KernelEntry("fake.linear", (named_by_format("torch.linear"),)),)

    def probe(self) -> ProbeResult:
        return ProbeResult("fake", True, "always here", ({"name": "fake device"},))


class BackendConformance:
    """What every backend promises."""

    @pytest.fixture()
    def backend(self) -> Backend:
        raise NotImplementedError

    def test_probe_never_raises_and_says_why(self, backend: Backend) -> None:
        result = backend.probe()
        assert result.backend == backend.name
        assert result.available or result.reason, "an unavailable backend must say why"
        assert set(result.to_json()) == {"backend", "available", "reason", "devices", "details"}

    def test_drives_exactly_its_platforms(self, backend: Backend) -> None:
        for target in load_catalog().values():
            assert backend.drives(target) == (target.platform in backend.platforms)

    def test_exporters_are_registered_and_load_on_its_platforms(self, backend: Backend) -> None:
        assert backend.exporters and backend.default_format == backend.exporters[0]
        for fmt in backend.exporters:
            assert fmt in exporter_names()
            platforms = {p for rt in get_exporter(fmt).runtimes
                         for p in get_runtime(rt).platforms}
            assert platforms & set(backend.platforms), (fmt, platforms)

    def test_kernels_are_ordered_and_the_first_that_fits_runs(self, backend: Backend) -> None:
        names = [k.name for k in backend.kernels]
        assert len(names) == len(set(names)), "kernel names are unique"
        for spec in registered_formats():
            for token in ("dense", "2:4", "block"):
                text = {"dense": "", "2:4": "2:4+", "block": "block32@50+"}[token]
                choice = Choice.parse(f"{text}{spec.name}")
                reasons = [k.why_not(choice) for k in backend.kernels]
                try:
                    picked = backend.select_kernel(choice)
                except UnsupportedFormatError as err:
                    assert all(reasons) and "\n" not in str(err)
                    assert all(k.name in str(err) for k in backend.kernels)
                    continue
                i = names.index(picked.name)
                assert reasons[i] == "" and all(reasons[:i]), (choice, picked.name)

    def test_measured_targets_are_in_the_catalog(self, backend: Backend) -> None:
        for name in backend.measured_targets():
            assert name in target_names()

    def test_kernel_timers_time_runtimes_of_its_platforms(self, backend: Backend) -> None:
        import autoplan.engines  # noqa: F401 - the llama.cpp engine registers its timer

        for runtime in runtime_names():
            timer = backend.kernel_timer(runtime)
            if timer is not None:
                assert timer.label and callable(timer.time)
                assert set(get_runtime(runtime).platforms) & set(backend.platforms), runtime


class TestRegisteredBackends(BackendConformance):
    @pytest.fixture(params=backend_names())
    def backend(self, request) -> Backend:
        return get_backend(request.param)


class TestFakeBackend(BackendConformance):
    @pytest.fixture()
    def backend(self) -> Backend:
        return FakeBackend()


@pytest.mark.parametrize("name", ["cpu", "nvidia", "amd"])
def test_each_real_backend_answers_with_its_own_members(name: str) -> None:
    """The suite above checks each real backend's own answers, not the base class's: each
    defines its probe, its kernels and its exporters itself."""
    own = vars(type(get_backend(name)))
    assert {"probe", "kernels", "exporters", "platforms"} <= set(own), sorted(own)


def test_the_cpu_backend_times_onnx_runtime_and_llama_cpp_kernels() -> None:
    import autoplan.engines  # noqa: F401

    cpu = get_backend("cpu")
    assert {rt for rt in runtime_names() if cpu.kernel_timer(rt)} == {"onnxruntime", "llama.cpp"}
    assert all(get_backend(n).kernel_timer(rt) is None for n in ("nvidia", "amd")
               for rt in runtime_names())


def test_every_platform_has_exactly_one_backend() -> None:
    for platform in ("cpu", "nvidia-gpu", "amd-gpu"):
        assert sum(platform in get_backend(n).platforms for n in backend_names()) == 1


def test_the_cpu_backend_yields_the_local_target_measured() -> None:
    from autoplan.backends.registry import resolve_target

    assert "local" in get_backend("cpu").measured_targets()
    local = resolve_target("local")
    assert local.measured and local.name == "local"


@pytest.mark.parametrize("name", ["nvidia", "amd"])
def test_gpu_kernels_are_launchable_by_the_microbenchmark(name) -> None:
    """Every kernel a GPU backend can select has a packer in backends/microbench.py."""
    from autoplan.backends import microbench as MB

    assert {k.name for k in get_backend(name).kernels} <= set(MB._KERNELS)
