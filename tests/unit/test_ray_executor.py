"""Profile scoring and candidate verification sharded over a local Ray cluster (2 CPU
workers, loopback only, started inside the test run): the same profile and measurements as
one process, a killed worker's task rerun, the cache holding only finished layers when a
task is lost for good, and one-line errors for an address that is not a Ray cluster.

Skipped when Ray is not installed (pip install 'autoplan[ray]').
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from autoplan.compress import CompressionSettings
from autoplan.cost.model import CostModel
from autoplan.errors import AutoplanError, UserInputError
from autoplan.streaming.candidates import MemoryEvaluator
from autoplan.quality.text import load_text_dataset
from autoplan.search import QualityBudget, Verifier, build_space
from autoplan.search.optimize import build_tables
from autoplan.sensitivity import build_profile, cache_path
from autoplan.sensitivity.ray_executor import RayExecutor, cpus_per_task, import_ray
from autoplan.targets import get_target
from tests.unit._tiny import WORKLOAD, one_torch_thread, synthetic_profile, tiny_llama, tiny_spec  # noqa: F401
from tests.unit.tiny_llama import tiny_tokenizer

try:
    ray = import_ray()
except UserInputError:
    pytest.skip("Ray is not installed (pip install 'autoplan[ray]')", allow_module_level=True)

# The helpers below run on the workers, which cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

SETTINGS = CompressionSettings()


class Setup:
    def __init__(self, cache: Path) -> None:
        self.model = tiny_llama()
        self.data = load_text_dataset(None, tokenizer=tiny_tokenizer(), seq_len=64, n_calib=4,
                                      n_eval=2, seed=0)
        self.calib = list(self.data.calib.split(2))
        self.space = build_space(tiny_spec(), get_target("h100-sxm"), "tensorrt-llm")
        self.layers = [la.name for u in self.space.units for la in u.layers]
        self.choices = [c for c in self.space.all_choices if c != self.space.baseline]
        self.serial_dir = cache / "serial"
        self.serial = self.build(self.serial_dir)

    def build(self, cache: Path, executor=None):  # noqa: ANN001, ANN201
        return build_profile(self.model, self.layers, self.choices, self.calib, model_hash="tiny",
                             calib_hash=self.data.content_hash, settings=SETTINGS,
                             cache_dir=cache, seed=0, executor=executor)

    def cache_file(self, cache: Path) -> Path:
        return cache_path(cache, "tiny", self.data.content_hash, SETTINGS)


@pytest.fixture(scope="module")
def s(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return Setup(tmp_path_factory.mktemp("ray-profiles"))


@pytest.fixture(scope="module")
def executor(one_torch_thread):  # noqa: ANN001, ANN201, F811 - threads set before workers copy them
    ex = RayExecutor("auto", num_cpus=2)
    yield ex
    ex.close()


class _Wrapped:
    """An executor that runs `wrap(fn)` instead of `fn` on the inner one (to inject faults)."""

    def __init__(self, inner: RayExecutor, wrap) -> None:  # noqa: ANN001
        self.inner, self.wrap, self.name = inner, wrap, "wrapped"

    def imap_unordered(self, fn, items):  # noqa: ANN001, ANN201
        return self.inner.imap_unordered(self.wrap(fn), items)

    def close(self) -> None:
        return None


def _wait_to_be_killed_once(marker: Path, victim: str, fn, task):  # noqa: ANN001, ANN202
    """On the first try of `victim`'s task: say which process runs it, then wait (the test
    kills that process). Every other try runs normally."""
    if task.layer == victim and not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(120)
    return fn(task)


def _die_on(victim: str, fn, task):  # noqa: ANN001, ANN202
    if task.layer == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    return fn(task)


def test_cluster_has_two_cpu_workers_and_listens_on_loopback_only(executor: RayExecutor) -> None:
    psutil = pytest.importorskip("psutil", reason="psutil lists the cluster's sockets")
    assert (executor.workers, executor.gpus) == (2, 0)
    ray_procs = psutil.Process().children(recursive=True)
    listening = [c.laddr.ip for p in ray_procs for c in p.net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening, "the Ray processes listen somewhere"
    assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for ip in listening), listening


def test_a_task_claims_a_cpu_per_torch_thread_within_the_biggest_node() -> None:
    assert cpus_per_task(1, [2.0]) == 1
    assert cpus_per_task(2, [2.0]) == 2
    assert cpus_per_task(8, [2.0, 4.0]) == 4  # more than any node has would never schedule
    assert cpus_per_task(2, []) == 1


def test_two_thread_tasks_on_two_cpus_run_one_at_a_time_and_equal_serial(
        s: Setup, executor: RayExecutor, tmp_path: Path) -> None:
    """2 workers x 2 spinning intra-op threads on 2 cores made sharding twice as slow as one
    process: a 2-thread task claims both CPUs, and computes the 2-thread serial bits."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        wide = RayExecutor("auto")  # joins the running 2-CPU cluster
        assert (wide.workers, wide.max_in_flight) == (1, 2)
        serial = s.build(tmp_path / "serial")
        prof = s.build(tmp_path / "ray", wide)
    finally:
        torch.set_num_threads(previous)
    assert prof.scores == serial.scores and prof.outliers == serial.outliers


