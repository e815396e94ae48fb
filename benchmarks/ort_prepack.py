"""ONNX Runtime fp32 MatMul with and without weight prepacking, side by side: what
`autoplan bench --share-weights` costs its fp32 baseline (a weight shared with the PyTorch
side cannot be prepacked).

SmolLM2-135M's three GEMM shapes ([k, n] = 576x1536, 1536x576 and the 576x49,152 lm_head)
at 1 row (decode) and 128 rows (prefill), one intra-op thread, the two sessions' calls
interleaved in rounds of 10; per side the third-lowest round (a loaded machine only adds
time).

    python benchmarks/ort_prepack.py [--rounds 15] -> benchmarks/results/ort_prepack.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import start_run, write_result  # noqa: E402

SHAPES = ((576, 1536), (1536, 576), (576, 49152))
ROWS = (1, 128)


def _model(k: int, n: int, seed: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(weight, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default="benchmarks/results/ort_prepack.json")
    args = ap.parse_args(argv)
    info, command = start_run(0, argv)
    import onnxruntime as ort

    rows = []
    for k, n in SHAPES:
        model = _model(k, n, seed=k + n)
        sessions = {}
        for side in ("prepacked", "unprepacked"):
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            if side == "unprepacked":
                opts.add_session_config_entry("session.disable_prepacking", "1")
            sessions[side] = ort.InferenceSession(model, opts,
                                                  providers=["CPUExecutionProvider"])
        for m in ROWS:
            x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
            times: dict[str, list[float]] = {side: [] for side in sessions}
            loads = []
            for _ in range(args.rounds):
                loads.append(os.getloadavg()[0])
                for side, sess in sessions.items():
                    t0 = time.perf_counter()
                    for _ in range(10):
                        sess.run(None, {"x": x})
                    times[side].append((time.perf_counter() - t0) / 10 * 1e6)
            us = {side: sorted(t)[min(2, len(t) - 1)] for side, t in times.items()}
            rows.append({"k": k, "n": n, "rows": m, "prepacked_us": us["prepacked"],
                         "unprepacked_us": us["unprepacked"],
                         "unprepacked_over_prepacked": us["unprepacked"] / us["prepacked"],
                         "load_avg_1m": [min(loads), max(loads)]})
            print(f"{k}x{n} rows={m}: prepacked {us['prepacked']:.0f} us, unprepacked "
                  f"{us['unprepacked']:.0f} us, ratio {rows[-1]['unprepacked_over_prepacked']:.2f}",
                  flush=True)
    write_result(args.out, {"machine": info, "command": command, "onnxruntime": ort.__version__,
                            "statistic": "third-lowest of --rounds rounds of 10 calls",
                            "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
