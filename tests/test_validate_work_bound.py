"""The work bound on measured rows (pdsim.validate.implied_gemm_util): how much GEMM work per second a
measured run implies, against what its GPUs can do.  Values worked by hand from the model's shapes and
the device profile's datasheet numbers; a run pdsim simulated itself must never be flagged."""
from __future__ import annotations

import csv
import json

import pytest

from pdsim.__main__ import main
from pdsim.devices import get_device
from pdsim.validate import implied_gemm_util, over_gemm_rate, read_measured, simulate_row, validate, write_outputs

# Llama-3.1-8B by hand (hidden 4096, 32 layers, 32 query / 8 KV heads of 128, MLP 14,336, vocab 128,256, LM
# head not tied): per layer q and o 4096 x 4096, k and v 4096 x 1024, gate, up and down 4096 x 14,336 =
# 16,777,216 x 2 + 4,194,304 x 2 + 58,720,256 x 3 = 218,103,808; x 32 layers = 6,979,321,856 decoder
# parameters; LM head 4096 x 128,256 = 525,336,576.
DECODER = 16_777_216 * 2 + 4_194_304 * 2 + 58_720_256 * 3
assert DECODER == 218_103_808
DECODER *= 32
HEAD = 4096 * 128_256

ROW = {"model": "llama-3.1-8b", "device": "h200", "tp": 1, "weight_dtype": "fp8", "isl": 1000, "osl": 101,
       "concurrency": 100, "ttft_ms": 100.0, "tpot_ms": 10.0}


def _best_gemm(device: str, fp8: bool) -> float:
    """The profile's datasheet peak x gemm_max (x the larger of its fp8 GEMM fractions for fp8)."""
    spec = get_device(device).spec
    e = spec.efficiency
    peak = spec.peak_tflops["fp8" if fp8 else "bf16"] * 1e12
    return peak * e.gemm_max * (max(e.fp8_gemm_compute, e.grouped_fp8_compute) if fp8 else 1.0)


def test_implied_gemm_util_of_a_closed_loop_row_by_hand():
    # Little's law: 100 clients, each request 0.1 s to the first token + 100 gaps of 10 ms = 1.1 s -> 90.909
    # requests/s.  Per request 2 x 6,979,321,856 x (1000 + 101) + 2 x 525,336,576 x 101 FLOPs
    # = 15,368,466,726,912 + 106,117,988,352 = 15,474,584,715,264 -> 1.40678e15 FLOP/s.
    per_req = 2 * DECODER * 1101 + 2 * HEAD * 101
    assert per_req == 15_474_584_715_264
    want = per_req * (100 / 1.1) / _best_gemm("h200", fp8=True)
    assert implied_gemm_util(ROW) == pytest.approx(want, rel=1e-12)
    assert 1.19 < want < 1.21          # H200 fp8: 1979 TFLOP/s x 0.802 x 0.74 = 1.1745e15 FLOP/s
    assert over_gemm_rate({"implied_gemm_util": want})
    # twice the GPUs, half the share; bf16 weights run at the bf16 peak (no fp8 fraction)
    assert implied_gemm_util({**ROW, "tp": 2}) == pytest.approx(want / 2, rel=1e-12)
    assert implied_gemm_util({**ROW, "weight_dtype": "bf16"}) == pytest.approx(
        per_req * (100 / 1.1) / _best_gemm("h200", fp8=False), rel=1e-12)


def test_implied_gemm_util_reads_a_measured_throughput_and_the_length_draw_by_hand():
    # 9,000 output tokens/s over 101 tokens a request: 89.109 requests/s (the measured throughput wins over
    # Little's law: the concurrency and latencies are ignored then)
    per_req = 2 * DECODER * 1101 + 2 * HEAD * 101
    got = implied_gemm_util({**ROW, "throughput_tok_s": 9000.0, "concurrency": 1, "ttft_ms": 1e6})
    assert got == pytest.approx(per_req * (9000.0 / 101) / _best_gemm("h200", True), rel=1e-12)
    # InferenceMAX's draw, uniform integers in [int(L x 0.8), L]: mean prompt (800 + 1000) / 2 = 900, mean
    # reply (80 + 101) / 2 = 90.5; Little's law with the mean reply: 0.1 + 89.5 x 0.01 = 0.995 s
    per_req = 2 * DECODER * (900 + 90.5) + 2 * HEAD * 90.5
    got = implied_gemm_util({**ROW, "length_ratio": 0.8})
    assert got == pytest.approx(per_req * (100 / 0.995) / _best_gemm("h200", True), rel=1e-12)


@pytest.mark.parametrize("change", [{"concurrency": None}, {"tpot_ms": None}, {"model": "no-such-model"},
                                    {"device": "no-such-gpu"}, {"isl": 0}])
def test_implied_gemm_util_is_none_without_what_it_needs(change):
    row = {**ROW, **change}
    assert implied_gemm_util(row) is None
    assert not over_gemm_rate({"implied_gemm_util": None}) and not over_gemm_rate({})


def test_over_gemm_rate_is_strictly_above_one():
    assert not over_gemm_rate({"implied_gemm_util": 1.0}) and over_gemm_rate({"implied_gemm_util": 1.0001})
    assert not over_gemm_rate({"implied_gemm_util": float("nan")})


