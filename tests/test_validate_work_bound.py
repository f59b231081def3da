"""The work bound on measured rows (pdsim.validate.implied_gemm_util / implied_peak_share): how much
linear-layer work per second a measured run implies, against pdsim's GEMM ceiling for its GPUs and against
their datasheet peak.  Values worked by hand from the model's shapes and the device profile's datasheet
numbers; a run pdsim simulated itself, read back with its own throughput, is never beyond its ceiling."""
from __future__ import annotations

import csv
import json

import pytest

from pdsim.__main__ import main
from pdsim.devices import get_device
from pdsim.validate import (implied_gemm_util, implied_peak_share, over_gemm_rate, read_measured, simulate_row,
                            validate, write_outputs)

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
    # requests/s.  Per request 1000 prompt tokens and 100 fed-back reply tokens run through the decoder, 101
    # reply tokens through the LM head: 2 x 6,979,321,856 x 1,100 + 2 x 525,336,576 x 101
    # = 15,354,508,083,200 + 106,117,988,352 = 15,460,626,071,552 FLOPs -> 1.40551e15 FLOP/s.
    per_req = 2 * DECODER * 1100 + 2 * HEAD * 101
    assert per_req == 15_460_626_071_552
    want = per_req * (100 / 1.1) / _best_gemm("h200", fp8=True)
    assert implied_gemm_util(ROW) == pytest.approx(want, rel=1e-12)
    assert 1.19 < want < 1.20          # H200 fp8: 1979 TFLOP/s x 0.802 x 0.74 = 1.1745e15 FLOP/s
    assert over_gemm_rate({"implied_gemm_util": want})
    # against the datasheet fp8 peak, 1979 TFLOP/s: 0.710, possible
    assert implied_peak_share(ROW) == pytest.approx(per_req * (100 / 1.1) / 1979e12, rel=1e-12)
    # twice the GPUs, half the share; bf16 weights run at the bf16 peak (no fp8 fraction)
    assert implied_gemm_util({**ROW, "tp": 2}) == pytest.approx(want / 2, rel=1e-12)
    assert implied_gemm_util({**ROW, "weight_dtype": "bf16"}) == pytest.approx(
        per_req * (100 / 1.1) / _best_gemm("h200", fp8=False), rel=1e-12)


def test_implied_gemm_util_reads_a_measured_throughput_and_the_length_draw_by_hand():
    # 9,000 output tokens/s over 101 tokens a request: 89.109 requests/s (the measured throughput wins over
    # Little's law: the concurrency and latencies are ignored then)
    per_req = 2 * DECODER * 1100 + 2 * HEAD * 101
    got = implied_gemm_util({**ROW, "throughput_tok_s": 9000.0, "concurrency": 1, "ttft_ms": 1e6})
    assert got == pytest.approx(per_req * (9000.0 / 101) / _best_gemm("h200", True), rel=1e-12)
    # InferenceMAX's draw, uniform integers in [int(L x 0.8), L]: mean prompt (800 + 1000) / 2 = 900, mean
    # reply (80 + 101) / 2 = 90.5; Little's law with the mean reply: 0.1 + 89.5 x 0.01 = 0.995 s
    per_req = 2 * DECODER * (900 + 89.5) + 2 * HEAD * 90.5
    got = implied_gemm_util({**ROW, "length_ratio": 0.8})
    assert got == pytest.approx(per_req * (100 / 0.995) / _best_gemm("h200", True), rel=1e-12)


def test_a_shared_prefix_takes_its_whole_units_off_the_prefill_work_by_hand():
    # 512 shared tokens of 1000: 32 whole 16-token units cached, 488 prompt tokens + 100 reply tokens computed;
    # 500 shared: 31 units = 496 cached; 2000 shared (more than the prompt): all but the last token's unit,
    # min(2000, 999) // 16 x 16 = 992 cached
    rate = (100 / 1.1) / _best_gemm("h200", True)
    for shared, cached in ((512, 512), (500, 496), (2000, 992)):
        per_req = 2 * DECODER * (1000 - cached + 100) + 2 * HEAD * 101
        assert implied_gemm_util(ROW, shared_prefix=shared) == pytest.approx(per_req * rate, rel=1e-12)
    # a 1008-token prompt (63 whole units) all shared: the unit holding the last token is computed again,
    # min(2000, 1007) // 16 x 16 = 992 cached, 16 prompt tokens computed
    per_req = 2 * DECODER * (1008 - 992 + 100) + 2 * HEAD * 101
    assert implied_gemm_util({**ROW, "isl": 1008}, shared_prefix=2000) == pytest.approx(per_req * rate, rel=1e-12)


