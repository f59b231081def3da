"""pdsim validate on small fixture files written here (one per input format), rows counted by reason."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from pdsim.__main__ import main
from pdsim.costmodel import RooflineCost
from pdsim.devices import get_device
from pdsim.engines import PRESETS
from pdsim.models import get_model
from pdsim.errors import ConfigError
from pdsim.validate import read_measured, validate

COLS = ["id", "silicon_data_source", "backend", "backend_version", "model_path", "system", "precision", "mode",
        "isl", "osl", "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size",
        "moe_tp_size", "moe_ep_size", "silicon_ttft_ms", "silicon_tpot_ms"]


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


BAD = [({"id": "moe", "model_path": "MiniMaxAI/MiniMax-M2"}, "moe_model"),
       ({"id": "gb300", "system": "gb300"}, "unknown_gpu"),
       ({"id": "int4", "precision": "int4", "gemm_quant_mode": "int4_wo"}, "unsupported_precision"),
       ({"id": "pd", "mode": "disagg"}, "disaggregated_row"),
       ({"id": "nottft", "silicon_ttft_ms": ""}, "missing_measurement"),
       ({"id": "adp", "attention_dp_size": 4}, "attention_data_parallel"),
       ({"id": "who", "model_path": "acme/NoSuchModel-3B"}, "unknown_model")]


def _lone_trtllm_ms():
    """Hand-composed expectation for one client: the roofline step times plus TRT-LLM's preset overhead
    (base + per_seq x 1) in place of the device's flat overhead; decode step k reads 128 + k tokens; the
    first token also waits for the preset's front end (0 in every preset today; engines.frontend_latency_s)."""
    p = PRESETS["trtllm"]
    dev = get_device("h100-sxm")
    cm = RooflineCost(get_model("llama-3.1-8b"), dev, 1)
    extra = (p.overhead_base_us + p.overhead_per_seq_us) * 1e-6 - dev.step_overhead_s
    ttft = cm.prefill_time(128) + extra + cm.model.layers * p.frontend_per_layer_us * 1e-6
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
    good = _silicon(tmp_path / "good.csv", [{"id": "ok"}, {"id": "moe", "model_path": "moonshotai/Kimi-K2-Instruct"}])
    out = tmp_path / "out"
    assert main(["validate", str(good), "--out", str(out), "--quiet"]) == 0
    with open(out / "validate.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["id"] for r in rows] == ["ok"] and float(rows[0]["sim_ttft_ms"]) > 0
    with open(out / "skipped.csv") as f:
        assert [(r["id"], r["reason"]) for r in csv.DictReader(f)] == [("moe", "moe_model: moonshotai/Kimi-K2-Instruct")]
    summary = json.loads((out / "validate.json").read_text())
    assert summary["counts"]["skipped_by_reason"] == {"moe_model": 1}
    assert "TTFT MAPE" in (out / "validate.html").read_text()
    # the group's measured / simulated ratios (one row: its own, to 2 decimals), printed: a margin to plan with
    (g,) = summary["groups"]
    for m in ("ttft", "tpot"):
        ratio = math.ceil(round(float(rows[0][f"{m}_ms"]) / float(rows[0][f"sim_{m}_ms"]) * 100, 9)) / 100   # rounded up
        assert g[f"{m}_measured_over_sim_p90"] == g[f"{m}_measured_over_sim_median"] == ratio
    printed = capsys.readouterr().out
    assert f"measured/simulated p90 TTFT {g['ttft_measured_over_sim_p90']:.3g}x  TPOT " in printed
    # nothing usable: exit 1; an unknown format: one-line error, exit 2
    bad = _silicon(tmp_path / "bad.csv", [{"id": "moe", "model_path": "moonshotai/Kimi-K2-Instruct"}])
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


# --- harness, range ratio, profiles, error bands (validate2) ------------------------------------------
def test_inferencemax_rows_get_its_length_range_and_others_stay_fixed(tmp_path):
    from pdsim.validate import silicon_harness
    # InferenceMAX's published client: --random-range-ratio 0.8 on the (1024,1024)/(1024,8192)/(8192,1024) grid
    assert silicon_harness("source_file=2026-04-06.csv; silicon_concurrency=4", 1024, 8192) == ("inferencemax", 0.8)
    assert silicon_harness("source_file=/x/aic-auto-gap-analysis/data/h100_sxm/vllm/q.csv", 1024, 1024) == \
        ("unknown", 1.0)
    assert silicon_harness("source_file=2026-04-06.csv", 1024, 128) == ("unknown", 1.0)
    path = _silicon(tmp_path / "s.csv", [{"id": "imax", "isl": 1024, "osl": 1024,
                                         "silicon_data_source": "source_file=2026-04-06.csv; silicon_concurrency=4"},
                                        {"id": "fixed", "isl": 1024, "osl": 1024,
                                         "silicon_data_source": "x/aic-auto-gap-analysis/y; silicon_concurrency=4"}])
    (a, _), (b, _) = read_measured(path)
    assert (a["harness"], a["length_ratio"], b["harness"], b["length_ratio"]) == ("inferencemax", 0.8, "unknown", 1.0)


def test_range_ratio_draws_lengths_as_the_benchmark_does_and_apes_follow_by_hand(tmp_path):
    """Linear cost (per_token_s per token, no overhead), one client: each prefill step takes
    per_token x prompt tokens and each decode step per_token, so the mean TTFT is per_token x the
    mean prompt, (819 + 1024) / 2 = 921.5 tokens for uniform integers in [int(1024 x 0.8), 1024],
    and TPOT is exactly per_token.  APEs against measured 100 ms / 0.1 ms by hand."""
    from pdsim.simulation import simulate
    from pdsim.validate import row_scenario, simulate_row
    per_token = 1e-4
    path = _silicon(tmp_path / "s.csv", [{"id": "imax", "isl": 1024, "osl": 64, "silicon_ttft_ms": 100.0,
                                         "silicon_tpot_ms": 0.1}])
    (r0, why), = read_measured(path)
    assert r0["length_ratio"] == 1.0                    # off the InferenceMAX grid: fixed lengths by default
    r = {**r0, "length_ratio": 0.8}
    cost = {"kind": "linear", "per_token_s": per_token}
    reqs = simulate(row_scenario(r, requests_per_client=400, cost_model=cost))[0].requests
    prompts = np.array([q.prompt_tokens for q in reqs])
    outputs = np.array([q.output_tokens for q in reqs])
    assert prompts.min() >= 819 and prompts.max() <= 1024 and prompts.min() < 830 and prompts.max() > 1015
    assert outputs.min() >= 51 and outputs.max() <= 64        # int(64 x 0.8) = 51
    sim = simulate_row(r, requests_per_client=400, cost_model=cost)
    assert sim["sim_ttft_ms"] == pytest.approx(per_token * 921.5 * 1e3, rel=0.015)
    assert sim["sim_tpot_ms"] == pytest.approx(per_token * 1e3, rel=1e-9)
    res = validate([(r0, why)], length_ratio=0.8)        # roofline: only the bookkeeping is checked here
    assert res["rows"][0]["length_ratio"] == 0.8 and res["rows"][0]["harness"] == "unknown"   # off the grid
    # the APE arithmetic on the linear run, by hand: |92.15 - 100| / 100 and |0.1 - 0.1| / 0.1
    from pdsim.validate import _ape
    assert _ape(per_token * 921.5 * 1e3, 100.0) == pytest.approx(7.85)
    assert _ape(sim["sim_tpot_ms"], 0.1) == pytest.approx(0.0, abs=1e-6)


def test_a_profile_replaces_the_datasheet_preset_of_its_gpu(tmp_path):
    """A copy of the H100 preset with 2 ms more flat step overhead: with no engine preset (the device's
    flat overhead counts), a lone request's TTFT (one prefill step) and TPOT (one decode step per
    token) grow by exactly 2 ms; rows on other GPUs keep their preset."""
    import yaml
    from pdsim.devices import DATA_DIR
    from pdsim.validate import parse_profiles
    raw = yaml.safe_load((DATA_DIR / "h100-sxm.yaml").read_text())
    raw["efficiency"]["step_overhead_us"] += 2000
    raw["name"] = "h100_sxm-slow"
    prof = tmp_path / "h100_sxm-slow.yaml"
    prof.write_text(yaml.safe_dump(raw))
    path = _silicon(tmp_path / "s.csv", [{"id": "h100"}])
    rows = read_measured(path)
    base = validate(rows, engine_presets=False)["rows"][0]
    slow = validate(rows, engine_presets=False, profiles={"h100-sxm": str(prof)})["rows"][0]
    assert (base["cost"], slow["cost"]) == ("datasheet", "h100_sxm-slow")
    assert slow["sim_ttft_ms"] - base["sim_ttft_ms"] == pytest.approx(2.0, abs=1e-6)
    assert slow["sim_tpot_ms"] - base["sim_tpot_ms"] == pytest.approx(2.0, abs=1e-6)
    assert slow["ttft_ape"] == pytest.approx(abs(slow["sim_ttft_ms"] - 30) / 30 * 100)
    # --profiles: a folder or glob, one file per GPU by its name; two candidates for a GPU in use: one line
    assert parse_profiles(None, str(tmp_path)) == {"h100-sxm": str(prof)}
    assert parse_profiles([f"h200={prof}"], None) == {"h200": str(prof)}
    (tmp_path / "h100-other.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="2 profiles for h100-sxm"):
        parse_profiles(None, str(tmp_path), {"h100-sxm"})
    assert parse_profiles(None, str(tmp_path), {"h200"})["h100-sxm"]       # not in use: no error
    with pytest.raises(ConfigError, match="DEVICE=PATH"):
        parse_profiles(["h100-sxm"], None)
    # the CLI: --profile DEVICE=PATH reaches the simulation (validate.csv names the profile); a bad ratio is one line
    out = tmp_path / "out"
    assert main(["validate", str(path), "--no-engine", "--profile", f"h100_sxm={prof}", "--out", str(out),
                 "--quiet"]) == 0
    with open(out / "validate.csv") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["cost"] == "h100_sxm-slow" and float(row["sim_ttft_ms"]) == pytest.approx(slow["sim_ttft_ms"])
    assert main(["validate", str(path), "--range-ratio", "1.5", "--quiet"]) == 2


def test_error_band_per_engine_gpu_and_profile(tmp_path, monkeypatch):
    import pdsim.validate as V
    table = {"source": "test", "bands": {"vllm-v1|h200": {"ttft_mape_pct": 11.0, "tpot_mape_pct": 5.0, "rows": 3},
                                         "none|h200": {"ttft_mape_pct": 99.0, "tpot_mape_pct": 9.0, "rows": 3},
                                         "trtllm|h200_sxm-trtllm-aic": {"ttft_mape_pct": 22.0, "tpot_mape_pct": 7.0,
                                                                        "rows": 4}}}
    f = tmp_path / "bands.json"
    f.write_text(json.dumps(table))
    monkeypatch.setattr(V, "ERROR_TABLE", f)
    assert V.error_band("vllm-v1", "h200")["ttft_mape_pct"] == 11.0
    assert V.error_band(None, "h200")["ttft_mape_pct"] == 99.0
    assert V.error_band("trtllm", "calibration/profiles/h200_sxm-trtllm-aic.yaml")["tpot_mape_pct"] == 7.0
    assert V.error_band("trtllm", "h200") == "unvalidated"
    assert V.error_band("vllm-v0", "a100-80gb-sxm") == "unvalidated"
    # an MoE model never gets a dense band: its own from moe_bands, else unvalidated for MoE models
    assert V.error_band("vllm-v1", "h200", moe=True).startswith("unvalidated for MoE models")
    table["moe_bands"] = {"vllm-v1|h200": {"ttft_mape_pct": 60.0, "tpot_mape_pct": 30.0, "rows": 5}}
    f.write_text(json.dumps(table))
    moe = V.error_band("vllm-v1", "h200", moe=True)
    assert (moe["ttft_mape_pct"], moe["rows"], moe["moe"]) == (60.0, 5, True)
    assert V.error_band("vllm-v1", "h200")["ttft_mape_pct"] == 11.0          # dense models keep theirs
    assert V.error_band("sglang", "h200", moe=True).startswith("unvalidated for MoE models")


def test_run_prints_the_stored_band_of_each_pools_engine_and_gpu(tmp_path, capsys):
    """`pdsim run`: each pool's line carries the held-out band stored for its (engine, GPU) in
    pdsim/data/validation_error.json, the idealised pool the `none` band, and a pair nobody measured
    (vLLM v0 on A100) `unvalidated`; the report card says the same."""
    import yaml
    from pdsim.validate import ERROR_TABLE
    bands = json.loads(ERROR_TABLE.read_text())["bands"]
    sc = {"name": "bands", "model": "llama-3.1-8b", "seed": 0,
          "workload": {"arrival": "poisson", "rate": 2, "num_requests": 3, "prompt_tokens": 64, "output_tokens": 4},
          "topologies": {"v1": {"kind": "colocated", "device": "h200", "engine": "vllm-v1"},
                         "idealised": {"kind": "colocated", "device": "h200"},
                         "v0": {"kind": "colocated", "device": "a100-80gb-sxm", "engine": "vllm-v0"}}}
    f = tmp_path / "bands.yaml"
    f.write_text(yaml.safe_dump(sc))
    assert main(["run", str(f), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    # one line per distinct band, naming every topology/pool it applies to
    lines = {f"expected error {where}": ln for ln in capsys.readouterr().out.splitlines()
             if ln.startswith("expected error") for where in ln.split(":")[0].removeprefix("expected error ").split(", ")}
    b = bands["vllm-v1|h200"]
    assert f"TTFT ±{b['ttft_mape_pct']}%, TPOT ±{b['tpot_mape_pct']}%" in lines["expected error v1/replica"]
    assert f"over {b['rows']} held-out measured runs" in lines["expected error v1/replica"]
    b = bands["none|h200"]
    assert f"TTFT ±{b['ttft_mape_pct']}%, TPOT ±{b['tpot_mape_pct']}%" in lines["expected error idealised/replica"]
    assert lines["expected error v0/replica"].endswith("unvalidated")
    page = (tmp_path / "out" / "report.html").read_text()
    from pdsim.charts import num
    assert "unvalidated" in page and f"±{num(bands['vllm-v1|h200']['ttft_mape_pct'])}%" in page


def test_run_prints_the_moe_band_for_an_moe_pool(tmp_path, capsys):
    """An MoE model's pool shows the band of the MoE silicon rows for its engine and GPU (SGLang H200: TTFT too
    fast there, too slow on the dense rows), labelled as such and as in sample, not the dense models' band."""
    import yaml
    from pdsim.validate import ERROR_TABLE
    table = json.loads(ERROR_TABLE.read_text())
    moe, dense = table["moe_bands"]["sglang|h200"], table["bands"]["sglang|h200"]
    assert moe["ttft_mape_pct"] != dense["ttft_mape_pct"]
    sc = {"name": "moe-band", "model": "qwen3-30b-a3b", "seed": 0,
          "workload": {"arrival": "poisson", "rate": 2, "num_requests": 3, "prompt_tokens": 64, "output_tokens": 4},
          "topologies": {"sg": {"kind": "colocated", "device": "h200", "engine": "sglang"}}}
    f = tmp_path / "moe.yaml"
    f.write_text(yaml.safe_dump(sc))
    assert main(["run", str(f), "--out", str(tmp_path / "out"), "--quiet", "--no-report"]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("expected error")]
    assert f"TTFT ±{moe['ttft_mape_pct']}%, TPOT ±{moe['tpot_mape_pct']}%" in line
    assert f"over {moe['rows']} measured MoE-model runs" in line and f"{moe['ttft_bias_pct']:+.0f}%" in line
    assert "in sample, not held out (rows of " in line
    if moe["ttft_measured_over_sim_median"] >= 1.5:        # pdsim fast: the factor, which an APE cannot show
        assert f"measured TTFT is a median {moe['ttft_measured_over_sim_median']:.1f}x pdsim's" in line
    # a constant cost model is a what-if: no measured band, MoE or not
    sc["topologies"]["sg"]["cost_model"] = {"kind": "constant", "step_s": 0.01}
    sc["topologies"]["sg"]["kv_blocks"] = 1000
    f.write_text(yaml.safe_dump(sc))
    assert main(["run", str(f), "--out", str(tmp_path / "out2"), "--quiet", "--no-report"]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("expected error")]
    assert line.endswith("unvalidated: a constant cost model (a what-if, not the roofline)")


def test_error_stats_and_band_notes_by_hand():
    """Two rows, simulated/measured TTFT 0.5 and 0.25 (APE 50%, 75%), TPOT 1.2 and 0.8 (APE 20%, 20%); a third
    that finished nothing (NaN) is left out, never a NaN band. TTFT: MAPE 62.5, median 62.5, p90 (numpy's
    linear) 50 + 0.9 x 25 = 72.5, bias (0.5 + 0.25) / 2 - 1 = -62.5%; measured/simulated 2 and 4: median 3,
    p90 by nearest rank (the 2nd of 2) 4. TPOT: 20 / 20 / 20, bias 0, measured/simulated 1/1.2 and 1.25: median 1.0417, stored
    rounded up (a margin never covers less than its quantile): 1.05."""
    from pdsim.validate import band_notes, error_stats
    rows = [{"ttft_ms": 100.0, "sim_ttft_ms": 50.0, "ttft_ape": 50.0, "tpot_ms": 10.0, "sim_tpot_ms": 12.0,
             "tpot_ape": 20.0},
            {"ttft_ms": 100.0, "sim_ttft_ms": 25.0, "ttft_ape": 75.0, "tpot_ms": 10.0, "sim_tpot_ms": 8.0,
             "tpot_ape": 20.0},
            {"ttft_ms": 100.0, "sim_ttft_ms": float("nan"), "ttft_ape": float("nan"), "tpot_ms": 10.0,
             "sim_tpot_ms": float("nan"), "tpot_ape": None}]
    st = error_stats(rows)
    assert (st["ttft_mape_pct"], st["ttft_median_ape_pct"], st["ttft_p90_ape_pct"], st["ttft_bias_pct"]) == \
        (62.5, 62.5, 72.5, -62.5)
    assert (st["ttft_measured_over_sim_median"], st["ttft_measured_over_sim_p90"]) == (3.0, 4.0)
    assert (st["tpot_mape_pct"], st["tpot_bias_pct"], st["tpot_measured_over_sim_median"]) == (20.0, 0.0, 1.05)
    # the notes: a fast TTFT's factor (>= 1.5x), not TPOT's 1.04x; an in-sample band says so and names its models
    assert band_notes(st) == "; measured TTFT is a median 3.0x pdsim's (p90 4.0x)"
    assert band_notes({**st, "in_sample": True, "models": ["deepseek-r1", "qwen3-235b-a22b"]}).startswith(
        "; in sample, not held out (rows of deepseek-r1, qwen3-235b-a22b); measured TTFT")
    assert band_notes({"ttft_measured_over_sim_median": 1.4}) == ""
    # an MoE band's fast TTFT points at the InferenceMAX floor and the key that sets one; a dense band's does not
    assert "set frontend_latency_ms" in band_notes({**st, "in_sample": True})
    assert "frontend_latency_ms" not in band_notes(st)
    assert error_stats([rows[2]])["ttft_mape_pct"] != error_stats([rows[2]])["ttft_mape_pct"]   # nothing: NaN


def test_kv_holds_requests_counts_as_the_pool_admits():
    """(blocks - watermark) // blocks one request takes, over the smallest instance: 100 blocks of 16 with a
    10-block watermark hold 90 // ceil(100 / 16) = 90 // 7 = 12 requests of 100 tokens (not 1600 // 100 = 16);
    with a sliding window's 3 extra blocks per request 90 // 10 = 9."""
    from types import SimpleNamespace as NS

    from pdsim.kvcache import KVCache, SlidingKVCache
    from pdsim.validate import kv_holds_requests
    assert kv_holds_requests(NS(instances=[NS(kv=KVCache(100, 16, watermark=0.1))]), 100) == 12
    assert kv_holds_requests(NS(instances=[NS(kv=SlidingKVCache(100, 16, 0.1, extra=3)),
                                           NS(kv=KVCache(200, 16))]), 100) == 9


def test_blackwell_fp4_and_fp8_rows_are_expressible(tmp_path):
    path = _silicon(tmp_path / "silicon.csv", [
        {"id": "b-fp4", "system": "b200_sxm", "precision": "fp4", "gemm_quant_mode": "nvfp4"},
        {"id": "b-fp8", "system": "b200_sxm", "precision": "fp8"},
        {"id": "h-bf16"}])
    rows = {r["id"]: (r, why) for r, why in read_measured(path)}
    assert all(why is None for _, why in rows.values())
    assert [(rows[i][0]["device"], rows[i][0]["weight_dtype"], rows[i][0]["kv_dtype"]) for i in ("b-fp4", "b-fp8", "h-bf16")] \
        == [("b200", "fp4", "fp8"), ("b200", "fp8", "fp8"), ("h100-sxm", "bf16", "bf16")]



def test_moe_rows_become_expert_parallel_or_dp_attention_pools(tmp_path):
    """MoE rows of models pdsim has presets for: TP attention with experts over moe_tp x moe_ep = tp GPUs
    (ep = moe_ep), or DP attention in one instance (attention TP 1 on attention_dp GPUs, ep = attention_dp);
    other splits, multi-node instances and models without a preset are skipped with a reason."""
    ds = {"model_path": "deepseek-ai/DeepSeek-R1", "system": "h200_sxm", "precision": "fp8",
          "moe_quant_mode": "fp8_block"}
    path = _silicon(tmp_path / "silicon.csv", [
        {**ds, "id": "ep8", "tp_size": 8, "moe_tp_size": 1, "moe_ep_size": 8},
        {**ds, "id": "tp8", "tp_size": 8, "moe_tp_size": 8, "moe_ep_size": 1},
        {**ds, "id": "dp8", "tp_size": 1, "moe_tp_size": 1, "moe_ep_size": 8, "attention_dp_size": 8},
        {**ds, "id": "odd", "tp_size": 8, "moe_tp_size": 2, "moe_ep_size": 2},
        {**ds, "id": "dp-tp", "tp_size": 2, "moe_tp_size": 1, "moe_ep_size": 8, "attention_dp_size": 4},
        {**ds, "id": "big", "tp_size": 16, "moe_tp_size": 1, "moe_ep_size": 16},
        {"id": "kimi", "model_path": "moonshotai/Kimi-K2-Instruct"}])
    rows = {r["id"]: (r, why) for r, why in read_measured(path)}
    assert {i: why for i, (_, why) in rows.items() if why} == {
        "odd": "moe_split", "dp-tp": "attention_data_parallel", "big": "multi_node_tp",
        "kimi": "moe_model: moonshotai/Kimi-K2-Instruct"}
    got = {i: (r["model"], r["tp"], r.get("ep", 1), r.get("dp_attention", False), r["weight_dtype"])
           for i, (r, why) in rows.items() if why is None}
    assert got == {"ep8": ("deepseek-r1", 8, 8, False, "fp8"), "tp8": ("deepseek-r1", 8, 1, False, "fp8"),
                   "dp8": ("deepseek-r1", 8, 8, True, "fp8")}
    from pdsim.validate import row_scenario
    pool = row_scenario({**rows["dp8"][0], "concurrency": 4}).topologies["t"]
    assert (pool.tp, pool.ep, pool.dp_attention, pool.engine) == (8, 8, True, "trtllm")


def test_each_row_reports_the_kv_pool_it_was_simulated_with_by_hand(tmp_path):
    """SGLang sizes its KV cache as mem_fraction_static x memory - weights (preset 0.88, page 1 token).
    H100 80 GiB = 85,899,345,920 B x 0.88 = 75,591,424,409.6 B; Llama-3.1-8B bf16 weights: embedding and LM
    head 128,256 x 4,096 each, 32 layers of q/o 4,096^2, k/v 4,096 x 1,024, gate/up/down 4,096 x 14,336 =
    8,029,995,008 parameters x 2 B = 16,059,990,016 B (norms not counted); KV per token 32 layers x 8 KV heads
    x 128 x 2 (K, V) x 2 B = 131,072 B -> floor(59,531,434,393.6 / 131,072) = 454,188 tokens, which hold
    454,188 // (128 + 9) = 3,315 full-length requests."""
    from pdsim.validate import kv_bound, write_outputs
    path = _silicon(tmp_path / "s.csv", [{"id": "sg", "backend": "sglang", "backend_version": "0.5.1"}])
    res = validate(read_measured(path))
    (row,) = res["rows"]
    assert row["engine"] == "sglang"
    assert (row["sim_kv_tokens"], row["kv_holds_requests"]) == (454188, 3315)
    assert not kv_bound(row)
    # KV-bound: the pool holds fewer full-length requests than the run had clients (not when it holds as many)
    assert kv_bound({"kv_holds_requests": 3, "concurrency": 4})
    assert not kv_bound({"kv_holds_requests": 4, "concurrency": 4})
    assert not kv_bound({"concurrency": 4})                     # rows of an older table: unknown, not flagged
    bound = {**row, "id": "tight", "concurrency": 4000}
    write_outputs({**res, "rows": [row, bound]}, tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "validate.json").read_text())
    assert summary["kv_bound_rows"] == 1
    assert {r["id"]: r["kv_holds_requests"] for r in summary["worst_ttft_rows"]} == {"sg": 3315, "tight": 3315}
    page = (tmp_path / "out" / "validate.html").read_text()
    assert "1 simulated row(s) are <b>KV-bound</b>" in page and "3315 &lt; 4000" in page
    with open(tmp_path / "out" / "validate.csv") as f:
        assert [r["kv_holds_requests"] for r in csv.DictReader(f)] == ["3315", "3315"]


def test_kv_pool_tokens_is_the_smallest_instances_blocks_times_block_size():
    from types import SimpleNamespace as NS

    from pdsim.validate import kv_pool_tokens
    inst = [NS(kv=NS(total_blocks=100, block_size=16)), NS(kv=NS(total_blocks=90, block_size=16))]
    assert kv_pool_tokens(NS(instances=inst)) == 1440          # 90 blocks x 16 tokens, not 100 x 16 or 90


def test_moe_bands_count_each_measurement_once_and_the_dense_rewrite_keeps_them(tmp_path):
    """validate_moe_silicon.py's bands: a measurement listed under two ids counts once, each band names its
    models, and the table keeps its dense part; validate_silicon.py's rewrite keeps the MoE part."""
    import sys
    from pathlib import Path

    import pandas as pd
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import validate_moe_silicon as M
    import validate_silicon as S
    base = {"model": "deepseek-r1", "device": "h200", "engine": "sglang", "tp": 8, "ep": 1, "dp_attention": False,
            "weight_dtype": "fp8", "isl": 1024, "osl": 1024, "concurrency": 4, "tpot_ms": 10.0, "sim_tpot_ms": 10.0,
            "tpot_ape": 0.0}
    rows = pd.DataFrame([{**base, "id": "a", "ttft_ms": 100.0, "sim_ttft_ms": 50.0, "ttft_ape": 50.0},
                         {**base, "id": "a-again", "ttft_ms": 100.0, "sim_ttft_ms": 50.0, "ttft_ape": 50.0},
                         {**base, "id": "b", "model": "deepseek-v3", "ttft_ms": 200.0, "sim_ttft_ms": 50.0,
                          "ttft_ape": 75.0}])
    table = tmp_path / "bands.json"
    table.write_text(json.dumps({"source": "dense", "split": S.SPLIT, "bands": {"sglang|h200": {"rows": 9}}}))
    M.write_moe_bands(rows, "0.0", table)
    t = json.loads(table.read_text())
    band = t["moe_bands"]["sglang|h200"]
    assert (band["rows"], band["models"], band["ttft_mape_pct"]) == (2, ["deepseek-r1", "deepseek-v3"], 62.5)
    assert t["bands"] == {"sglang|h200": {"rows": 9}} and "NOT a held-out check" in t["moe_source"]
    merged = S.merged_table(t, {"trtllm|h200": {"rows": 5}}, source="new dense")
    assert merged["moe_bands"] == t["moe_bands"] and merged["moe_source"] == t["moe_source"]
    assert merged["bands"] == {"sglang|h200": {"rows": 9}, "trtllm|h200": {"rows": 5}}
    # a table without dense bands (or another split) still keeps the MoE part
    assert S.merged_table({"moe_bands": {"x": 1}}, {}, "s")["moe_bands"] == {"x": 1}


def test_cli_names_the_kv_bound_rows(tmp_path, capsys):
    # 4 clients of 128,000 + 9 tokens against the 454,188-token SGLang pool above: it holds 3 of them
    path = _silicon(tmp_path / "s.csv", [{"id": "long", "backend": "sglang", "backend_version": "0.5.1",
                                          "isl": 128000, "silicon_data_source": "made-up; silicon_concurrency=4",
                                          "batch_size": 4}])
    assert main(["validate", str(path), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "1 KV-bound row(s)" in out and ": long" in out
    with open(tmp_path / "o" / "validate.csv") as f:
        (row,) = csv.DictReader(f)
    assert (row["sim_kv_tokens"], row["kv_holds_requests"], row["concurrency"]) == ("454188", "3", "4")


def test_validate_adds_a_per_engine_frontend_floor_by_layers(tmp_path):
    # one client on Llama-3.1-8B (32 layers, no MoE layer): 1000 us per layer is 32 ms more on every TTFT,
    # nothing on TPOT; a floor given for another engine changes nothing
    path = _silicon(tmp_path / "silicon.csv", [{"id": "ok"}])
    rows = read_measured(path)
    base = validate(rows)["rows"][0]
    other = validate(rows, frontend={"sglang": (1000.0, 0.0)})["rows"][0]
    got = validate(rows, frontend={"trtllm": (1000.0, 5000.0)})["rows"][0]
    assert got["sim_ttft_ms"] - base["sim_ttft_ms"] == pytest.approx(32.0, rel=1e-9)
    assert got["sim_tpot_ms"] == pytest.approx(base["sim_tpot_ms"], rel=1e-12)
    assert other["sim_ttft_ms"] == base["sim_ttft_ms"]
