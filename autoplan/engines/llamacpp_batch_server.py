"""A continuous-batching OpenAI-compatible server over llama.cpp: runs in the llama.cpp
engine's own venv (``autoplan engines install llama.cpp``), started by
``autoplan.engines.llamacpp_serve.llamacpp_batch_server``. It imports only the standard
library, numpy and llama-cpp-python's C API (autoplan is not installed there).

Reasoning and protocol: docs/modules.md.
"""

import ctypes
import json
import queue
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import llama_cpp.llama_cpp as C
import numpy as np

HOST = "127.0.0.1"
CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
               "bf16": 30}


class Request:
    def __init__(self, ids, max_tokens):
        self.ids, self.max_tokens = ids, max_tokens
        self.out = queue.Queue()  # text pieces, then None
        self.seq = -1
        self.fed = 0  # prompt tokens decoded so far
        self.generated = 0
        self.last = None  # last sampled token


class Engine:
    def __init__(self, cfg):
        C.llama_backend_init()
        mp = C.llama_model_default_params()
        mp.use_extra_bufts = bool(cfg.get("extra_bufts", False))
        self.model = C.llama_model_load_from_file(cfg["model"].encode(), mp)
        if not self.model:
            raise SystemExit(f"cannot load {cfg['model']}")
        self.vocab = C.llama_model_get_vocab(self.model)
        self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
        self.n_ctx, self.n_seq = int(cfg["n_ctx"]), int(cfg["n_seq"])
        self.chunk = int(cfg.get("chunk", 256))
        cp = C.llama_context_default_params()
        cp.n_ctx, cp.n_seq_max, cp.kv_unified = self.n_ctx, self.n_seq, True
        cp.n_batch = cp.n_ubatch = self.chunk + self.n_seq
        cp.n_threads = cp.n_threads_batch = int(cfg["threads"])
        kind = CACHE_TYPES[cfg.get("cache_type", "f16")]
        cp.type_k = cp.type_v = kind
        cp.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_ENABLED
        self.ctx = C.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise SystemExit("cannot create the llama.cpp context")
        self.mem = C.llama_get_memory(self.ctx)
        self.batch = C.llama_batch_init(cp.n_batch, 0, 1)
        self.waiting = queue.Queue()
        self.free_cells = self.n_ctx
        self.free_seqs = list(range(self.n_seq))
        self.running = []
        self.ignore_eos = bool(cfg.get("ignore_eos", True))

    def tokenize(self, text):
        raw = text.encode()
        buf = (C.llama_token * (len(raw) + 8))()
        n = C.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, False)
        return list(buf[:n])

    def piece(self, tok):
        buf = ctypes.create_string_buffer(64)
        n = C.llama_token_to_piece(self.vocab, tok, buf, 64, 0, False)
        return buf.raw[:max(n, 0)].decode("utf-8", errors="replace")

    def _admit(self):
        while self.free_seqs:
            try:
                req = self.waiting.queue[0]
            except IndexError:
                return
            need = len(req.ids) + req.max_tokens
            if need > self.n_ctx:
                self.waiting.get()
                req.out.put(ValueError(f"{need} tokens do not fit the cache ({self.n_ctx})"))
                continue
            if need > self.free_cells:
                return  # first come, first served: wait for cells
            self.waiting.get()
            req.seq = self.free_seqs.pop(0)
            self.free_cells -= need
            self.running.append(req)

    def _finish(self, req):
        C.llama_memory_seq_rm(self.mem, req.seq, -1, -1)
        self.free_cells += len(req.ids) + req.max_tokens
        self.free_seqs.append(req.seq)
        self.running.remove(req)
        req.out.put(None)

    def step(self):
        self._admit()
        if not self.running:
            return False
        b, n, rows = self.batch, 0, []
        budget = self.chunk
        for req in self.running:
            if req.fed < len(req.ids):  # prefill, a chunk at a time
                take = min(budget, len(req.ids) - req.fed)
                if take <= 0:
                    continue
                for j in range(take):
                    pos = req.fed + j
                    b.token[n], b.pos[n], b.n_seq_id[n] = req.ids[pos], pos, 1
                    b.seq_id[n][0] = req.seq
                    last = pos == len(req.ids) - 1
                    b.logits[n] = 1 if last else 0
                    if last:
                        rows.append((req, n))
                    n += 1
                req.fed += take
                budget -= take
            else:  # decode one token
                pos = len(req.ids) + req.generated - 1
                b.token[n], b.pos[n], b.n_seq_id[n] = req.last, pos, 1
                b.seq_id[n][0] = req.seq
                b.logits[n] = 1
                rows.append((req, n))
                n += 1
        b.n_tokens = n
        if n == 0:
            return False
        if C.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        for req, i in rows:
            logits = np.ctypeslib.as_array(C.llama_get_logits_ith(self.ctx, i),
                                           shape=(self.n_vocab,))
            tok = int(logits.argmax())
            req.last = tok
            req.generated += 1
            req.out.put(self.piece(tok))
            eog = C.llama_vocab_is_eog(self.vocab, tok) and not self.ignore_eos
            if req.generated >= req.max_tokens or eog:
                self._finish(req)
        return True

    def loop(self):
        while True:
            if not self.step():
                time.sleep(0.001)


