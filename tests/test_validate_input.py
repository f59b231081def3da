"""Bad or inexpressible measured input for ``pdsim validate`` and ``pdsim calibrate --from-benchmark``:
one clear line or a counted, stated skip reason, never a traceback and never a silently wrong run."""
from __future__ import annotations

import csv
import json

import pytest

from pdsim.__main__ import main
from pdsim.validate import read_measured, validate

OK = {"model_id": "meta-llama/Llama-3.1-8B-Instruct", "completed": 20, "total_input_tokens": 2560,
      "total_output_tokens": 180, "max_concurrency": 1, "mean_ttft_ms": 30.0, "mean_tpot_ms": 7.0,
      "gpu": "h100", "tp": 1}


def _json(tmp_path, name, **fields):
    p = tmp_path / name
    p.write_text(json.dumps({**OK, **fields}))
    return p


def _why(path, defaults=None):
    (r, why), = read_measured(path, defaults or {})
    return r, why


# --- request_rate: an open-loop run is not the closed loop pdsim simulates ------------------------------------
def test_a_finite_request_rate_is_an_open_loop_run_and_is_skipped(tmp_path):
    p = _json(tmp_path, "rr.json", request_rate=0.5, max_concurrency=64, burstiness=1.0)
    _, why = _why(p)
    assert why == "open_loop_rate: request_rate = 0.5"
    # vllm writes "inf" for an unlimited rate: the closed loop at max_concurrency, as without the key
    for rate in ("inf", None):
        r, why = _why(_json(tmp_path, "rrinf.json", request_rate=rate, max_concurrency=4))
        assert why is None and r["concurrency"] == 4
    res = validate(read_measured(p))
    assert res["counts"]["skipped_by_reason"] == {"open_loop_rate": 1} and res["counts"]["simulated"] == 0


def test_genai_perf_request_rate_stimulus_is_an_open_loop_run(tmp_path):
    p = tmp_path / "gp.json"
    p.write_text(json.dumps({"time_to_first_token": {"avg": 30}, "inter_token_latency": {"avg": 7},
                             "input_sequence_length": {"avg": 128}, "output_sequence_length": {"avg": 9},
                             "input_config": {"model": "meta-llama/Llama-3.1-8B-Instruct",
                                              "perf_analyzer": {"stimulus": {"request_rate": 2}}}}))
    assert _why(p, {"device": "h100", "tp": 1})[1] == "open_loop_rate: request_rate = 2"


def test_calibrate_skips_open_loop_rows_too(tmp_path, capsys):
    files = [str(_json(tmp_path, f"r{i}.json", request_rate=0.5)) for i in range(3)]
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--from-benchmark", *files, "--out", str(out), "--quiet"]) == 1
    assert not out.exists()
    assert "open_loop_rate: 3" in capsys.readouterr().err


# --- malformed values: a stated skip naming the key and value, never a traceback ------------------------------
BAD_VLLM = [("total_input_tokens", "abc"), ("total_input_tokens", [1]), ("input_lens", "abc"),
            ("input_lens", [1, None]), ("precision", 8), ("engine", 1), ("gpu", ["h100"]), ("tp", 1.5),
            ("max_concurrency", "many"), ("mean_ttft_ms", "fast"), ("request_rate", "often"), ("request_rate", -1),
            ("completed", {"a": 1})]


@pytest.mark.parametrize("key,value", BAD_VLLM)
def test_a_malformed_vllm_field_skips_the_row_naming_key_and_value(tmp_path, key, value):
    r, why = _why(_json(tmp_path, "bad.json", **{key: value}))
    assert why.startswith(f"bad_value: {key} = {value!r}: "), why
    assert r["source"] == "vllm" and r["id"] == "bad.json"
    res = validate([(r, why)])
    assert res["counts"]["skipped_by_reason"] == {"bad_value": 1}


def test_numeric_strings_read_as_numbers_like_the_other_fields(tmp_path):
    # mean_ttft_ms "30" was always read as 30; total_input_tokens "2560" (a traceback before) likewise
    r, why = _why(_json(tmp_path, "s.json", total_input_tokens="2560", mean_ttft_ms="30"))
    assert why is None and r["isl"] == 128 and r["ttft_ms"] == 30.0


@pytest.mark.parametrize("cfg", ["x", {"model": 5}, {"model": ["m"], "perf_analyzer": "pa"},
                                 {"model": ["m"], "perf_analyzer": {"stimulus": {"concurrency": "two"}}}])
def test_a_malformed_genai_perf_input_config_skips_the_row(tmp_path, cfg):
    p = tmp_path / "gp.json"
    p.write_text(json.dumps({"time_to_first_token": {"avg": 30}, "inter_token_latency": {"avg": 7},
                             "input_sequence_length": {"avg": 128}, "output_sequence_length": {"avg": 9},
                             "input_config": cfg}))
    _, why = _why(p, {"device": "h100", "tp": 1})
    assert why.startswith("bad_value: input_config"), why


