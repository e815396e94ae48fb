"""Run profile scoring tasks and verification candidates on a Ray cluster.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from autoplan.errors import AutoplanError, UserInputError

T = TypeVar("T")
R = TypeVar("R")

INSTALL_HINT = "pip install 'autoplan[ray]'"
CONNECT_TIMEOUT_S = 5.0
MAX_RETRIES = 3
DEFAULT_PORT = 6379  # the port `ray start --head` listens on
_INIT = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}


def _shim_broken_amdsmi() -> None:
    """Make a broken `amdsmi` look absent, for this process and the ones Ray starts.

    The amdsmi wheel raises KeyError at import when ROCm's libamd_smi.so is missing (it is
    in our `test` extra), and Ray's GPU detection only catches ImportError, so `import ray`
    fails in every Ray process. A one-file package that raises ImportError, first on
    PYTHONPATH, turns that into "no AMD GPU", which is the truth on such a machine.
    """
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # it prints its failure to stdout
            import amdsmi  # noqa: F401
    except ImportError:
        return
    except Exception:  # noqa: BLE001 - any failure means amdsmi is unusable here
        # Removed when this process exits (the Ray workers it starts end with it), so runs
        # do not pile up folders in the temp directory.
        root = tempfile.mkdtemp(prefix="autoplan-amdsmi-shim-")
        atexit.register(shutil.rmtree, root, True)
        shim = Path(root) / "amdsmi"
        shim.mkdir()
        (shim / "__init__.py").write_text(
            'raise ImportError("amdsmi unusable here: libamd_smi.so not found")\n')
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(shim.parent), os.environ.get("PYTHONPATH")) if p)
        for name in [m for m in sys.modules if m == "amdsmi" or m.startswith("amdsmi.")]:
            del sys.modules[name]
        sys.modules["amdsmi"] = None  # type: ignore[assignment]  # import -> ImportError


def import_ray(flag: str = "--ray") -> Any:
    """The `ray` module, or a one-line error naming the extra to install."""
    _shim_broken_amdsmi()
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise UserInputError(f"{flag} needs Ray, which is not installed: {INSTALL_HINT}") from None


def _host_port(address: str) -> tuple[str, int]:
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep:
        return rest, DEFAULT_PORT
    if not port.isdigit():
        raise UserInputError(f"--ray {address}: expected auto or HOST:PORT, e.g. 10.0.0.5:6379")
    return host.strip("[]"), int(port)


# An HTTP/2 client's first bytes: the connection preface and an empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_H2_SETTINGS = 4


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail in seconds, with one line, unless a gRPC (HTTP/2) server answers at `address`.

    Ray's own join retries for minutes against a port that accepts and stays silent, and
    prints a page of log; a Ray head's GCS is a gRPC server, so it answers an HTTP/2
    preface with a SETTINGS frame at once (skipped with RAY_USE_TLS: it wants TLS first).
    """
    host, port = _host_port(address)
    fix = "start one with `ray start --head` or pass --ray auto"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            sock.sendall(_H2_PREFACE)
            head = sock.recv(9)
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise UserInputError(f"--ray {address}: no Ray cluster reachable at {host}:{port} "
                             f"({reason} within {timeout_s:g} s); {fix}") from None
    if len(head) < 9 or head[3] != _H2_SETTINGS:
        raise UserInputError(f"--ray {address}: {host}:{port} answers, but not as a Ray "
                             f"cluster (no gRPC server there); {fix}")


