"""llama.cpp's OpenAI-compatible server for one GGUF: runs in the llama.cpp engine's own venv
(``autoplan engines install llama.cpp``), started by ``autoplan.engines.llamacpp_serve``. It
imports only the standard library and llama-cpp-python (autoplan is not installed there).

Reasoning and sources: docs/modules.md.
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
    """The ASGI app without the client's ``x-request-id`` header (why: docs/modules.md)."""
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