def test_the_cli_names_file_key_and_value_of_a_bad_row_and_goes_on(tmp_path, capsys):
    bad = _json(tmp_path, "bad.json", precision=8)
    good = _json(tmp_path, "good.json")
    out = tmp_path / "o"
    assert main(["validate", str(bad), str(good), "--out", str(out), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    line, = [x for x in captured.err.splitlines() if "bad.json" in x]
    assert "precision = 8" in line and "not a string" in line
    assert "'bad_value': 1" in captured.out
    with open(out / "skipped.csv") as f:
        assert [(r["id"], r["reason"].split(":")[0]) for r in csv.DictReader(f)] == [("bad.json", "bad_value")]


def test_a_silicon_row_with_a_fractional_isl_is_skipped_not_truncated(tmp_path):
    p = tmp_path / "s.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "backend", "backend_version", "model_path", "system", "precision", "mode", "isl", "osl",
                    "tp_size", "pp_size", "batch_size", "silicon_ttft_ms", "silicon_tpot_ms", "silicon_data_source"])
        base = ["vllm", "0.10.0", "meta-llama/Llama-3.1-8B-Instruct", "h100_sxm", "bf16", "agg"]
        w.writerow(["frac", *base, "512.7", 32, 1, 1, 2, 40, 8, "x"])
        w.writerow(["ttft", *base, 512, 32, 1, 1, 2, "abc", 8, "x"])
        w.writerow(["whole", *base, "512.0", 32, 1, 1, 2, 40, 8, "x"])
        w.writerow(["tp16", *base, 512, 32, 16, 1, 2, 40, 8, "x"])
    (a, wa), (b, wb), (c, wc), (d, wd) = read_measured(p)
    assert wa == "bad_value: isl = '512.7': not a whole number"
    assert wb == "bad_value: silicon_ttft_ms = 'abc': not a number"
    assert wc is None and c["isl"] == 512
    # dense instances over 8 GPUs are skipped as MoE ones are (README: instances over 8 GPUs)
    assert wd == "multi_node_tp"


def test_a_dense_vllm_run_over_8_gpus_is_skipped(tmp_path):
    assert _why(_json(tmp_path, "tp16.json", tp=16))[1] == "multi_node_tp"
    assert _why(_json(tmp_path, "tp8.json", tp=8))[1] is None


# --- OSL 1: no inter-token gap to compare ---------------------------------------------------------------------
def test_one_token_replies_print_no_tpot_instead_of_nan(tmp_path, capsys):
    # vllm's mean_tpot_ms of a 1-token run is 0: the row still has a TTFT to compare
    p = _json(tmp_path, "osl1.json", completed=2, total_input_tokens=256, total_output_tokens=2, mean_tpot_ms=0)
    r, why = _why(p)
    assert why is None and r["osl"] == 1 and r["tpot_ms"] is None
    assert main(["validate", str(p), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "no TPOT: 1-token replies" in printed and "nan" not in printed


# --- flags checked before any row is read ---------------------------------------------------------------------
@pytest.mark.parametrize("flag,value,known", [("--engine", "bogus", "sglang"), ("--device", "h999", "h100-sxm"),
                                              ("--tp", "0", "1..8"), ("--tp", "16", "1..8")])
def test_validate_flags_are_checked_up_front(tmp_path, capsys, flag, value, known):
    p = tmp_path / "run.json"
    p.write_text(json.dumps({k: v for k, v in OK.items() if k not in ("gpu", "tp")}))
    assert main(["validate", str(p), flag, value, "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{flag} = " in err and value in err and known in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag,value", [("--engine", "bogus"), ("--gpu", "h999"), ("--tp", "16")])
def test_calibrate_flags_are_checked_up_front(tmp_path, capsys, flag, value):
    p = _json(tmp_path, "run.json")
    assert main(["calibrate", "--from-benchmark", str(p), flag, value, "--out", str(tmp_path / "c.yaml"),
                 "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{flag} = " in err and value in err


# --- calibrate with nothing usable ----------------------------------------------------------------------------
def test_calibrate_with_nothing_usable_writes_nothing_and_says_why_even_quiet(tmp_path, capsys):
    files = []
    for i in range(3):
        p = tmp_path / f"run{i}.json"
        p.write_text(json.dumps({k: v for k, v in OK.items() if k != "tp"}))
        files.append(str(p))
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--from-benchmark", *files, "--gpu", "h100-sxm", "--engine", "vllm-v1",
                 "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert not out.exists()
    assert "wrote" not in err
    line, = [x for x in err.splitlines() if x.strip()]
    assert "missing_tp: 3" in line and str(out) in line


def test_engine_names_as_tools_spell_them():
    """'TensorRT-LLM' (as benchmark JSONs and GenAI-Perf spell it) and its other spellings are TensorRT-LLM;
    vllm takes v0 or v1 by version; an engine pdsim has no preset for stays unknown."""
    from pdsim.validate import _engine
    for name in ("TensorRT-LLM", "tensorrt_llm", "TRT-LLM", " trtllm "):
        assert _engine(name, "") == "trtllm", name
    assert (_engine("vllm", "0.7.3"), _engine("vllm", "0.10.1"), _engine("SGLang", "")) == ("vllm-v0", "vllm-v1", "sglang")
    assert _engine("lmdeploy", "") is None
