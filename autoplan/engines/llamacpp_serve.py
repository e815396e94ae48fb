"""Serve a GGUF with llama.cpp's OpenAI-compatible server, on 127.0.0.1.

Reasoning and sources: docs/modules.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from autoplan.engines.serving import HOST, ServerProcess, free_port
from autoplan.errors import UserInputError

LAUNCHER = Path(__file__).with_name("llamacpp_server.py")
BATCH_SERVER = Path(__file__).with_name("llamacpp_batch_server.py")


def server_argv(python: str | Path, gguf: str | Path, *, port: int, threads: int, n_ctx: int,
                alias: str, ignore_eos: bool = False, extra_bufts: bool = False) -> list[str]:
    """The launcher's command line (one JSON argument; the host is always 127.0.0.1)."""
    cfg = {"model": str(gguf), "port": int(port), "threads": int(threads), "n_ctx": int(n_ctx),
           "alias": alias, "ignore_eos": bool(ignore_eos), "extra_bufts": bool(extra_bufts)}
    return [str(python), str(LAUNCHER), json.dumps(cfg)]


def _file_and_engine(gguf: str | Path, python: str | Path | None) -> tuple[Path, Path]:
    """The GGUF (it must exist) and the llama.cpp engine's interpreter (installed)."""
    from autoplan.engines import engine_python

    path = Path(gguf)
    if not path.is_file():
        raise UserInputError(f"no GGUF file at '{path}': pass the file "
                             "`autoplan export --format gguf` wrote")
    return path, Path(python) if python else engine_python("llama.cpp")


def llamacpp_server(gguf: str | Path, *, port: int | None = None, threads: int | None = None,
                    n_ctx: int = 2048, alias: str | None = None, ignore_eos: bool = False,
                    extra_bufts: bool = False, log_path: str | Path | None = None,
                    python: str | Path | None = None, env: dict[str, str] | None = None,
                    timeout_s: float = 300) -> ServerProcess:
    """llama.cpp's server for one GGUF file, ready to start.

    Args:
        gguf: the model file (``autoplan export --format gguf`` writes one).
        port: the port on 127.0.0.1 (default: a free one).
        threads: llama.cpp threads (default: physical cores).
        n_ctx: context length (prompt + output of one request).
        alias: the model name the server answers to (default: the file's stem).
        ignore_eos: run every completion to ``max_tokens`` (load benchmarks).
        extra_bufts: let llama.cpp repack weights into its extra CPU buffer types.
        log_path: where the server's output goes (default: a temp file).
        python: the engine's interpreter (default: the installed llama.cpp engine).
        env: extra environment variables for the server.
        timeout_s: how long to wait for the server to answer.

    Raises:
        UserInputError: the engine is not installed (the message names
            ``autoplan engines install llama.cpp``), or the file is missing. Checked here,
            before anything starts; a port in use is refused by ``start()``.
    """
    from autoplan.engines.llamacpp import default_threads

    path, exe = _file_and_engine(gguf, python)
    port = int(port) if port else free_port()
    name = alias or path.stem
    argv = server_argv(exe, path.resolve(), port=port, threads=threads or default_threads(),
                       n_ctx=n_ctx, alias=name, ignore_eos=ignore_eos, extra_bufts=extra_bufts)
    return ServerProcess(argv, port=port, what=f"llama.cpp server ({name})",
                         log_path=log_path, env=env, timeout_s=timeout_s)


def llamacpp_batch_server(gguf: str | Path, *, cache_type: str, n_ctx: int, n_seq: int,
                          port: int | None = None, threads: int | None = None,
                          alias: str | None = None, chunk: int = 256, ignore_eos: bool = True,
                          log_path: str | Path | None = None, python: str | Path | None = None,
                          timeout_s: float = 300) -> ServerProcess:
    """A continuous-batching llama.cpp server for one GGUF (llamacpp_batch_server.py): up to
    ``n_seq`` sequences share one cache of ``n_ctx`` cells of ``cache_type`` (flash
    attention on), each admitted when its prompt + max_tokens cells are free.

    Raises:
        UserInputError: the engine is not installed, or the file is missing.
    """
    from autoplan.engines.llamacpp import default_threads

    path, exe = _file_and_engine(gguf, python)
    port = int(port) if port else free_port()
    name = alias or path.stem
    cfg = {"model": str(path.resolve()), "port": port, "threads": threads or default_threads(),
           "n_ctx": int(n_ctx), "n_seq": int(n_seq), "cache_type": cache_type, "alias": name,
           "chunk": int(chunk), "ignore_eos": bool(ignore_eos)}
    return ServerProcess([str(exe), str(BATCH_SERVER), json.dumps(cfg)], port=port,
                         what=f"llama.cpp batch server ({name}, {cache_type} cache)",
                         log_path=log_path, timeout_s=timeout_s)


__all__ = ["BATCH_SERVER", "HOST", "LAUNCHER", "llamacpp_batch_server", "llamacpp_server",
           "server_argv"]