def test_profile_on_ray_equals_the_serial_one_exactly(s: Setup, executor: RayExecutor,
                                                      tmp_path: Path) -> None:
    prof = s.build(tmp_path, executor)
    assert prof.scores == s.serial.scores  # bit for bit, not approximately
    assert prof.outliers == s.serial.outliers
    assert json.loads(s.cache_file(tmp_path).read_text()) == \
        json.loads(s.cache_file(s.serial_dir).read_text())


def test_a_killed_worker_has_its_task_retried(s: Setup, executor: RayExecutor,
                                              tmp_path: Path) -> None:
    marker, victim = tmp_path / "victim.pid", s.layers[3]
    killed: list[int] = []

    def kill_when_started() -> None:
        deadline = time.monotonic() + 300
        while not marker.exists() or not marker.read_text():
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        pid = int(marker.read_text())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_when_started, daemon=True)
    killer.start()
    wrapped = _Wrapped(executor, lambda fn: partial(_wait_to_be_killed_once, marker, victim, fn))
    prof = s.build(tmp_path / "cache", wrapped)
    killer.join(timeout=5)
    assert killed, "the victim's worker process was killed"
    assert prof.scores == s.serial.scores and prof.outliers == s.serial.outliers


def test_a_task_lost_on_every_try_leaves_a_consistent_resumable_cache(
        s: Setup, executor: RayExecutor, tmp_path: Path) -> None:
    no_retry = RayExecutor("auto", max_retries=0)  # joins the running cluster
    victim = s.layers[-1]
    cache = tmp_path / "cache"
    with pytest.raises(AutoplanError, match="lost its worker") as err:
        s.build(cache, _Wrapped(no_retry, lambda fn: partial(_die_on, victim, fn)))
    assert "\n" not in str(err.value)
    # only finished layers are on disk, each complete and equal to the serial profile
    cached = json.loads(s.cache_file(cache).read_text())
    assert victim not in cached["scores"]
    for layer, scores in cached["scores"].items():
        assert scores == s.serial.scores[layer]
        assert cached["outliers"][layer] == s.serial.outliers[layer]
    resumed = s.build(cache, executor)
    assert resumed.scores == s.serial.scores and resumed.outliers == s.serial.outliers


def _serial_and_sharded(verifier, candidates, executor):  # noqa: ANN001, ANN202
    """One fresh verifier's measurements in this process and on Ray, after checking that the
    sharded run reported every candidate and agrees on everything but the quality figures."""
    serial = verifier().measure_many(candidates)
    done: list[int] = []
    sharded = verifier().measure_many(candidates, executor, on_done=done.append)
    assert done == [1, 2, 3]
    for a, b in zip(serial, sharded, strict=True):
        assert (a.picks, a.label, a.passed, a.badness, a.audit) == \
            (b.picks, b.label, b.passed, b.badness, b.audit)
    return serial, sharded


