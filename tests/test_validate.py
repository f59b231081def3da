"""pdsim validate on small fixture files written here (one per input format), rows counted by reason."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from pdsim.__main__ import main
from pdsim.costmodel import RooflineCost
from pdsim.devices import get_device
from pdsim.engines import PRESETS
from pdsim.models import get_model
from pdsim.validate import read_measured, validate

COLS = ["id", "silicon_data_source", "backend", "backend_version", "model_path", "system", "precision", "mode",
        "isl", "osl", "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size",
        "silicon_ttft_ms", "silicon_tpot_ms"]


def _silicon(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLS)
        w.writeheader()
        for r in rows:
            base = {"id": "x", "silicon_data_source": "made-up; silicon_concurrency=1", "backend": "trtllm",
                    "backend_version": "1.0.0", "model_path": "meta-llama/Llama-3.1-8B-Instruct",
                    "system": "h100_sxm", "precision": "", "mode": "agg", "isl": 128, "osl": 9,
                    "gemm_quant_mode": "", "moe_quant_mode": "", "batch_size": 1, "tp_size": 1, "pp_size": 1,
                    "attention_dp_size": 1, "silicon_ttft_ms": 30.0, "silicon_tpot_ms": 5.0}
            w.writerow({**base, **r})
    return path


BAD = [({"id": "moe", "model_path": "deepseek-ai/DeepSeek-V3"}, "moe_model"),
       ({"id": "b200", "system": "b200_sxm"}, "unknown_gpu"),
       ({"id": "fp4", "precision": "fp4", "gemm_quant_mode": "nvfp4"}, "unsupported_precision"),
       ({"id": "pd", "mode": "disagg"}, "disaggregated_row"),
       ({"id": "nottft", "silicon_ttft_ms": ""}, "missing_measurement"),
       ({"id": "adp", "attention_dp_size": 4}, "attention_data_parallel"),
       ({"id": "who", "model_path": "acme/NoSuchModel-3B"}, "unknown_model")]


def _lone_trtllm_ms():
    """Hand-composed expectation for one client: the roofline step times plus TRT-LLM's preset overhead
    (base + per_seq x 1) in place of the device's flat overhead; decode step k reads 128 + k tokens."""
    p = PRESETS["trtllm"]
    dev = get_device("h100-sxm")
    cm = RooflineCost(get_model("llama-3.1-8b"), dev, 1)
    extra = (p.overhead_base_us + p.overhead_per_seq_us) * 1e-6 - dev.step_overhead_s
    ttft = cm.prefill_time(128) + extra
    decode = [cm.step(1, 128.0 + k - 1, 128 + k, 1, 1).time_s + extra for k in range(1, 9)]
    return ttft * 1e3, float(np.mean(decode)) * 1e3 * 8 / 8


def test_silicon_rows_become_closed_loop_runs_and_bad_rows_are_counted(tmp_path):
    path = _silicon(tmp_path / "silicon.csv", [{"id": "ok"}] + [r for r, _ in BAD])
    rows = read_measured(path)
    assert [why.split(":")[0] if why else None for _, why in rows] == [None] + [w for _, w in BAD]
    res = validate(rows)
    assert res["counts"]["simulated"] == 1
    assert res["counts"]["skipped_by_reason"] == {w: 1 for _, w in BAD}
    (row,) = res["rows"]
    assert (row["model"], row["device"], row["engine"], row["tp"], row["isl"], row["osl"], row["concurrency"]) == \
        ("llama-3.1-8b", "h100-sxm", "trtllm", 1, 128, 9, 1)
    ttft_ms, tpot_ms = _lone_trtllm_ms()
    # one client: every request runs alone, 16 of them back to back
    assert row["sim_ttft_ms"] == pytest.approx(ttft_ms, rel=1e-9)
    assert row["sim_tpot_ms"] == pytest.approx(tpot_ms, rel=1e-9)
    assert row["ttft_ape"] == pytest.approx(abs(ttft_ms - 30) / 30 * 100, rel=1e-9)
    assert row["tpot_ape"] == pytest.approx(abs(tpot_ms - 5) / 5 * 100, rel=1e-9)
    (g,) = res["groups"]
    assert g["rows"] == 1 and g["ttft_mape"] == pytest.approx(row["ttft_ape"])


def test_group_mape_is_the_mean_of_its_rows(tmp_path):
    path = _silicon(tmp_path / "s.csv", [{"id": "a", "silicon_ttft_ms": 10.0}, {"id": "b", "silicon_ttft_ms": 40.0}])
    res = validate(read_measured(path))
    a, b = res["rows"]
    assert a["sim_ttft_ms"] == pytest.approx(b["sim_ttft_ms"])       # same run, different measurements
    s = a["sim_ttft_ms"]
    assert res["groups"][0]["ttft_mape"] == pytest.approx((abs(s - 10) / 10 + abs(s - 40) / 40) * 50)


