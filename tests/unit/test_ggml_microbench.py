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
        name = {"fp32": "F32", "fp16": "F16", "bf16": "BF16", "gguf_mxfp4": "MXFP4"}.get(
            precision.value, precision.value.upper())
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


def test_cached_table_times_missing_rows_with_their_shape_and_refreshes_on_another_method(
        tmp_path):
    path = tmp_path / "t.json"
    timed = []

    def time_row(row):
        timed.append(row)
        m, n, k, choice = row
        return {"m": m, "n": n, "k": k, "choice": choice, "median_us": 1.0, "p10_us": 1.0,
                "p90_us": 1.0}

    header = {"schema_version": 1, "device": "x", "method": "a"}
    a, b = row_key(1, 8, 8, "q8_0"), (1, 8, 8, "gguf:Q4_K")  # a source-type row is kept too
    c = row_key(1, 16, 8, "q8_0")
    cached_table(path, header, [a, c], time_row, match=("method",))
    table = cached_table(path, header, [a, b, b, c], time_row, match=("method",))
    # b joins a's shape: a is timed again with it (one session per shape), c is not
    assert timed == [a, c, a, b] and len(table["rows"]) == 3
    cached_table(path, header, [a, b, c], time_row, match=("method",))
    assert timed == [a, c, a, b]  # nothing missing: nothing timed
    cached_table(path, {**header, "method": "b"}, [a], time_row, match=("method",))
    assert timed == [a, c, a, b, a]
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


# A loaded 2-core machine, as the v1 table saw it (576x576 Q4_1, m=1): ggml's threads spin at
# every barrier, so a run that loses a core waits a scheduler slice; most runs did.
_QUIET, _SLICE = 24.0, 3000.0