def test_verification_on_ray_equals_the_serial_measurements(s: Setup,
                                                            executor: RayExecutor) -> None:
    tgt = get_target("h100-sxm")
    space = build_space(tiny_spec(), tgt, "vllm")
    tables = build_tables(space, CostModel(tiny_spec(), tgt, WORKLOAD), synthetic_profile(space))
    candidates = [(p, f"uniform {c}") for c in space.all_choices
                  if (p := tables.uniform_picks(c)) and c != space.baseline][:3]
    assert len(candidates) == 3

    def verifier() -> Verifier:
        return Verifier(s.model, space, tables, MemoryEvaluator(s.model, s.data.eval),
                        QualityBudget.parse("kl<=0.05"), SETTINGS, s.calib)

    serial, sharded = _serial_and_sharded(verifier, candidates, executor)
    for a, b in zip(serial, sharded):
        assert (a.quality.kl, a.quality.ppl, a.quality.n_tokens) == \
            (b.quality.kl, b.quality.ppl, b.quality.n_tokens)
    assert any(m.quality.kl > 0 for m in serial)


def test_streamed_verification_on_ray_equals_the_serial_measurements(
        s: Setup, executor: RayExecutor, tmp_path: Path) -> None:
    """Streamed (8B-70B) verification: each worker streams the checkpoint itself and
    measures a group of candidates; the results equal one process's bit for bit."""
    from autoplan.streaming.evaluate import StreamedEvaluator
    from autoplan.streaming.skeleton import StreamedModel
    from tests.unit._tiny import save_tiny_folder

    folder = save_tiny_folder(tmp_path / "model")
    tgt = get_target("h100-sxm")
    space = build_space(tiny_spec(), tgt, "tensorrt-llm")
    tables = build_tables(space, CostModel(tiny_spec(), tgt, WORKLOAD), synthetic_profile(space))
    candidates = [(p, f"uniform {c}") for c in space.all_choices
                  if (p := tables.uniform_picks(c)) and c != space.baseline][:3]
    assert len(candidates) == 3
    settings = CompressionSettings("sparsegpt", "gptq")  # every candidate needs Hessians
    evaluator = StreamedEvaluator(StreamedModel(folder, device=torch.device("cpu")),
                                  s.data.eval, calib_batches=s.calib)

    def verifier() -> Verifier:
        return Verifier(None, space, tables, evaluator, QualityBudget.parse("kl<=0.05"),
                        settings, s.calib)

    serial, sharded = _serial_and_sharded(verifier, candidates, executor)
    for a, b in zip(serial, sharded):
        assert (a.quality.kl, a.quality.ppl) == (b.quality.kl, b.quality.ppl)
    assert all(m.quality.kl > 0 for m in serial)


def test_streamed_profile_on_ray_equals_the_serial_one_exactly(
        s: Setup, executor: RayExecutor, tmp_path: Path) -> None:
    from autoplan.streaming.profile import build_profile_streamed
    from autoplan.streaming.skeleton import StreamedModel
    from tests.unit._tiny import save_tiny_folder

    sm = StreamedModel(save_tiny_folder(tmp_path / "model"), device=torch.device("cpu"))

    def build(cache: Path, ex=None):  # noqa: ANN001, ANN202
        return build_profile_streamed(sm, s.layers, s.choices, s.calib, model_hash="tiny",
                                      calib_hash="c", settings=SETTINGS, cache_dir=cache,
                                      executor=ex)

    serial, sharded = build(tmp_path / "serial"), build(tmp_path / "ray", executor)
    assert sharded.scores == serial.scores and sharded.outliers == serial.outliers
    assert set(serial.scores) == set(s.layers)


def test_an_address_that_is_not_a_ray_cluster_is_one_line() -> None:
    # something accepts connections there but never answers (Ray itself would retry for
    # minutes): refused within the connect timeout, before Ray is asked to join
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        with pytest.raises(UserInputError, match=f"--ray 127.0.0.1:{port}: no Ray cluster") as err:
            RayExecutor(f"127.0.0.1:{port}", connect_timeout_s=1)
    assert "\n" not in str(err.value)


def test_an_address_that_answers_but_not_as_ray_is_one_line() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]

        def answer_http1() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer_http1, daemon=True).start()
        with pytest.raises(UserInputError, match="not as a Ray cluster") as err:
            RayExecutor(f"127.0.0.1:{port}", connect_timeout_s=5)
    assert "\n" not in str(err.value)
