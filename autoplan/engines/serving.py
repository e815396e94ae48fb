"""Start an OpenAI-compatible server and load it with vLLM's own serving benchmark.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import AutoplanError, UserInputError

HOST = "127.0.0.1"  # servers autoplan starts are never reachable from outside the machine
VLLM_CLI = Path(__file__).with_name("vllm_cli.py")  # `vllm ...` as the engine's Python runs it
_LIVE: set[ServerProcess] = set()  # stopped by atexit and by stop_on_signals' handler


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = HOST) -> bool:
    """True when something already listens on (host, port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "no log"
    kept = [x.strip() for x in text.splitlines() if x.strip()][-lines:]
    return " | ".join(kept) or "empty log"


def kill_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the process group (the server and its children), SIGKILL what outlives
    ``grace_s``. The group id is the leader's pid (``start_new_session``), so children that
    outlive their parent are still reached."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()
        try:
            os.killpg(pgid, 0)  # anyone left in the group?
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.1)
    else:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


class ServerProcess:
    """One server process (and its children) on 127.0.0.1, stopped however we leave.

    Args:
        argv: the server's command line; it must bind to ``HOST`` and ``port`` (put them in
            ``argv`` yourself, e.g. ``--host 127.0.0.1 --port N``).
        port: the port it listens on; a port already in use is refused before starting.
        what: a name for messages (``vllm serve (baseline)``).
        ready_path: a GET path that answers 200 once the server can take requests.
        log_path: where stdout and stderr go (default: a temp file removed on stop).
        env: extra environment variables.
        timeout_s: how long to wait for readiness.
        grace_s: how long SIGTERM has before SIGKILL on stop.
    """

    def __init__(self, argv: Sequence[str], *, port: int, what: str = "server",
                 ready_path: str = "/v1/models", log_path: str | Path | None = None,
                 env: dict[str, str] | None = None, timeout_s: float = 900,
                 grace_s: float = 15) -> None:
        self.argv, self.port, self.what = [str(a) for a in argv], int(port), what
        self.ready_path, self.env, self.timeout_s, self.grace_s = ready_path, env, timeout_s, grace_s
        self._tmp: tempfile.TemporaryDirectory | None = None
        if log_path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="autoplan-server-")
            log_path = Path(self._tmp.name) / "server.log"
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.ready_seconds: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> ServerProcess:
        """Start the server and wait until ``ready_path`` answers.

        Raises:
            UserInputError: the port is in use (one line naming it).
            AutoplanError: the server exited or did not become ready in time (one line with
                the last lines of its log); it is stopped before raising.
        """
        if port_in_use(self.port):
            raise UserInputError(f"port {self.port} on {HOST} is in use: stop what listens "
                                 "there or pick another port (--port)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")  # noqa: SIM115 - the child keeps it open
        try:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, **(self.env or {})})
        except OSError as exc:
            raise AutoplanError(f"{self.what} could not start: {exc}") from exc
        finally:
            log.close()
        _LIVE.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        t0 = time.monotonic()
        url = self.base_url + self.ready_path
        while True:
            code = self.proc.poll() if self.proc else -1
            if code is not None:
                raise AutoplanError(f"{self.what} exited (code {code}) before it was ready: "
                                    f"{log_tail(self.log_path)}")
            with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
                with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - localhost
                    if resp.status == 200:
                        self.ready_seconds = time.monotonic() - t0
                        return
            if time.monotonic() - t0 > self.timeout_s:
                raise AutoplanError(f"{self.what} was not ready after {self.timeout_s:.0f} s: "
                                    f"{log_tail(self.log_path)}")
            time.sleep(0.5)

    def log_tail(self, lines: int = 3) -> str:
        """The last non-empty lines of the server's log, joined with ' | '."""
        return log_tail(self.log_path, lines)

    def stop(self) -> None:
        """Stop the server and its children (idempotent)."""
        if self.proc is not None:
            kill_group(self.proc, self.grace_s)
        _LIVE.discard(self)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


atexit.register(_stop_all)


