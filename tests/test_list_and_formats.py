"""pdsim list (models, devices, links, scenarios) parsed from its output; --format json on run and estimate;
vllm-bench-serve-named aliases in summary.json; --no-report."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdsim.__main__ import main

REPO = Path(__file__).resolve().parents[1]


def _json(capsys, argv) -> object:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_list_models_json_has_hand_checked_numbers(capsys):
    rows = {r["name"]: r for r in _json(capsys, ["list", "models", "--format", "json"])}
    m = rows["llama-3.1-8b"]
    # KV per token = 2 (K, V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes = 131,072 (DESIGN.md: 128 KiB)
    assert m["kv_bytes_per_token_bf16"] == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert m["params_B"] == pytest.approx(8.03, abs=0.01)          # Meta's model card: 8.03B
    assert rows["llama-2-7b"]["kv_bytes_per_token_bf16"] == 2 * 32 * 32 * 128 * 2   # no GQA: 512 KiB
    assert rows["llama-2-7b"]["params_B"] == pytest.approx(6.74, abs=0.01)


def test_list_devices_says_measured_or_datasheet(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    rows = {r["name"]: r for r in _json(capsys, ["list", "devices", "--format", "json"])}
    h100 = rows["h100-sxm"]
    assert (h100["peak_bf16_TFLOPs"], h100["hbm_GBps"], h100["memory_GiB"]) == (989, 3350, 80)   # datasheet
    assert h100["source"] == "datasheet"
    assert rows["cpu-epyc-2c-measured"]["source"] == "measured"


def test_list_engines_says_which_overheads_are_measured(capsys):
    rows = {r["name"]: r for r in _json(capsys, ["list", "engines", "--format", "json"])}
    assert set(rows) == {"vllm-v1", "vllm-v0", "sglang", "trtllm"}
    # vLLM v0's overhead is the fit to Vidur's measured A100 CPU overheads: 0.813 ms + 0.0423 ms per sequence
    v0 = rows["vllm-v0"]
    assert (v0["overhead_base_us"], v0["overhead_per_seq_us"], v0["overhead"]) == (813.0, 42.3, "fitted-cpu")
    # the others are fitted to end-to-end TPOT residuals (they absorb cost-model error): the listing must not
    # present them as measured CPU overheads
    assert all(rows[n]["overhead"] == "fitted-residual" for n in ("vllm-v1", "sglang", "trtllm"))
    assert rows["trtllm"]["block_size_tokens"] == 32 and rows["sglang"]["block_size_tokens"] == 1
    assert rows["trtllm"]["kv_reservation"] == "full" and rows["vllm-v1"]["kv_reservation"] == "incremental"
    assert main(["list", "engines"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[0] == "name" and "overhead" in lines[0].split()
    assert sorted(ln.split()[0] for ln in lines[1:]) == ["sglang", "trtllm", "vllm-v0", "vllm-v1"]


def test_list_table_output_parses(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    for what, key, name in (("links", "bandwidth_GBps_per_gpu", "infiniband"), ("models", "params_B", "opt-13b"),
                            ("scenarios", "kind", "quickstart")):
        assert main(["list", what]) == 0
        lines = capsys.readouterr().out.splitlines()
        head = lines[0].split()
        assert key in head
        rows = [ln.split() for ln in lines[1:]]
        col = head.index("name")
        assert any(r[col] == name for r in rows), (what, lines)
    assert main(["list", "links"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ib = next(ln.split() for ln in lines if ln.startswith("infiniband"))
    assert float(ib[1]) == 50 and float(ib[2]) == 10


def test_run_format_json_and_vllm_aliases(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    # a lone request every 10 s on a constant 10 ms step: TTFT = 10 ms, TPOT = 10 ms, E2E = 10 + 9 x 10 = 100 ms
    sc.write_text("model: llama-3.1-8b\nworkload: {arrival: constant, rate: 0.1, num_requests: 3, prompt_tokens: 8,"
                  " output_tokens: 10}\ntopologies: {c: {kind: colocated, kv_blocks: 1000, cost_model: "
                  "{kind: constant, step_s: 0.01}}}\n")
    topos = _json(capsys, ["run", str(sc), "--out", str(tmp_path / "o"), "--quiet", "--format", "json",
                           "--no-report"])
    t = topos["c"]
    assert t["ttft_s"]["p50"] == pytest.approx(0.01)                      # existing keys unchanged
    assert t["mean_ttft_ms"] == pytest.approx(10) and t["median_tpot_ms"] == pytest.approx(10)
    assert t["p99_e2el_ms"] == pytest.approx(100)
    assert t["completed"] == 3 and t["request_throughput"] == pytest.approx(t["throughput"]["requests_per_s"])
    assert t["output_throughput"] == pytest.approx(t["throughput"]["output_tokens_per_s"])
    saved = json.loads((tmp_path / "o" / "summary.json").read_text())["topologies"]["c"]
    assert saved["mean_ttft_ms"] == pytest.approx(10)
    assert not (tmp_path / "o" / "report.html").exists()                 # --no-report
    assert (tmp_path / "o" / "requests.csv").exists()


def test_estimate_format_json(capsys):
    res = _json(capsys, ["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm", "--prefill", "1024",
                         "--format", "json"])
    assert res["phase"] == "prefill" and res["time_s"] > 0


def test_list_scenarios_skips_files_that_are_not_runnable(tmp_path, capsys):
    """A folder with a scenario, a plan, a device profile and a step-overhead file: only the first two are listed."""
    (tmp_path / "a.yaml").write_text("name: a\nmodel: llama-3.1-8b\nworkload: {rate: 2}\n"
                                     "topologies: {c: {kind: colocated}}\n")
    (tmp_path / "b.yaml").write_text("name: b\nmodel: llama-3.1-8b\nworkload: {rate: 2}\nsearch: {}\n")
    (tmp_path / "dev.yaml").write_text("name: mygpu\nkind: gpu\npeak_tflops: {bf16: 100}\n")
    (tmp_path / "cal.yaml").write_text("engines: {vllm-v1: {base_us: 100}}\n")
    rows = _json(capsys, ["list", "scenarios", str(tmp_path), "--format", "json"])
    assert [(r["name"], r["kind"]) for r in rows] == [("a", "scenario"), ("b", "plan")]