def handler(engine, alias):  # noqa: ANN001, ANN201
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def _json(self, code, doc):
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.startswith("/v1/models"):
                self._json(200, {"object": "list", "data": [{"id": alias, "object": "model"}]})
            elif self.path.startswith("/health"):
                self._json(200, {"status": "ok"})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self):
            if not self.path.startswith("/v1/completions"):
                self._json(404, {"error": "not found"})
                return
            doc = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            prompt = doc.get("prompt", "")
            ids = self.server.engine_tokenize(prompt if isinstance(prompt, str) else prompt[0])
            req = Request(ids, int(doc.get("max_tokens", 16)))
            engine.waiting.put(req)
            created = int(time.time())
            if not doc.get("stream"):
                text = []
                while (piece := req.out.get()) is not None:
                    if isinstance(piece, Exception):
                        self._json(400, {"error": str(piece)})
                        return
                    text.append(piece)
                self._json(200, {"id": "cmpl", "object": "text_completion", "created": created,
                                 "model": alias, "choices": [{"index": 0, "text": "".join(text),
                                                              "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": len(ids),
                                           "completion_tokens": req.generated,
                                           "total_tokens": len(ids) + req.generated}})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

            def send(obj):
                self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
                self.wfile.flush()

            while (piece := req.out.get()) is not None:
                if isinstance(piece, Exception):
                    send({"error": str(piece)})
                    break
                send({"id": "cmpl", "object": "text_completion", "created": created,
                      "model": alias, "choices": [{"index": 0, "text": piece,
                                                   "finish_reason": None}]})
            send({"id": "cmpl", "object": "text_completion", "created": created, "model": alias,
                  "choices": [], "usage": {"prompt_tokens": len(ids),
                                           "completion_tokens": req.generated,
                                           "total_tokens": len(ids) + req.generated}})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler


def main():
    cfg = json.loads(sys.argv[1])
    engine = Engine(cfg)
    server = ThreadingHTTPServer((HOST, int(cfg["port"])),
                                 handler(engine, cfg.get("alias", "model")))
    lock = threading.Lock()

    def tokenize(text):
        with lock:  # the engine thread owns the context; tokenizing reads the vocab only
            return engine.tokenize(text)

    server.engine_tokenize = tokenize
    server.daemon_threads = True
    threading.Thread(target=engine.loop, daemon=True).start()
    print(f"serving on http://{HOST}:{cfg['port']} with {cfg.get('cache_type', 'f16')} cache "
          f"of {engine.n_ctx} cells for up to {engine.n_seq} sequences", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