@pytest.mark.parametrize("engine,tp,isl,osl,clients", [("vllm-v1", 1, 4000, 16, 48), ("trtllm", 2, 2000, 8, 64),
                                                       ("sglang", 1, 8000, 32, 16)])
def test_a_run_pdsim_simulated_is_never_beyond_its_own_gemm_rate(engine, tp, isl, osl, clients):
    """pdsim's GEMMs never beat peak x gemm_max (x the fp8 fraction), and a step does more than GEMMs, so
    its own closed-loop results, read back as a measured row, stay within 1.  Prefill-heavy rows (long
    prompts, short replies, many clients) put the bound near its top, so it is tested where it is tight."""
    r = {"model": "llama-3.1-8b", "device": "h100-sxm", "engine": engine, "tp": tp, "weight_dtype": "fp8",
         "kv_dtype": "fp8", "isl": isl, "osl": osl, "concurrency": clients, "id": "self"}
    sim = simulate_row(r, requests_per_client=4, client_mode="sync")
    u = implied_gemm_util({**r, "ttft_ms": sim["sim_ttft_ms"], "tpot_ms": sim["sim_tpot_ms"]})
    assert 0.25 < u <= 1.0


COLS = ["id", "silicon_data_source", "backend", "backend_version", "model_path", "system", "precision", "mode",
        "isl", "osl", "batch_size", "tp_size", "silicon_ttft_ms", "silicon_tpot_ms"]


def _silicon(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLS)
        w.writeheader()
        for r in rows:
            w.writerow({"silicon_data_source": "made-up; silicon_concurrency=100", "backend": "vllm",
                        "backend_version": "0.10.1", "model_path": "meta-llama/Llama-3.1-8B-Instruct",
                        "system": "h200_sxm", "precision": "fp8", "mode": "agg", "isl": 1000, "osl": 101,
                        "batch_size": 100, "tp_size": 1, "silicon_ttft_ms": 100.0, "silicon_tpot_ms": 10.0, **r})
    return path


def test_validate_counts_flags_and_lists_the_rows_beyond_the_gemm_rate(tmp_path, capsys):
    # "fast": the hand-worked row above (1.198x); "slow": 1 s to the first token and 30 ms gaps -> 100 / 4 s =
    # 25 requests/s, 0.33x: within the rate
    path = _silicon(tmp_path / "s.csv", [{"id": "fast"}, {"id": "slow", "silicon_ttft_ms": 1000.0,
                                                          "silicon_tpot_ms": 30.0}])
    res = validate(read_measured(path), requests_per_client=1, client_mode="sync")
    by_id = {r["id"]: r for r in res["rows"]}
    assert by_id["fast"]["implied_gemm_util"] == pytest.approx(implied_gemm_util(ROW), rel=1e-12)
    assert by_id["slow"]["implied_gemm_util"] == pytest.approx(implied_gemm_util(ROW) * 1.1 / 4.0, rel=1e-12)
    (g,) = res["groups"]
    assert g["rows"] == 2 and g["over_gemm_rate_rows"] == 1
    # the group's headline MAPE keeps both rows; the figure without the flagged one is the slow row's alone
    slow = by_id["slow"]
    assert g["ttft_mape_within_gemm_rate"] == pytest.approx(slow["ttft_ape"], rel=1e-12)
    assert g["tpot_mape_within_gemm_rate"] == pytest.approx(slow["tpot_ape"], rel=1e-12)
    assert g["ttft_mape"] == pytest.approx((slow["ttft_ape"] + by_id["fast"]["ttft_ape"]) / 2, rel=1e-12)
    write_outputs(res, tmp_path / "o")
    summary = json.loads((tmp_path / "o" / "validate.json").read_text())
    assert summary["over_gemm_rate_rows"] == 1
    assert [r["id"] for r in summary["over_gemm_rate"]] == ["fast"]
    page = (tmp_path / "o" / "validate.html").read_text()
    assert "1 row(s) imply more work per second than their GPUs can do" in page and "<td>fast</td><td>1.20</td>" in page
    with open(tmp_path / "o" / "validate.csv") as f:
        got = {r["id"]: float(r["implied_gemm_util"]) for r in csv.DictReader(f)}
    assert got["fast"] > 1 > got["slow"]
    # the CLI names them
    assert main(["validate", str(path), "--out", str(tmp_path / "c"), "--quiet", "--requests-per-client", "1", "--client", "sync"]) == 0
    out = capsys.readouterr().out
    assert "1 row(s) beyond the GPUs' GEMM rate" in out and "fast (1.20x)" in out and "slow" not in out.split("GEMM rate")[1]


def test_no_note_when_every_row_is_within_the_rate(tmp_path):
    path = _silicon(tmp_path / "s.csv", [{"id": "slow", "silicon_ttft_ms": 1000.0, "silicon_tpot_ms": 30.0}])
    res = validate(read_measured(path), requests_per_client=1, client_mode="sync")
    assert res["groups"][0]["over_gemm_rate_rows"] == 0 and "ttft_mape_within_gemm_rate" not in res["groups"][0]
    write_outputs(res, tmp_path / "o")
    assert "beyond the GPUs' GEMM rate" not in (tmp_path / "o" / "validate.html").read_text()