def _contended(n_trials: int, quiet: set[int], seed: int = 0) -> list[list[float]]:
    """Trials of 5 runs: the `quiet` trials ran on an idle machine (+5 %), the others had 4
    of 5 runs preempted (a scheduler slice or more added)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    trials = []
    for t in range(n_trials):
        quiet_t = t in quiet
        runs = [_QUIET * rng.uniform(1.0, 1.05) + (0.0 if quiet_t or i == 0 else
                                                    _SLICE * rng.uniform(0.5, 6.0))
                for i in range(5)]
        trials.append(runs)
    return trials


def test_the_kernel_time_is_the_uncontended_one_under_load():
    import statistics

    trials = _contended(12, quiet={0, 3, 4, 7})
    runs = [x for t in trials for x in t]
    assert statistics.median(runs) > 20 * _QUIET  # v1's statistic: 100s of us, not 24
    timing = gm.quiet_time(trials)
    assert _QUIET <= timing["median_us"] <= 1.05 * _QUIET
    lo, hi = timing["halves_us"]
    assert timing["median_us"] <= lo and hi <= 1.05 * _QUIET and gm.repeatable(timing)
    assert timing["trials"] == 12 and timing["p90_us"] > 20 * _QUIET  # the load stays visible


def test_a_lucky_run_or_trial_does_not_set_the_time_and_a_quiet_half_alone_is_refused():
    # every trial has one unpreempted run: that is not a quiet trial
    assert gm.quiet_time(_contended(8, quiet=set()))["median_us"] > 10 * _QUIET
    # one quiet (or lucky) trial does not set the time either
    assert gm.quiet_time(_contended(8, quiet={5}))["median_us"] > 10 * _QUIET
    # two quiet trials, both odd: the even half never saw one, the halves disagree
    timing = gm.quiet_time(_contended(8, quiet={1, 5}))
    assert timing["median_us"] < 1.05 * _QUIET
    assert not gm.repeatable(timing) and timing["spread"] > gm.SPREAD_BOUND
    with pytest.raises(ValueError):
        gm.quiet_time([[1.0, 2.0]] * 3)


def test_an_unrepeatable_row_is_refused_in_one_line_naming_the_fix(monkeypatch, tmp_path):
    class Worker:
        def __init__(self, threads=None):
            self.n = {}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def build(self, m, n, k, ggml_type, copies=1):
            return {"id": n, "copies": copies, "once_us": 10.0}

        def trial(self, graph_id, runs, flush_bytes=0, clock="wall"):
            self.n[graph_id] = self.n.get(graph_id, 0) + 1
            if graph_id == 64:  # repeatable: the same every trial
                return [10.0] * runs
            return [10.0 * (1 + self.n[graph_id] % 2)] * runs  # odd trials 2x even ones

        def drop(self, graph_id):
            pass

    import autoplan.engines.llamacpp as L

    monkeypatch.setattr(L, "GgmlWorker", Worker)
    monkeypatch.setattr(gm, "empty_table", lambda threads=None: {
        "schema_version": 1, "runtime": "llama.cpp", "threads": 2, "llama_cpp_python": "x",
        "method": gm.METHOD})
    path = tmp_path / "t.json"
    good, bad = row_key(1, 64, 64, "q4_0"), row_key(1, 32, 64, "q4_0")
    with pytest.raises(UserInputError, match="rerun on a quieter machine or with fewer "
                                             "threads") as err:
        gm.measure_rows([good, bad], threads=2, path=path)
    assert "\n" not in str(err.value)
    kept = json.loads(path.read_text())["rows"]  # the repeatable row is kept
    assert [(r["n"], r["trials"]) for r in kept] == [(64, gm.TRIALS)]


def test_an_older_table_is_measured_again(tmp_path, monkeypatch):
    assert gm.METHOD.endswith("/v3") and "quiet-trial-median" in gm.METHOD
    header = {"schema_version": 1, "runtime": "llama.cpp", "threads": 2,
              "llama_cpp_python": "x", "method": gm.METHOD}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({**header, "method": "ggml-backend-cpu+no-extra-bufts+"
                                "rotate-copies+flush-96MB/v1", "rows": [
                                    {"m": 1, "n": 8, "k": 8, "choice": "dense+q4_0",
                                     "median_us": 3000.0, "p10_us": 24.0, "p90_us": 9000.0}]}))
    timed = []

    def time_rows(rows):
        for m, n, k, choice in rows:
            timed.append((m, n, k, choice))
            yield {"m": m, "n": n, "k": k, "choice": choice, "median_us": 24.0,
                   "p10_us": 24.0, "p90_us": 30.0}

    table = cached_table(path, header, [row_key(1, 8, 8, "q4_0")], None,
                         match=("runtime", "threads", "llama_cpp_python", "method"),
                         time_rows=time_rows)
    assert timed and table["rows"][0]["median_us"] == 24.0


def test_the_uncertainty_of_a_ggml_table_is_its_halves_spread():
    from autoplan.search.preparation import kernel_spread

    row = {"median_us": 100.0, "p10_us": 90.0, "p90_us": 5000.0, "halves_us": [100.0, 110.0]}
    assert kernel_spread({"rows": [row]}) == (0.05, 1)
    assert kernel_spread({"rows": [{k: v for k, v in row.items() if k != "halves_us"}]})[0] \
        == pytest.approx(24.55)


@needs_engine
def test_one_real_row_is_timed_by_ggml(tmp_path):
    table = gm.measure_rows([row_key(1, 64, 64, "q4_0")], threads=1, path=tmp_path / "t.json")
    (row,) = table["rows"]
    assert row["kernel"] == "ggml_mul_mat" and row["ggml_type"] == 2
    assert 0 < row["median_us"] <= row["halves_us"][0] <= row["halves_us"][1]
    assert row["trials"] >= gm.TRIALS and gm.repeatable(row)
    assert table["runtime"] == "llama.cpp" and table["includes_dispatch"] is True


def test_a_layer_the_source_gguf_lacks_is_refused_not_priced_as_another(tmp_path, monkeypatch):
    """Only an lm_head may run another tensor (the token embedding, as llama.cpp ties them
    when the file has no ``output.weight``); any other layer missing from the file is an
    error naming the fix."""
    from autoplan.errors import AutoplanError
    from autoplan.models import gguf_convert
    from tests.unit.test_gguf_gptoss_export import gptoss_source

    loaded, _ = gptoss_source(tmp_path)
    names = gguf_convert.hf_to_gguf_names(loaded.model, loaded.spec.n_layers)
    assert gm.source_decisions(loaded)  # the file as written: every layer found
    lost = "model.layers.0.self_attn.q_proj.weight"
    monkeypatch.setattr(gguf_convert, "hf_to_gguf_names",
                        lambda *a: {k: v for k, v in names.items() if k != lost})
    with pytest.raises(AutoplanError, match=r"no tensor for model\.layers\.0\.self_attn\.q_proj"
                                            r" .*convert_hf_to_gguf"):
        gm.source_decisions(loaded)


def test_the_source_embedding_is_read_as_the_file_stores_it(tmp_path):
    """A GGUF export copies token_embd: the search's table says how it is stored."""
    from autoplan.models.gguf_read import gguf_reader
    from tests.unit.test_gguf_gptoss_export import gptoss_source

    loaded, _ = gptoss_source(tmp_path)
    embd = next(t for t in gguf_reader(loaded.source.path).tensors
                if t.name == "token_embd.weight")
    got = gm.source_embedding(loaded)
    assert got["ggml_type"] == embd.tensor_type.name
    assert got["bits"] * embd.n_elements == pytest.approx(8 * embd.n_bytes)
    assert got["choice"] == f"dense+{got['ggml_type'].lower()}"