def test_the_ceiling_is_the_profile_the_row_is_priced_with(tmp_path):
    """validate --profiles prices a GPU's rows with another profile: the ceiling is that profile's.  A copy of
    the H200 preset with gemm_max halved doubles the share, in the function and in validate's rows."""
    from pathlib import Path

    import pdsim
    text = (Path(pdsim.__file__).parent / "data" / "devices" / "h200.yaml").read_text()
    e = get_device("h200").spec.efficiency
    slow = tmp_path / "h200-slow.yaml"
    slow.write_text(text.replace(f"gemm_max: {e.gemm_max}", f"gemm_max: {e.gemm_max / 2}").replace(
        "name: h200", "name: h200-slow"))
    assert get_device(str(slow)).spec.efficiency.gemm_max == pytest.approx(e.gemm_max / 2)
    assert implied_gemm_util(ROW, device=str(slow)) == pytest.approx(2 * implied_gemm_util(ROW), rel=1e-12)
    path = _silicon(tmp_path / "s.csv", [{"id": "slow", "silicon_ttft_ms": 1000.0, "silicon_tpot_ms": 30.0}])
    plain = validate(read_measured(path), requests_per_client=1, client_mode="sync")["rows"][0]
    priced = validate(read_measured(path), requests_per_client=1, client_mode="sync",
                      profiles={"h200": str(slow)})["rows"][0]
    assert priced["implied_gemm_util"] == pytest.approx(2 * plain["implied_gemm_util"], rel=1e-12)
    assert priced["implied_peak_share"] == plain["implied_peak_share"]       # the datasheet peak: unchanged


def test_quantised_rows_are_judged_against_the_fastest_peak_the_gpu_has():
    # B200: fp8 4500, fp4 9000 TFLOP/s; an fp8 row's share of the datasheet peak is taken at fp4's 9000 (an
    # engine may run it lower), a bf16 row's at bf16's 2250
    per_s = (2 * DECODER * 1100 + 2 * HEAD * 101) * (100 / 1.1)
    b200 = {**ROW, "device": "b200"}
    assert implied_peak_share(b200) == pytest.approx(per_s / 9000e12, rel=1e-12)
    assert implied_peak_share({**b200, "weight_dtype": "bf16"}) == pytest.approx(per_s / 2250e12, rel=1e-12)
    # pdsim's ceiling follows its own compute dtype: fp8 weights on fp8 tensor cores
    assert implied_gemm_util(b200) == pytest.approx(per_s / _best_gemm("b200", True), rel=1e-12)


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
    u = implied_gemm_util({**r, "throughput_tok_s": sim["sim_throughput_tok_s"]})
    assert 0.25 < u <= 1.0
    # Little's law on the same run's mean latencies says about as much (four requests per client)
    assert implied_gemm_util({**r, "ttft_ms": sim["sim_ttft_ms"], "tpot_ms": sim["sim_tpot_ms"]}) <= 1.0


def test_littles_law_overstates_the_rate_of_a_one_wave_run():
    """The documented limit of the Little's-law branch: 256 clients sending one request each are served in one
    burst whose mean latency, turned into a rate by concurrency / latency, counts every client as busy for the
    whole run.  pdsim's own run of it reads beyond the ceiling by Little's law and within it by its measured
    throughput, which is why the throughput wins when a file gives it."""
    r = {"model": "llama-3.1-8b", "device": "h200", "engine": "vllm-v1", "tp": 1, "weight_dtype": "fp8",
         "kv_dtype": "fp8", "isl": 1000, "osl": 2, "concurrency": 256, "id": "burst"}
    sim = simulate_row(r, requests_per_client=1, client_mode="sync")
    little = implied_gemm_util({**r, "ttft_ms": sim["sim_ttft_ms"], "tpot_ms": sim["sim_tpot_ms"]})
    measured = implied_gemm_util({**r, "throughput_tok_s": sim["sim_throughput_tok_s"]})
    assert measured <= 1.0 < little


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
    assert "1 row(s) imply more linear-layer work per second than pdsim's cost model" in page
    assert "<td>fast</td><td>1.20</td><td>0.71</td>" in page and "Every prompt is fresh" in page
    assert summary["settings"]["shared_prefix_tokens"] == 0
    with open(tmp_path / "o" / "validate.csv") as f:
        got = {r["id"]: float(r["implied_gemm_util"]) for r in csv.DictReader(f)}
    assert got["fast"] > 1 > got["slow"]
    # the CLI names them
    assert main(["validate", str(path), "--out", str(tmp_path / "c"), "--quiet", "--requests-per-client", "1", "--client", "sync"]) == 0
    out = capsys.readouterr().out
    assert "1 row(s) beyond pdsim's GEMM ceiling" in out and "fast (1.20x)" in out
    assert out.split("overstated rate: ")[1].strip() == "fast (1.20x)"      # the slow row is not named


def test_no_note_when_every_row_is_within_the_rate(tmp_path):
    path = _silicon(tmp_path / "s.csv", [{"id": "slow", "silicon_ttft_ms": 1000.0, "silicon_tpot_ms": 30.0}])
    res = validate(read_measured(path), requests_per_client=1, client_mode="sync")
    assert res["groups"][0]["over_gemm_rate_rows"] == 0 and "ttft_mape_within_gemm_rate" not in res["groups"][0]
    write_outputs(res, tmp_path / "o")
    assert "beyond pdsim's GEMM ceiling" not in (tmp_path / "o" / "validate.html").read_text()