def stop_on_signals(signals: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> None:
    """Turn SIGTERM/SIGHUP into SystemExit so context managers and atexit stop every server
    (Python's default for these signals exits without running either). Ctrl-C already
    raises KeyboardInterrupt. Call once from a script's main thread."""
    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in signals:
        signal.signal(sig, _exit)


# ---- vllm bench serve -------------------------------------------------------------------

@dataclass(frozen=True)
class RatePoint:
    """One ``vllm bench serve`` run at one request rate (times in milliseconds)."""

    request_rate: float
    completed: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    e2el_p99_ms: float | None = None  # end-to-end request latency (what a fleet SLA bounds)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_bench_result(doc: dict[str, Any], rate: float) -> RatePoint:
    """The figures autoplan keeps from the JSON ``vllm bench serve --save-result`` writes."""
    try:
        point = RatePoint(
            request_rate=float(rate), completed=int(doc["completed"]),
            duration_s=float(doc["duration"]),
            request_throughput=float(doc["request_throughput"]),
            output_throughput=float(doc["output_throughput"]),
            ttft_p50_ms=float(doc["median_ttft_ms"]), ttft_p99_ms=float(doc["p99_ttft_ms"]),
            tpot_p50_ms=float(doc["median_tpot_ms"]), tpot_p99_ms=float(doc["p99_tpot_ms"]),
            e2el_p99_ms=float(doc["p99_e2el_ms"]) if doc.get("p99_e2el_ms") is not None
            else None)
    except (KeyError, TypeError, ValueError) as exc:
        raise AutoplanError(f"`vllm bench serve` wrote a result without {exc}: is the vLLM "
                            "engine the version autoplan installs?") from exc
    if point.completed == 0:  # a server that answers every request with an error
        errors = doc.get("errors") or []
        first = f": {str(errors[0])[:200]}" if errors else ""
        raise AutoplanError(f"`vllm bench serve` at {rate:g} req/s: every request failed"
                            f"{first}; check the server's log")
    return point


def bench_command(python: str | Path, base_url: str, model: str, tokenizer: str | Path,
                  rate: float, *, input_len: int, output_len: int, num_prompts: int,
                  result_dir: Path, result_file: str, seed: int = 0,
                  backend: str = "openai", endpoint: str = "/v1/completions",
                  max_concurrency: int | None = None) -> list[str]:
    """The ``vllm bench serve`` command line for one rate (random prompts of fixed length)."""
    cmd = [str(python), str(VLLM_CLI), "bench", "serve",
           "--backend", backend, "--base-url", base_url, "--endpoint", endpoint,
           "--model", model, "--tokenizer", str(tokenizer),
           "--dataset-name", "random", "--random-input-len", str(input_len),
           "--random-output-len", str(output_len), "--random-range-ratio", "0",
           "--ignore-eos", "--num-prompts", str(num_prompts),
           "--request-rate", str(rate), "--seed", str(seed),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--save-result", "--result-dir", str(result_dir), "--result-filename", result_file,
           "--disable-tqdm"]
    if max_concurrency:
        cmd += ["--max-concurrency", str(max_concurrency)]
    return cmd


def bench_serve(base_url: str, model: str, tokenizer: str | Path, rates: Sequence[float], *,
                input_len: int, output_len: int, num_prompts: int, seed: int = 0,
                python: str | Path | None = None, backend: str = "openai",
                endpoint: str = "/v1/completions", max_concurrency: int | None = None,
                timeout_s: float = 1800,
                echo: Callable[[str], None] = lambda _s: None) -> list[RatePoint]:
    """Run ``vllm bench serve`` once per request rate against an OpenAI-compatible server.

    Args:
        base_url: the server (``http://127.0.0.1:PORT``).
        model: the model name the server answers to.
        tokenizer: an HF tokenizer folder (the random prompts are drawn from its vocabulary
            and their lengths counted with it).
        rates: request rates (requests/s, Poisson arrivals); ``inf`` sends all at once.
        input_len, output_len: fixed prompt and output lengths (``--ignore-eos``).
        num_prompts: requests per rate.
        python: the vLLM engine's interpreter (default: the installed engine).

    Raises:
        UserInputError: the vLLM engine is not installed.
        AutoplanError: a benchmark run failed (one line with its last output lines).
    """
    from autoplan.engines import engine_python

    exe = Path(python) if python else engine_python("vllm")
    points = []
    with tempfile.TemporaryDirectory(prefix="autoplan-bench-") as tmp:
        for i, rate in enumerate(rates):
            name = f"rate{i}.json"
            cmd = bench_command(exe, base_url, model, tokenizer, rate, input_len=input_len,
                                output_len=output_len, num_prompts=num_prompts,
                                result_dir=Path(tmp), result_file=name, seed=seed,
                                backend=backend, endpoint=endpoint,
                                max_concurrency=max_concurrency)
            echo(f"vllm bench serve: rate {rate} req/s, {num_prompts} prompts "
                 f"({input_len} in / {output_len} out)")
            log = Path(tmp) / f"rate{i}.log"
            run_group(cmd, log, timeout_s)
            out = Path(tmp) / name
            if not out.is_file():
                raise AutoplanError(f"`vllm bench serve` at rate {rate} saved no result: "
                                    f"{log_tail(log)}")
            points.append(parse_bench_result(json.loads(out.read_text()), rate))
    return points


def run_group(cmd: Sequence[str], log: Path, timeout_s: float, *,
              what: str = "`vllm bench serve`", stdout: Path | None = None,
              check: bool = True) -> int:
    """Run a command in its own process group, killed with its children if we are
    interrupted or it runs past ``timeout_s``.

    Args:
        log: where stderr (and stdout, unless ``stdout`` names another file) goes.
        what: the command's name in messages.
        check: raise on a non-zero exit (with the log's last lines) instead of returning it.
    """
    with open(log, "w") as err, open(stdout or os.devnull, "w") as out:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=out if stdout else err,
                                stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc, 5)
            raise AutoplanError(f"{what} ran past {timeout_s:.0f} s: {log_tail(log)}") from None
        except BaseException:
            kill_group(proc, 5)
            raise
    if code and check:
        raise AutoplanError(f"{what} failed (exit {code}): {log_tail(log)}")
    return code


def max_rate_within_slo(points: Sequence[RatePoint], p99_tpot_ms: float) -> RatePoint | None:
    """The highest-rate point whose p99 TPOT is within the SLO (None if none is)."""
    ok = [p for p in points if p.tpot_p99_ms <= p99_tpot_ms and p.completed > 0]
    return max(ok, key=lambda p: p.request_rate) if ok else None


__all__ = ["HOST", "RatePoint", "ServerProcess", "bench_command", "bench_serve", "free_port",
           "VLLM_CLI", "kill_group", "log_tail", "max_rate_within_slo", "parse_bench_result", "port_in_use",
           "run_group", "stop_on_signals"]