def test_memory_counts_the_kept_embedding_once_when_lm_head_is_tied_to_it():
    """SmolLM2's GGUF stores its tied embedding Q8_0: an export whose lm_head is Q8_0 holds
    one Q8_0 tensor for both (not an fp32 embedding beside a Q8_0 lm_head); another lm_head
    type is a tensor of its own beside the Q8_0 embedding."""
    from autoplan.cost import CostModel, resolve_config
    from autoplan.formats import Choice
    from autoplan.targets import get_target
    from autoplan.workload import Workload

    spec = resolve_config("smollm2-135m")
    assert spec.tie_embeddings
    kept = {"rows": [], "embedding": {"ggml_type": "Q8_0", "bits": 8.5, "choice": "dense+q8_0"}}
    fp32 = Choice.parse("fp32")

    def weights(lm_head: str, measured: dict | None = None) -> float:
        cm = CostModel(spec, get_target("xeon-8480"), Workload(batch=1), baseline=fp32,
                       measured=measured)
        choices = tuple(Choice.parse(lm_head) if la.role == "lm_head" else Choice.parse("q8_0")
                        for la in spec.layers)
        return cm.memory(choices).weights_bytes

    embedding = spec.embedding_params
    assert weights("q8_0") - weights("q8_0", kept) == pytest.approx(embedding * 4)  # fp32 gone
    assert weights("q4_0", kept) - weights("q8_0", kept) == pytest.approx(embedding * 4.5 / 8)
    assert weights("fp32") == weights("fp32", {"rows": []})  # tied to the fp32 baseline


@pytest.mark.parametrize("embedding", [8.5, {"bits": True}, {"bits": -1}, {"bits": "x"}])
def test_a_malformed_embedding_entry_is_one_line(embedding):
    from autoplan.cost.measured import MeasuredTable
    from autoplan.errors import UserInputError

    with pytest.raises(UserInputError, match="embedding"):
        MeasuredTable.from_document({"rows": [], "embedding": embedding})


def test_estimate_on_llama_cpp_counts_the_embedding_the_gguf_keeps():
    """The embedded SmolLM2 GGUF stores its tied embedding Q8_0, which autoplan's GGUF exports
    keep: estimate's Q8_0 weights on llama.cpp count it once, as the tied lm_head, at 8.5 bits
    (the exported file: 0.145 GB), not a bf16 embedding beside a Q8_0 lm_head."""
    import json

    from click.testing import CliRunner

    from autoplan.cli import cli
    from autoplan.cost import resolve_config

    spec = resolve_config("smollm2-135m")
    out = CliRunner().invoke(cli, ["estimate", "--model", "smollm2-135m", "--target", "xeon-8480",
                                   "--runtime", "llama.cpp", "--precision", "q8_0", "--json"])
    assert out.exit_code == 0, out.output
    linear = sum(layer.params for layer in spec.layers)
    norms = (2 * spec.n_layers + 1) * spec.hidden * 2  # bf16, the estimate's baseline
    weights = json.loads(out.stdout)["candidate"]["memory"]["weights_bytes"]
    assert weights == pytest.approx(linear * 8.5 / 8 + norms)
