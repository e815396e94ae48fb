"""Memory that follows the vocabulary: a small model with a large vocabulary (a 32 MiB fp32
embedding beside 0.2 MiB of blocks) is exported and benchmarked without copies of its
table, which for Gemma-3-270M's 262k vocabulary are 0.67 GB each."""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import pytest
import torch
from autoplan.backends.cpu.onnx_export import export_cpu_model
from autoplan.backends.cpu.onnx_graph import TIED_OP
from autoplan.backends.cpu.ort_runtime import OrtGenerator

from autoplan.bench import ort_side, shared_weights
from autoplan.errors import AutoplanError
from autoplan.formats import Choice

transformers = pytest.importorskip("transformers")
VOCAB = 131072
TABLE = VOCAB * 64 * 4  # fp32 bytes of the embedding (and of a tied lm_head)


@pytest.fixture(scope="module")
def big_vocab():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256,
        tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg).eval()


def _float_bytes(graph: onnx.GraphProto) -> int:
    return sum(int(np.prod(t.dims)) * 4 for t in graph.initializer
               if t.data_type == onnx.TensorProto.FLOAT)


def test_a_tied_lm_head_is_exported_once(big_vocab, tmp_path):
    """The fp32 export stores the table once; the logits read it transposed."""
    art = export_cpu_model(big_vocab, None, {}, tmp_path / "a")
    graph = onnx.load(str(art.model_path), load_external_data=False).graph
    head = next(n for n in graph.node if n.name == "lm_head")
    assert head.op_type == TIED_OP and head.input[1] == "model.embed_tokens.weight"
    assert TABLE < _float_bytes(graph) < 1.1 * TABLE
    assert TABLE < (art.path / "model.onnx.data").stat().st_size < 1.1 * TABLE
    assert sorted(p.name for p in art.path.iterdir()) == ["manifest.json", "model.onnx",
                                                          "model.onnx.data"]
    entry = art.manifest["layers"]["lm_head"]
    assert entry["choice"] == "dense+fp32" and entry["op_type"] == TIED_OP
    # the same greedy tokens as the model itself
    ids = np.array([[5, 17, 300, 9000]], np.int64)
    got = OrtGenerator(art.path, threads=1).generate(ids, 3).tokens
    with torch.inference_mode():
        want = big_vocab.generate(torch.from_numpy(ids), max_new_tokens=3, do_sample=False)
    assert got.tolist() == want[:, 4:].tolist()


def test_a_quantized_lm_head_gets_its_own_weight(big_vocab, tmp_path):
    art = export_cpu_model(big_vocab, None, {"lm_head": Choice.parse("int4_g32")},
                           tmp_path / "q")
    graph = onnx.load(str(art.model_path), load_external_data=False).graph
    assert next(n for n in graph.node if n.name == "lm_head").op_type == "MatMulNBits"
    assert art.manifest["layers"]["lm_head"]["op_type"] == "MatMulNBits"
    # the data file holds the graph's tensors only (the fp32 weight replaced is gone)
    assert (art.path / "model.onnx.data").stat().st_size < 1.3 * TABLE


def test_the_export_holds_no_copy_of_the_table(big_vocab, tmp_path):
    """Weights go to the data file as they are made: no proto, transposed or bytes copy of
    the table is held (before: the lm_head's transposed copies and each tensor's bytes)."""
    tracemalloc.start()
    try:
        export_cpu_model(big_vocab, None, {}, tmp_path / "a")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.7 * TABLE, f"{peak / 2**20:.1f} MiB traced for a {TABLE / 2**20:.0f} MiB table"


