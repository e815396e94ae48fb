"""llama.cpp's OpenAI-compatible server for one GGUF: runs in the llama.cpp engine's own venv
(``autoplan engines install llama.cpp``), started by ``autoplan.engines.llamacpp_serve``. It
imports only the standard library and llama-cpp-python (autoplan is not installed there).

It is llama-cpp-python's own server (``llama_cpp.server``: its FastAPI app from
``create_app`` with its ``ServerSettings`` / ``ModelSettings``, run by uvicorn) with two
changes the stock ``python -m llama_cpp.server`` cannot make from its command line, and two
settings changed from its defaults:

* the weights load without llama.cpp's extra CPU buffer types (``use_extra_bufts=False``,
  as in llamacpp_worker.py: the AMX path of llama-cpp-python 0.3.36 segfaults on
  multi-token batches, and autoplan's kernel table times the plain ggml kernels);
  ``extra_bufts: true`` keeps them;
* ``ignore_eos: true``: no token ends a completion early, so every request runs to its
  ``max_tokens``, as ``vllm bench serve --ignore-eos`` asks of vLLM (llama-cpp-python's
  request schema has no ``ignore_eos`` field and drops it). For load benchmarks only;
* ``interrupt_requests=False``: by default a new request cuts the streaming one short
  (``[DONE]`` after the current token); here requests queue for the model instead, so every
  request gets all its tokens and waiting shows up as TTFT;
* an ``x-request-id`` header is dropped before the app sees it: llama-cpp-python's
  ``RequestIdPlugin`` answers 400 Bad Request to any id that is not a UUID, and
  ``vllm bench serve`` sends ``bench-<hex>-<n>`` with every request (the plugin then makes
  its own id);
* ``logits_all=False``: the default keeps the logits of every prompt position, which runs
  the 49152-row lm_head over the whole prompt in prefill; a server needs the last one.

The server runs one request at a time (llama-cpp-python holds a lock around the model).

The host is always 127.0.0.1.

Usage (engine python): llamacpp_server.py '{"model": GGUF, "port": N, "threads": T,
    "n_ctx": C, "alias": NAME, "extra_bufts": false, "ignore_eos": false}'
"""

import json
import sys

HOST = "127.0.0.1"


def _ignore_eos() -> None:
    """Make llama-cpp-python's end-of-generation test false for every token (its generate and
    completion loops look the function up on the module at each call)."""
    import llama_cpp.llama_cpp as capi

    for name in ("llama_token_is_eog", "llama_vocab_is_eog"):
        if hasattr(capi, name):
            setattr(capi, name, lambda *_a: False)


def _drop_request_id(app):  # noqa: ANN001, ANN202 - an ASGI app in, an ASGI app out
    """The ASGI app without the client's ``x-request-id`` header (see the module docstring)."""
    async def wrapped(scope, receive, send):  # noqa: ANN001, ANN202
        if scope.get("type") == "http":
            scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers", [])
                                         if k.lower() != b"x-request-id"])
        await app(scope, receive, send)
    wrapped.__wrapped__ = app  # the functools convention: what it wraps
    return wrapped


def main() -> int:
    cfg = json.loads(sys.argv[1])
    if not cfg.get("extra_bufts"):
        from llamacpp_worker import _no_extra_buffers  # the script beside this one

        _no_extra_buffers()
    if cfg.get("ignore_eos"):
        _ignore_eos()
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    n_ctx = int(cfg.get("n_ctx", 512))
    model = ModelSettings(model=cfg["model"], model_alias=cfg.get("alias"),
                          n_threads=int(cfg["threads"]), n_threads_batch=int(cfg["threads"]),
                          n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=False,
                          verbose=False)
    server = ServerSettings(host=HOST, port=int(cfg["port"]), interrupt_requests=False)
    app = create_app(server_settings=server, model_settings=[model])
    uvicorn.run(_drop_request_id(app), host=HOST, port=int(cfg["port"]), log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
