"""llama.cpp's server launcher and its lifecycle, against a stand-in llama_cpp package (the
real engine is a 30-minute build): the launcher applies its patches, binds 127.0.0.1, is
stopped with everything it started, and bad input fails in one line before anything starts."""

from __future__ import annotations

import json
import socket
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from autoplan.engines import engine_names, get_engine
from autoplan.engines.llamacpp_serve import llamacpp_server, server_argv
from autoplan.engines.serving import port_in_use
from autoplan.errors import UserInputError

_FAKE = {
    # The names the launcher and llamacpp_worker.py use, nothing more.
    "llama_cpp/__init__.py": "class Llama: ...\n",
    "llama_cpp/llama_cpp.py": textwrap.dedent("""
        class _Params:
            use_extra_bufts = True
        def llama_model_default_params():
            return _Params()
        def llama_token_is_eog(vocab, token):
            return True
    """),
    "llama_cpp/server/__init__.py": "",
    "llama_cpp/server/settings.py": textwrap.dedent("""
        class _S:
            def __init__(self, **kw):
                self.__dict__.update(kw)
        ServerSettings = ModelSettings = _S
    """),
    "llama_cpp/server/app.py": textwrap.dedent("""
        import llama_cpp.llama_cpp as c
        def create_app(server_settings, model_settings):
            m = model_settings[0]
            # what the real server would load: the default params as patched, at load time
            return {"data": [{"id": m.model_alias}], "host": server_settings.host,
                    "use_extra_bufts": c.llama_model_default_params().use_extra_bufts,
                    "eog": c.llama_token_is_eog(None, 2), "n_threads": m.n_threads,
                    "interrupt": server_settings.interrupt_requests,
                    "logits_all": m.logits_all}
    """),
    "uvicorn.py": textwrap.dedent("""
        import json
        from http.server import BaseHTTPRequestHandler, HTTPServer
        def run(app, host, port, log_level=None):
            app = getattr(app, "__wrapped__", app)  # the launcher's header filter
            class H(BaseHTTPRequestHandler):
                def do_GET(self):
                    body = json.dumps(app).encode()
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(body)
                def log_message(self, *a):
                    pass
            HTTPServer((host, port), H).serve_forever()
    """),
    "numpy.py": "",  # llamacpp_worker imports it; the stand-in never uses it
}


@pytest.fixture
def fake_engine(tmp_path: Path) -> dict[str, str]:
    root = tmp_path / "fake"
    for rel, text in _FAKE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return {"PYTHONPATH": str(root), "PYTHONNOUSERSITE": "1"}


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    return path


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def test_launcher_serves_without_extra_buffers_on_localhost(fake_engine, gguf) -> None:
    server = llamacpp_server(gguf, threads=1, alias="plan", ignore_eos=True,
                             python=sys.executable, env=fake_engine, timeout_s=60)
    with server:
        assert server.base_url.startswith("http://127.0.0.1:")
        got = _get(server.base_url + "/v1/models")
        assert got["data"] == [{"id": "plan"}] and got["host"] == "127.0.0.1"
        assert got["use_extra_bufts"] is False and got["eog"] is False
        assert got["n_threads"] == 1
        # requests queue instead of cutting each other short; prefill keeps the last logits
        assert got["interrupt"] is False and got["logits_all"] is False
        pid = server.proc.pid
    assert not port_in_use(server.port)
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)


def test_defaults_keep_eos_and_extra_buffers_on_request(fake_engine, gguf) -> None:
    with llamacpp_server(gguf, threads=1, extra_bufts=True, python=sys.executable,
                         env=fake_engine, timeout_s=60) as server:
        got = _get(server.base_url + "/v1/models")
    assert got["use_extra_bufts"] is True and got["eog"] is True
    assert got["data"] == [{"id": "m"}]


def test_port_in_use_is_one_line(fake_engine, gguf) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        server = llamacpp_server(gguf, port=port, python=sys.executable, env=fake_engine)
        with pytest.raises(UserInputError, match=f"port {port} .* in use") as err:
            server.start()
    assert "\n" not in str(err.value) and server.proc is None


def test_missing_engine_names_the_install_command(tmp_path, gguf, monkeypatch) -> None:
    monkeypatch.setenv("AUTOPLAN_CACHE", str(tmp_path / "cache"))
    for name in engine_names():
        monkeypatch.delenv(get_engine(name).env_var, raising=False)
    with pytest.raises(UserInputError, match=r"`autoplan engines install llama.cpp`"):
        llamacpp_server(gguf)


def test_missing_file_is_refused_before_the_engine(tmp_path) -> None:
    with pytest.raises(UserInputError, match="autoplan export --format gguf"):
        llamacpp_server(tmp_path / "none.gguf", python=sys.executable)


def test_argv_carries_one_json_config() -> None:
    argv = server_argv("py", "m.gguf", port=8, threads=2, n_ctx=256, alias="a")
    cfg = json.loads(argv[-1])
    assert argv[1].endswith("llamacpp_server.py")
    assert cfg == {"model": "m.gguf", "port": 8, "threads": 2, "n_ctx": 256, "alias": "a",
                   "ignore_eos": False, "extra_bufts": False}


def test_slo_summary_separates_tpot_from_queueing() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from llamacpp_serve import slo_summary

    def point(rate: float, thr: float, ttft: float, tpot: float) -> dict:
        return {"request_rate": rate, "completed": 8, "request_throughput": thr,
                "ttft_p99_ms": ttft, "tpot_p99_ms": tpot}

    # one request at a time: TPOT flat, TTFT grows with the queue past capacity
    points = [point(0.1, 0.1, 900, 30), point(0.3, 0.28, 2500, 31),
              point(0.5, 0.33, 9000, 31), point(float("inf"), 0.34, 20000, 32)]
    got = slo_summary(points, slo_tpot_ms=40, slo_ttft_ms=4000)
    assert got == {"max_rate_tpot_slo": float("inf"), "max_rate_tpot_ttft_slo": 0.3,
                   "saturated_req_s": 0.34}
    assert slo_summary(points, slo_tpot_ms=10, slo_ttft_ms=4000)["max_rate_tpot_slo"] is None