def test_the_bench_baseline_shares_the_weights_with_pytorch(tmp_path):
    """bench's fp32 baseline session and the PyTorch side compute from one copy of the
    weights (the shared session first: ORT's one-time start-up lands on it, not on the one
    it is compared to), and both still give the model's own tokens."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256,
        tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = np.array([[5, 17, 300, 9000]], np.int64)
    with torch.inference_mode():
        want = model.generate(torch.from_numpy(ids), max_new_tokens=3, do_sample=False)[:, 4:]
    art = export_cpu_model(model, None, {}, tmp_path / "a")
    table = model.get_input_embeddings().weight.data_ptr()
    weights = shared_weights(model, art)
    assert weights["model.embed_tokens.weight"].ctypes.data == table  # a view, not a copy
    qkv = weights["model.layers.0.self_attn.qkv_proj.weight_t"]  # packed q/k/v, [in, out]
    assert model.model.layers[0].self_attn.k_proj.weight.data_ptr() == qkv.ctypes.data + 4 * 64
    assert len(weights) == 1 + 2 * 4  # the table, then per block qkv, o, gate_up, down
    shared = ort_side("shared", art, threads=1, shared=weights)
    own = ort_side("own", art, threads=1)
    assert shared.rss_load < own.rss_load - TABLE // 2, (shared.rss_load, own.rss_load)
    assert shared.generator.generate(ids, 3).tokens.tolist() == want.tolist()
    assert own.generator.generate(ids, 3).tokens.tolist() == want.tolist()
    with torch.inference_mode():  # the PyTorch side, computing from the shared weights
        again = model.generate(torch.from_numpy(ids), max_new_tokens=3, do_sample=False)
    assert again[:, 4:].tolist() == want.tolist()
    with pytest.raises(AutoplanError, match="cannot share"):
        OrtGenerator(art.path, threads=1, shared={"model.embed_tokens.weight": np.zeros(
            (VOCAB, 32), np.float32)})


def test_a_vocabulary_wide_kernel_row_is_timed_from_files():
    """The lm_head's kernel row (bench's prediction times it) is built into files, not a
    ModelProto and its serialization: before, a 262k-vocabulary row held its 0.67 GB
    weight four times over (drawn, proto, serialized, session)."""
    from autoplan.backends.cpu import ort_microbench as OM

    copies = OM.copies_for(VOCAB, 64, Choice.parse("fp32"))  # 2: drawn, then rolled
    OM.time_row(1, 64, 64, "fp32", threads=1, repeats=2, warmup=1, flush_cache=False)  # imports
    tracemalloc.start()
    try:
        row = OM.time_row(1, VOCAB, 64, "fp32", threads=1, repeats=2, warmup=1,
                          flush_cache=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert row["kernel"] == "MatMul" and row["median_us"] > 0
    assert peak < (copies + 0.5) * TABLE, f"{peak / 2**20:.0f} MiB for {copies} x 32 MiB"


def test_the_bandwidth_probe_is_sized_by_the_cache():
    """bench's read-bandwidth buffer is resident on top of the model while it measures: 8x
    the last-level cache misses it as surely as a fixed 512 MiB did."""
    from autoplan.bench.system import last_level_cache_bytes, probe_bytes

    assert probe_bytes(32 * 2**20) == 256 * 2**20
    assert probe_bytes(2 * 2**20) == 64 * 2**20 and probe_bytes(1 << 30) == 512 * 2**20
    assert probe_bytes(None) == 512 * 2**20
    llc = last_level_cache_bytes()
    assert llc is None or llc >= 2**15


def test_a_row_over_the_build_limit_is_timed_in_column_slices(monkeypatch):
    """Over BUILD_BYTES a row is timed slice by slice, one session at a time, and the times
    summed: no session holds (and prepacks) the whole weight."""
    from autoplan.backends.cpu import ort_microbench as OM

    seen = []
    real = OM._row_session
    monkeypatch.setattr(OM, "BUILD_BYTES", TABLE // 3)
    monkeypatch.setattr(OM, "_row_session", lambda m, n, *a: seen.append(n) or real(m, n, *a))
    row = OM.time_row(1, VOCAB, 64, "fp32", threads=1, repeats=2, warmup=1, flush_cache=False)
    assert row["slices"] == 4 and sum(seen) == VOCAB and max(seen) * 64 * 4 <= TABLE // 3
    assert row["n"] == VOCAB and row["median_us"] > 0
    assert "slices" not in OM.time_row(1, 256, 64, "fp32", threads=1, repeats=2, warmup=1,
                                       flush_cache=False)
