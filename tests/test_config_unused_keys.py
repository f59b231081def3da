"""Scenario keys that would do nothing are errors, and validation errors name the real reason.

A key the chosen arrival process never reads (``workload.rate`` with ``arrival: trace``) used to be
ignored silently, so a sweep over it reported identical rows as if they were results.  Each case here
is one line naming the file, the key and the value."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from conftest import REPO
from pdsim import config, plan
from pdsim.__main__ import main
from pdsim.errors import ConfigError

TRACE = str(REPO / "scenarios/traces/azure_code_10min.csv")


def _raw(**workload) -> dict:
    return {"model": "llama-3.1-8b", "workload": workload,
            "topologies": {"c": {"kind": "colocated", "device": "h100-sxm"}}}


def _error(raw: dict) -> str:
    with pytest.raises(ConfigError) as e:
        config.parse(copy.deepcopy(raw), "s.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("s.yaml: "), msg
    return msg


TRACE_W = {"arrival": "trace", "trace": {"path": TRACE}, "num_requests": 10}
POISSON_W = {"arrival": "poisson", "rate": 2, "num_requests": 10}
CLOSED_W = {"arrival": "closed", "clients": 4, "num_requests": 10}

# (workload, key, value, words the hint must hold)
UNUSED = [
    (TRACE_W, "rate", 100, "trace.rate_scale"),
    (TRACE_W, "duration_s", 30, "trace.duration_s"),
    (TRACE_W, "prompt_tokens", 500, "trace"),
    (TRACE_W, "output_tokens", {"dist": "uniform", "low": 1, "high": 9}, "trace"),
    (TRACE_W, "cv", 2.0, "gamma"),
    (TRACE_W, "clients", 8, "closed"),
    (TRACE_W, "think_s", 1.0, "closed"),
    (POISSON_W, "trace", {"path": TRACE}, "arrival: trace"),
    (POISSON_W, "clients", 8, "closed"),
    (POISSON_W, "cv", 2.0, "gamma"),
    (POISSON_W, "think_s", 1.0, "closed"),
    ({**POISSON_W, "arrival": "constant"}, "cv", 0.5, "gamma"),
    ({**POISSON_W, "arrival": "gamma"}, "clients", 3, "closed"),
    (CLOSED_W, "rate", 5, "clients"),
    (CLOSED_W, "duration_s", 60, "horizon_s"),
    (CLOSED_W, "cv", 2.0, "gamma"),
    (CLOSED_W, "trace", {"path": TRACE}, "arrival: trace"),
]


@pytest.mark.parametrize("w,key,value,hint", UNUSED,
                         ids=[f"{w['arrival']}-{k}" for w, k, _, _ in UNUSED])
def test_a_key_the_arrival_does_not_read_is_an_error(w, key, value, hint):
    msg = _error(_raw(**{**w, key: value}))
    assert f"workload.{key}" in msg and f"arrival: {w['arrival']}" in msg and "not used" in msg, msg
    assert hint in msg, msg
    if not isinstance(value, dict):
        assert repr(value) in msg, msg


def test_the_reviewers_sweep_over_rate_on_a_trace_fails(tmp_path, capsys):
    p = tmp_path / "az.yaml"
    p.write_text(f"model: llama-3.1-8b\nworkload: {{arrival: trace, trace: {{path: {TRACE}}}, num_requests: 10}}\n"
                 "topologies:\n  c: {kind: colocated, device: h100-sxm}\n")
    rc = main(["run", str(p), "--quiet", "--out", str(tmp_path / "o"), "--set", "workload.rate=100"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "az.yaml: workload.rate = 100: not used with arrival: trace" in err, err


@pytest.mark.parametrize("w", [
    TRACE_W, {**TRACE_W, "timeout_s": 5},                       # num_requests caps a trace; timeout_s: every arrival
    {**POISSON_W, "duration_s": 10, "timeout_s": 3, "prompt_tokens": 100, "output_tokens": 10},
    {**POISSON_W, "arrival": "gamma", "cv": 3.0},
    {**POISSON_W, "arrival": "constant", "duration_s": 4},
    {**CLOSED_W, "think_s": 0.5, "prompt_tokens": 100},
    {**POISSON_W, "conversation": {"turns": 3, "think_s": 2}},
    {"arrival": "poisson", "duration_s": 10, "rate_curve": {"hourly": [1, 2]}},
    # an explicit null is the key left out
    {**TRACE_W, "rate": None, "duration_s": None}, {**POISSON_W, "trace": None, "clients": None},
])
def test_keys_the_arrival_reads_are_accepted(w):
    config.parse(_raw(**copy.deepcopy(w)), "s.yaml")


def test_defaults_do_not_count():
    sc = config.parse(_raw(**TRACE_W), "s.yaml")
    assert sc.workload.cv == 1.0 and sc.workload.prompt_tokens.value == 512     # defaults are there, unused


SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_scenario_and_plan_validates(path):
    raw = config.read_yaml(path)
    if "search" in raw:
        plan.parse_plan(raw, str(path), base_dir=path.parent)
    else:
        config.load(path)


# --- speculative decoding ---------------------------------------------------------------------
def _spec_raw(model, spec, where="colocated") -> dict:
    pool = {"device": "h100-sxm", "speculative": spec}
    topo = {"kind": "colocated", **pool} if where == "colocated" else \
        {"kind": "disaggregated", "prefill": {"device": "h100-sxm"}, "decode": pool}
    return {"model": model, "workload": POISSON_W, "topologies": {"t": topo}}


@pytest.mark.parametrize("acc,words", [
    ({"dist": "beta", "mean": 0.99, "std": 0.5}, "std"),
    ({"dist": "beta", "mean": 0.9, "std": 0.35}, "std**2 < mean*(1-mean)"),
    ({"dist": "uniform", "low": 0.9, "high": 0.1}, "low <= high"),
    ({"dist": "uniform", "low": 0.2}, "low <= high"),
    ({"dist": "normal", "mean": 0.5}, "'uniform' or 'beta'"),
])
def test_a_bad_acceptance_distribution_says_why(acc, words):
    msg = _error(_spec_raw("llama-3.1-8b", {"method": "draft", "draft_cost_fraction": 0.1, "acceptance": acc}))
    assert "topologies.t.speculative.acceptance" in msg and words in msg, msg
    assert "valid number" not in msg, msg


@pytest.mark.parametrize("acc,words", [(1.5, "less than or equal to 1"), ("high", "valid number")])
def test_a_bad_acceptance_number_still_says_so(acc, words):
    msg = _error(_spec_raw("llama-3.1-8b", {"method": "draft", "draft_cost_fraction": 0.1, "acceptance": acc}))
    assert "topologies.t.speculative.acceptance = " in msg and words in msg, msg


# --- MTP head ----------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["colocated", "disaggregated"])
def test_mtp_needs_a_model_with_an_mtp_head(where):
    msg = _error(_spec_raw("llama-3.1-8b", {"method": "mtp", "k": 2, "acceptance": 0.8}, where))
    key = "topologies.t.speculative.method" if where == "colocated" else "topologies.t.decode.speculative.method"
    assert f"{key} = 'mtp'" in msg and "llama-3.1-8b" in msg and "deepseek-v3" in msg, msg


def test_mtp_on_a_model_with_an_mtp_head_is_accepted():
    sc = config.parse(_spec_raw("deepseek-v3", {"method": "mtp", "k": 1}), "s.yaml")
    assert sc.topologies["t"].speculative.method == "mtp"


INLINE = {"name": "tiny", "layers": 4, "hidden": 512, "heads": 8, "kv_heads": 8, "mlp_width": 1024, "vocab": 1000}


def test_inline_model_declares_its_mtp_head():
    msg = _error(_spec_raw(dict(INLINE), {"method": "mtp"}))
    assert "speculative.method = 'mtp'" in msg and "tiny" in msg and "mtp_layers" in msg, msg
    config.parse(_spec_raw({**INLINE, "mtp_layers": 1}, {"method": "mtp"}), "s.yaml")


def test_draft_method_needs_no_mtp_head():
    config.parse(_spec_raw("llama-3.1-8b", {"method": "draft", "draft_model": "llama-3.2-1b"}), "s.yaml")


# --- conversation -----------------------------------------------------------------------------
@pytest.mark.parametrize("conv,key,words", [
    ({"system_prompts": 0, "system_tokens": 200}, "system_prompts = 0", "at least 1"),
    ({"system_prompts": 4, "system_tokens": 0}, "system_tokens = 0", "at least 1"),
    ({"system_tokens": 200}, "system_tokens = 200", "system_prompts"),
    ({"system_prompts": 4}, "system_prompts = 4", "system_tokens"),
])
def test_conversation_system_prompt_errors_name_the_key(conv, key, words):
    msg = _error(_raw(**POISSON_W, conversation=conv))
    assert f"workload.conversation.{key}" in msg and words in msg, msg
    if 0 in conv.values():                   # both were given: the problem is the 0
        assert "give both" not in msg, msg


def test_conversation_without_system_prompts_is_fine():
    config.parse(_raw(**POISSON_W, conversation={"system_prompts": 0, "system_tokens": 0}), "s.yaml")
    config.parse(_raw(**POISSON_W, conversation={"system_prompts": 2, "system_tokens": 100}), "s.yaml")


# --- a file that is not a scenario --------------------------------------------------------------
def _run_err(path, capsys) -> str:
    rc = main(["run", str(path), "--quiet", "--out", "/nonexistent-never-written"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_running_a_device_profile_says_what_it_is(capsys):
    prof = REPO / "calibration/profiles/h100-vidur.yaml"
    err = _run_err(prof, capsys)
    assert "is a device profile, not a scenario" in err and ".device: PATH" in err and "h100-vidur.yaml" in err, err


def test_running_a_plan_says_what_it_is(capsys):
    err = _run_err(REPO / "scenarios/plan-chat-llama8b.yaml", capsys)
    assert "is a plan, not a scenario" in err and "pdsim plan" in err, err


def test_a_scenario_with_a_stray_kind_is_still_a_scenario(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text("kind: colocated\nmodel: llama-3.1-8b\nworkload: {arrival: poisson, rate: 1, num_requests: 3}\n"
                 "topologies:\n  c: {kind: colocated}\n")
    err = _run_err(p, capsys)
    assert "kind: not a key at this level" in err, err


def test_a_burst_after_the_run_is_refused():
    """A burst at 500 s of a 30 s run never fires: one line naming the burst's at_s, not a run without it."""
    from pdsim import config
    from pdsim.errors import ConfigError
    raw = {"model": "llama-3.1-8b",
           "workload": {"arrival": "poisson", "duration_s": 30,
                        "rate_curve": {"points": [[0, 1], [30, 2]],
                                       "bursts": [{"at_s": 10, "duration_s": 5, "multiplier": 2},
                                                  {"at_s": 500, "duration_s": 5, "multiplier": 2}]}},
           "topologies": {"c": {"kind": "colocated"}}}
    with pytest.raises(ConfigError) as e:
        config.parse(raw, "s.yaml")
    assert "workload.rate_curve.bursts.1.at_s = 500" in str(e.value) and "duration_s 30 s" in str(e.value)
    raw["workload"]["rate_curve"]["bursts"].pop()
    config.parse(raw, "s.yaml")          # the one inside the run is fine


def test_a_summarys_full_scenario_dump_parses_back(tmp_path):
    """summary.json keeps the scenario as a full dump, every default written out (cv 1.0 under a trace, lengths
    under a closed loop...): those values are the defaults, so they are not 'set' and the dump parses back; a
    value other than the default under an arrival that never reads it is still refused."""
    for name in ("prefix_mooncake_chat.yaml", "quickstart.yaml"):
        sc = config.load(str(REPO / "scenarios" / name))
        dumped = sc.model_dump(mode="json")
        dumped.pop("base_dir", None)
        again = config.parse(dumped, "summary.json", base_dir=str(REPO / "scenarios"))
        assert again.workload == sc.workload, name
    raw = {"model": "llama-3.1-8b", "workload": {"arrival": "poisson", "rate": 1, "num_requests": 5, "cv": 2.0},
           "topologies": {"c": {"kind": "colocated"}}}
    with pytest.raises(ConfigError, match="workload.cv = 2"):
        config.parse(raw, "s.yaml")
    raw["workload"]["cv"] = 1.0             # the default: nothing is lost by leaving it
    config.parse(raw, "s.yaml")
