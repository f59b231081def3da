"""Every shipped scenario runs at a tiny scale, and the CLI turns bad input into one clear line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO
from pdsim.__main__ import main

SCENARIOS = sorted(p for p in (REPO / "scenarios").glob("*.yaml") if not p.stem.startswith("plan-"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_scenario_runs_tiny(path, tmp_path, capsys):
    rc = main(["run", str(path), "--out", str(tmp_path), "--quiet", "--set", "workload.num_requests=25"])
    assert rc == 0, capsys.readouterr().err
    s = json.loads((tmp_path / "summary.json").read_text())
    for name, t in s["topologies"].items():
        r = t["requests"]
        assert r["total"] == r["finished"] + r["rejected"] + r["abandoned"] + r["unfinished"] == 25, name
    assert (tmp_path / "requests.csv").stat().st_size > 0
    assert (tmp_path / "timeseries.csv").stat().st_size > 0


def test_horizon_reports_in_flight_as_unfinished(tmp_path):
    rc = main(["run", str(REPO / "scenarios/quickstart.yaml"), "--out", str(tmp_path), "--quiet",
               "--set", "workload.num_requests=200", "--set", "horizon_s=5"])
    assert rc == 0
    t = json.loads((tmp_path / "summary.json").read_text())["topologies"]["colocated-4"]
    s = t["requests"]
    # the requests arriving after 5 s are not in the run, only counted
    assert s["unfinished"] > 0 and t["cut_by_horizon"] > 0 and s["total"] + t["cut_by_horizon"] == 200
    assert s["total"] == s["finished"] + s["rejected"] + s["unfinished"]


def _err(argv, capsys) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    assert err.startswith("pdsim: error: ") and err.count("\n") == 1, err
    return err


def _scenario(tmp_path, text: str) -> str:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return str(p)


BASE = """
model: llama-3.1-8b
workload: {arrival: poisson, rate: 2, num_requests: 5, prompt_tokens: 100, output_tokens: 10}
topologies:
  a: {kind: colocated, replicas: 1, device: h100-sxm}
"""


def test_unknown_key_did_you_mean(tmp_path, capsys):
    err = _err(["run", _scenario(tmp_path, BASE.replace("replicas: 1", "replcas: 1"))], capsys)
    assert "s.yaml" in err and "topologies.a.replcas" in err and "did you mean 'replicas'" in err


def test_a_real_key_at_the_wrong_level_says_so(tmp_path, capsys):
    # 'tp' belongs in a topology: at the top it is not a typo to correct into another word ('step')
    err = _err(["run", _scenario(tmp_path, "tp: 2\n" + BASE)], capsys)
    assert "s.yaml: tp: not a key at this level" in err and "did you mean" not in err
    err = _err(["run", _scenario(tmp_path, BASE.replace("num_requests: 5", "num_requests: 5, replicas: 2"))], capsys)
    assert "workload.replicas: not a key at this level" in err


def test_unknown_model_lists_valid(tmp_path, capsys):
    err = _err(["run", _scenario(tmp_path, BASE.replace("llama-3.1-8b", "llama-9"))], capsys)
    assert "'llama-9'" in err and "llama-3.1-70b" in err and "model" in err


def test_unknown_device_lists_valid(tmp_path, capsys):
    err = _err(["run", _scenario(tmp_path, BASE.replace("h100-sxm", "h900"))], capsys)
    assert "topologies.a.device" in err and "'h900'" in err and "a100-80gb-sxm" in err


@pytest.mark.parametrize("rate", ["-1", "0"])
def test_bad_rate(tmp_path, capsys, rate):
    err = _err(["run", _scenario(tmp_path, BASE), "--set", f"workload.rate={rate}"], capsys)
    assert "workload.rate" in err and rate in err


def test_missing_trace_file(tmp_path, capsys):
    text = BASE.replace("{arrival: poisson, rate: 2, num_requests: 5, prompt_tokens: 100, output_tokens: 10}",
                        "{arrival: trace, trace: {path: nope.csv}}")
    err = _err(["run", _scenario(tmp_path, text)], capsys)
    assert "nope.csv" in err


def test_malformed_trace_row_names_file_and_line(tmp_path, capsys):
    (tmp_path / "t.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n0.5,ten,5\n")
    text = BASE.replace("{arrival: poisson, rate: 2, num_requests: 5, prompt_tokens: 100, output_tokens: 10}",
                        "{arrival: trace, trace: {path: t.csv}}")
    err = _err(["run", _scenario(tmp_path, text)], capsys)
    assert "t.csv" in err and "3" in err and "ten" in err


def test_prompt_longer_than_context(tmp_path, capsys):
    err = _err(["run", _scenario(tmp_path, BASE.replace("prompt_tokens: 100", "prompt_tokens: 200000"))], capsys)
    assert "workload.prompt_tokens" in err and "200000" in err and "context" in err


def test_weights_do_not_fit(tmp_path, capsys):
    text = BASE.replace("llama-3.1-8b", "llama-3.1-70b")
    err = _err(["run", _scenario(tmp_path, text)], capsys)
    assert "do not fit" in err and "h100-sxm" in err


def test_disaggregated_without_decode_pool(tmp_path, capsys):
    text = BASE.replace("{kind: colocated, replicas: 1, device: h100-sxm}",
                        "{kind: disaggregated, prefill: {instances: 1}}")
    err = _err(["run", _scenario(tmp_path, text)], capsys)
    assert "topologies.a.decode" in err


def test_zero_bandwidth_link(tmp_path, capsys):
    text = BASE.replace("{kind: colocated, replicas: 1, device: h100-sxm}",
                        "{kind: disaggregated, prefill: {}, decode: {}, kv_link: {bandwidth_GBps: 0}}")
    err = _err(["run", _scenario(tmp_path, text)], capsys)
    assert "kv_link.bandwidth_GBps" in err and "0" in err


def test_decode_device_cannot_hold_weights(tmp_path, capsys):
    text = BASE.replace("llama-3.1-8b", "qwen2.5-32b").replace(
        "{kind: colocated, replicas: 1, device: h100-sxm}",
        "{kind: disaggregated, prefill: {device: h200}, decode: {device: l40s}}")
    err = _err(["run", _scenario(tmp_path, text)], capsys)
    assert "topologies.a.decode.device" in err and "l40s" in err


def test_yaml_syntax_error_names_line(tmp_path, capsys):
    err = _err(["run", _scenario(tmp_path, BASE + "  b: {kind: [\n")], capsys)
    assert "s.yaml" in err and "YAML" in err


def test_missing_scenario_file(capsys):
    err = _err(["run", "/nonexistent/x.yaml"], capsys)
    assert "/nonexistent/x.yaml" in err


def test_estimate_json(capsys):
    assert main(["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm", "--prefill", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bound"] == "compute" and out["time_s"] > 0 and "qkv" in out["ops"]
    assert main(["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm", "--decode-batch", "64",
                 "--context", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bound"] == "memory"
    assert sum(op["time_s"] for op in out["ops"].values()) == pytest.approx(out["time_s"], rel=1e-9)
