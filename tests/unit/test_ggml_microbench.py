"""llama.cpp kernel table: rows, ggml type ids, the per-machine cache, the missing-engine
refusal, and (where the engine is installed) one real timed row."""

from __future__ import annotations

import json

import pytest

from autoplan.engines import ggml_microbench as gm
from autoplan.backends.cpu.cost_cache import cached_table, row_key
from autoplan.engines import engine_status
from autoplan.errors import UserInputError
from autoplan.formats import Choice
from autoplan.modelspec import ModelSpec

_CFG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "tie_word_embeddings": True}
needs_engine = pytest.mark.skipif(not engine_status("llama.cpp").installed,
                                  reason="autoplan engines install llama.cpp")


def test_ggml_type_ids_match_gguf():
    gguf = pytest.importorskip("gguf")
    for precision, type_id in gm.GGML_TYPE_IDS.items():
        name = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}.get(precision.value,
                                                                   precision.value.upper())
        assert int(gguf.GGMLQuantizationType[name]) == type_id
        assert gm.ggml_type_id(str(Choice.parse(precision.value))) == type_id
    assert gm.ggml_type_id("gguf:Q4_K") == int(gguf.GGMLQuantizationType.Q4_K)
    with pytest.raises(UserInputError, match="q8_0"):
        gm.ggml_type_id("dense+int4a8_g32")


def test_decode_rows_are_one_per_layer_never_packed():
    spec = ModelSpec.from_config(_CFG, name="tiny")
    decisions = {layer.name: "dense+q4_1" for layer in spec.layers}
    decisions["lm_head"] = "gguf:Q6_K"
    rows = gm.decode_rows(spec, 1, decisions)
    assert len(rows) == len(spec.layers)
    assert (1, 32, 64, "dense+q4_1") in rows  # k_proj alone: 2 kv heads x 16
    assert rows[-1] == (1, 256, 64, "gguf:Q6_K")


def test_copies_exceed_the_rotation_bytes_within_limits():
    assert gm.copies_for(576, 576, 2) == gm.MAX_COPIES  # 187 KB of Q4_0: as many as allowed
    assert gm.copies_for(49152, 576, 0) == 1  # 113 MB of fp32: one copy streams already


def test_cached_table_times_only_missing_rows_and_refreshes_on_another_method(tmp_path):
    path = tmp_path / "t.json"
    timed = []

    def time_row(row):
        timed.append(row)
        m, n, k, choice = row
        return {"m": m, "n": n, "k": k, "choice": choice, "median_us": 1.0, "p10_us": 1.0,
                "p90_us": 1.0}

    header = {"schema_version": 1, "device": "x", "method": "a"}
    a, b = row_key(1, 8, 8, "q8_0"), (1, 8, 8, "gguf:Q4_K")  # a source-type row is kept too
    cached_table(path, header, [a], time_row, match=("method",))
    table = cached_table(path, header, [a, b, b], time_row, match=("method",))
    assert timed == [a, b] and len(table["rows"]) == 2
    cached_table(path, {**header, "method": "b"}, [a], time_row, match=("method",))
    assert timed == [a, b, a]
    assert json.loads(path.read_text())["method"] == "b"


def test_a_missing_engine_is_one_line_naming_the_install_command(monkeypatch, tmp_path):
    from autoplan.engines.llamacpp import GgmlWorker, LlamaCppWorker
    from autoplan.search import SearchRequest, run_search

    monkeypatch.setenv("AUTOPLAN_ENGINE_LLAMA_CPP_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(UserInputError, match="autoplan engines install llama.cpp") as err:
        GgmlWorker()
    assert "\n" not in str(err.value)
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF")
    with pytest.raises(UserInputError, match="autoplan engines install llama.cpp"):
        LlamaCppWorker(gguf_file)
    with pytest.raises(UserInputError, match="autoplan engines install llama.cpp"):
        run_search(SearchRequest(target="local", runtime="llama.cpp", out=tmp_path / "p.json"))


@needs_engine
def test_one_real_row_is_timed_by_ggml(tmp_path):
    table = gm.measure_rows([row_key(1, 64, 64, "q4_0")], threads=1, path=tmp_path / "t.json")
    (row,) = table["rows"]
    assert row["kernel"] == "ggml_mul_mat" and row["ggml_type"] == 2
    assert 0 < row["p10_us"] <= row["median_us"] <= row["p90_us"]
    assert table["runtime"] == "llama.cpp" and table["includes_dispatch"] is True