def _loopback_only() -> None:
    """A local cluster started by us listens on 127.0.0.1 only. Ray turns a loopback
    node_ip_address into the machine's routable address and its servers listen on every
    interface, unless it runs in single-machine mode (the flag it reads from the
    environment, here and in every process it starts)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # Ray imported already: it read the flag at import
        constants.ENABLE_RAY_CLUSTER = False


def _short_join(timeout_s: float) -> None:
    """Give up joining a cluster after about `timeout_s` (Ray retries its first GCS request
    once a second, 20 times by default)."""
    retries = max(int(timeout_s), 1)
    os.environ["RAY_NUM_REDIS_GET_RETRIES"] = str(retries)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.NUM_REDIS_GET_RETRIES = retries


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for a moment, so a wrong address gets our one
    line instead of a page of native log lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _warm(threads: int) -> int:
    """Start a worker and import what scoring tasks need, before the first one comes."""
    import torch

    import autoplan.sensitivity.profile  # noqa: F401 - the import is the point

    torch.set_num_threads(threads)
    return os.getpid()


def cpus_per_task(threads: int, node_cpus: Iterable[float]) -> int:
    """CPUs a task of `threads` torch threads claims: its threads, but no more than the
    biggest node has (a claim no node can meet would wait forever)."""
    biggest = max((int(c) for c in node_cpus), default=1)
    return max(min(threads, biggest), 1)


def _call(fn: Callable[[T], R], item: T, threads: int) -> R:
    """What each Ray task runs: `fn(item)` with the driver's torch thread count (reduction
    order, hence the last bits of a score, can depend on it)."""
    import torch

    torch.set_num_threads(threads)
    return fn(item)


class RayExecutor:
    """Shards `imap_unordered` over a Ray cluster (docs/modules.md says why).

    Args:
        address: "auto" (the cluster in RAY_ADDRESS, else a new local one bound to
            127.0.0.1) or HOST:PORT / ray://HOST:PORT of a running cluster.
        num_cpus: CPUs of a new local cluster (default: all of this machine's).
        max_retries: reruns of a task whose worker process died.
        max_in_flight: tasks submitted at once (default: 2 per worker), which bounds how
            many items sit in the object store.
    """

    name = "ray"

    def __init__(self, address: str = "auto", *, num_cpus: int | None = None,
                 max_retries: int = MAX_RETRIES, max_in_flight: int | None = None,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        import torch

        target = os.environ.get("RAY_ADDRESS") if address == "auto" else address
        if target:
            check_reachable(target, connect_timeout_s)  # before importing Ray: seconds, not minutes
            _short_join(connect_timeout_s)
        else:
            _loopback_only()
        ray = import_ray()
        self._ray = ray
        self._owns = False
        self._threads = torch.get_num_threads()
        self._max_retries, self._max_in_flight = max_retries, max_in_flight
        self._started: BaseException | None = None
        self._starting: threading.Thread | None = None
        self._up, self._closing = threading.Event(), threading.Event()
        self._up.set()  # set again below for a local cluster: cleared while it starts
        if ray.is_initialized():
            self._start()
        elif target:
            # joined now, in the caller's thread: a wrong address fails with its one line
            # before the model loads
            try:
                with _stderr_silenced():  # Ray's C++ client logs each retry there
                    ray.init(address=target, **_INIT)
            except (ConnectionError, TimeoutError, RuntimeError) as exc:
                raise UserInputError(f"--ray {target}: could not join the Ray cluster "
                                     f"there: {_first_line(exc)}") from None
            self._owns = True
            self._start()
        else:
            # A new local cluster starts in the background (5-17 s on 2 cores), overlapping
            # the driver's model load and capture pass; the first use waits for it.
            self._owns = True
            self._up.clear()
            self._starting = threading.Thread(target=self._start_local, args=(num_cpus,),
                                              name="autoplan-ray-start", daemon=True)
            self._starting.start()

    def _start_local(self, num_cpus: int | None) -> None:
        try:
            self._ray.init(num_cpus=num_cpus, **_INIT)
            self._start()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            self._started = exc
        finally:
            self._up.set()
        # Ray's processes die with the *thread* that started them (Linux's parent-death
        # signal follows the thread), so this one stays until the cluster is shut down.
        self._closing.wait()

    def _start(self) -> None:
        """Size the workers from the cluster's resources and start them."""
        ray = self._ray
        node_cpus = [n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")]
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus:
            claim = {"num_gpus": 1, "num_cpus": 0}
            workers = gpus
        else:
            cpus = cpus_per_task(self._threads, node_cpus)
            claim = {"num_cpus": cpus}
            workers = max(sum(int(c) // cpus for c in node_cpus), 1)
        self._gpus, self._workers = gpus, workers
        options = dict(max_retries=self._max_retries, retry_exceptions=False, **claim)
        self._remote = ray.remote(_call).options(**options)
        warm = ray.remote(_warm).options(**options)
        # not waited for: the workers start while the driver loads the model
        self._warming = [warm.remote(self._threads) for _ in range(workers)]

    def _ready(self) -> None:
        """Wait for a local cluster's background start; raise what it raised."""
        self._up.wait()
        if self._started is not None:
            raise AutoplanError(f"--ray auto: the local Ray cluster did not start: "
                                f"{_first_line(self._started)}") from None

    @property
    def workers(self) -> int:
        self._ready()
        return self._workers

    @property
    def gpus(self) -> int:
        self._ready()
        return self._gpus

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight or 2 * self.workers

    def imap_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[tuple[int, R]]:
        self._ready()
        ray = self._ray
        fn_ref = ray.put(fn)
        pending: dict[Any, int] = {}
        source = enumerate(items)
        exhausted = False
        try:
            while pending or not exhausted:
                while not exhausted and len(pending) < self.max_in_flight:
                    nxt = next(source, None)
                    if nxt is None:
                        exhausted = True
                        break
                    i, item = nxt
                    pending[self._remote.remote(fn_ref, ray.put(item), self._threads)] = i
                if not pending:
                    break
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                i = pending.pop(ref)
                yield i, self._get(ref, i)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def _get(self, ref: Any, index: int) -> Any:
        exc_mod = self._ray.exceptions
        try:
            return self._ray.get(ref)
        except exc_mod.RayTaskError as exc:
            cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else None
            if isinstance(cause, AutoplanError):
                raise cause from None
            raise AutoplanError(f"Ray task {index} failed: {_first_line(cause or exc)}") from None
        except exc_mod.RayError as exc:
            # the worker died on every try (killed, out of memory, node lost)
            raise AutoplanError(f"Ray task {index} lost its worker on every try "
                                f"({type(exc).__name__}: {_first_line(exc)}); results finished so far "
                                "are kept, rerun to resume") from None

    def close(self) -> None:
        self._up.wait()  # closed before first use: let the start finish
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
        self._owns = False
        self._closing.set()
        if self._starting is not None:
            self._starting.join()
            self._starting = None

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["INSTALL_HINT", "RayExecutor", "check_reachable", "cpus_per_task", "import_ray"]