def test_vllm_bench_serve_json(tmp_path):
    p = tmp_path / "vllm.json"
    p.write_text(json.dumps({"backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct", "max_concurrency": 1,
                             "completed": 4, "total_input_tokens": 512, "total_output_tokens": 36,
                             "mean_ttft_ms": 20.0, "mean_tpot_ms": 6.0, "output_throughput": 100.0,
                             "gpu": "h100_sxm", "tp": 1}))
    (r, why), = read_measured(p, {"engine": "trtllm"})
    assert why is None
    assert (r["isl"], r["osl"], r["concurrency"], r["tp"], r["device"], r["engine"]) == \
        (128, 9, 1, 1, "h100-sxm", "trtllm")
    assert (r["ttft_ms"], r["tpot_ms"], r["throughput_tok_s"]) == (20.0, 6.0, 100.0)
    res = validate([(r, why)])
    assert res["rows"][0]["sim_ttft_ms"] == pytest.approx(_lone_trtllm_ms()[0], rel=1e-9)
    assert res["rows"][0]["throughput_ape"] is not None
    # without GPU and TP it cannot be simulated: counted, not dropped
    p.write_text(json.dumps({"model_id": "meta-llama/Llama-3.1-8B-Instruct", "max_concurrency": 1, "completed": 1,
                             "total_input_tokens": 128, "total_output_tokens": 9, "mean_ttft_ms": 20.0,
                             "mean_tpot_ms": 6.0}))
    assert [w for _, w in read_measured(p)] == ["unknown_gpu"]


def test_genai_perf_json(tmp_path):
    p = tmp_path / "profile_export_genai_perf.json"
    p.write_text(json.dumps({
        "time_to_first_token": {"unit": "ms", "avg": 25.0}, "inter_token_latency": {"unit": "ms", "avg": 7.0},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 90.0},
        "input_sequence_length": {"avg": 128.0}, "output_sequence_length": {"avg": 9.0},
        "input_config": {"model": ["meta-llama/Llama-3.1-8B-Instruct"],
                         "perf_analyzer": {"stimulus": {"concurrency": 2}}}}))
    (r, why), = read_measured(p, {"device": "h100-sxm", "tp": 1, "engine": "vllm-v1"})
    assert why is None
    assert (r["isl"], r["osl"], r["concurrency"], r["engine"], r["ttft_ms"], r["tpot_ms"]) == \
        (128, 9, 2, "vllm-v1", 25.0, 7.0)


def test_cli_writes_table_and_exit_codes(tmp_path, capsys):
    good = _silicon(tmp_path / "good.csv", [{"id": "ok"}, {"id": "moe", "model_path": "deepseek-ai/DeepSeek-R1"}])
    out = tmp_path / "out"
    assert main(["validate", str(good), "--out", str(out), "--quiet"]) == 0
    with open(out / "validate.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["id"] for r in rows] == ["ok"] and float(rows[0]["sim_ttft_ms"]) > 0
    with open(out / "skipped.csv") as f:
        assert [(r["id"], r["reason"]) for r in csv.DictReader(f)] == [("moe", "moe_model: deepseek-ai/DeepSeek-R1")]
    summary = json.loads((out / "validate.json").read_text())
    assert summary["counts"]["skipped_by_reason"] == {"moe_model": 1}
    assert "TTFT MAPE" in (out / "validate.html").read_text()
    # nothing usable: exit 1; an unknown format: one-line error, exit 2
    bad = _silicon(tmp_path / "bad.csv", [{"id": "moe", "model_path": "deepseek-ai/DeepSeek-R1"}])
    assert main(["validate", str(bad), "--out", str(tmp_path / "o2"), "--quiet"]) == 1
    junk = tmp_path / "junk.txt"
    junk.write_text("hello\n")
    capsys.readouterr()
    assert main(["validate", str(junk), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "junk.txt" in err and "unknown format" in err and "\n" not in err


def test_fit_step_overhead_recovers_a_known_residual():
    from pdsim.validate import fit_step_overhead
    p = PRESETS["vllm-v1"]
    # measured TPOT exceeds simulated by exactly 100 us + 5 us per concurrent request
    rows = [{"engine": "vllm-v1", "concurrency": c, "sim_tpot_ms": 10.0 + c / 10,
             "tpot_ms": 10.0 + c / 10 + (100 + 5 * c) / 1e3} for c in (1, 4, 16, 64)]
    got = fit_step_overhead(rows)["vllm-v1"]
    assert got["base_us"] == pytest.approx(p.overhead_base_us + 100, abs=0.1)
    assert got["per_seq_us"] == pytest.approx(p.overhead_per_seq_us + 5, abs=0.01)
    # a simulation already slower than measured cannot get a negative overhead
    rows = [{**r, "tpot_ms": r["sim_tpot_ms"] / 2} for r in rows]
    assert fit_step_overhead(rows)["vllm-v1"] == {"base_us": 0.0, "per_seq_us": 0.0}
