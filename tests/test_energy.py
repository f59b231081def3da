"""Energy (pdsim/energy.py): idle pools, busy runs worked out by hand, the power-cap law, bad input.

Oracles: idle power x time for a pool that never runs a step; for a cost model whose every step
takes a known time at known FLOPs and bytes, idle x span + (max - idle) x u x busy time summed by
hand; the cube-law clock fraction computed here; the roofline stretch max(c / f, m) / max(c, m).
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pdsim import topology
from pdsim.costmodel import CostModel, StepCost
from pdsim.devices import get_device
from pdsim.energy import CappedCost, PowerModel, clock_fraction
from pdsim.errors import ConfigError
from pdsim.metrics import requests_frame, summarize
from pdsim.simulation import simulate

from conftest import scenario

H100 = get_device("h100-sxm")
IDLE, MAX = H100.spec.power.idle_W, H100.spec.power.max_W
PF, PB = H100.peak_flops("bf16"), H100.mem_bw_Bps


class FixedCost(CostModel):
    """Every step takes ``step_s`` at a fraction ``mfu`` of peak FLOP/s and ``mbu`` of bandwidth (per GPU)."""

    def __init__(self, step_s, mfu, mbu, tp=1):
        self.step_s, self.tp = step_s, tp
        self.flops, self.bytes = mfu * PF * step_s, mbu * PB * step_s
        self.compute_dtype = "bf16"

    def step(self, tokens, attn_work, kv_read_tokens, sampled, batch):
        return StepCost(self.step_s, self.flops, self.bytes)

    def decode_steps(self, batch, attn0, kv0, k):
        return np.full(k, self.step_s), np.full(k, self.flops), np.full(k, self.bytes)

    def weight_bytes_per_gpu(self):
        return 0.0


def _fixed(monkeypatch, step_s, mfu, mbu):
    monkeypatch.setattr(topology, "make_cost", lambda pool, *a, **k: FixedCost(step_s, mfu, mbu, pool.tp))


def _summary(sc, fast=True):
    res = simulate(sc, fast=fast)
    return res, summarize(res, requests_frame(res), sc)


def test_idle_pool_energy_is_idle_power_times_time():
    # one-token outputs finish at the prefill instance: the decode pool (2 instances x tp 2) never runs a step
    topos = {"pd": {"kind": "disaggregated", "prefill": {"device": "h100-sxm"},
                    "decode": {"instances": 2, "tp": 2, "device": "h100-sxm"}}}
    res, s = _summary(scenario(topos, num_requests=5, output_tokens=1))
    span = res[0].sim_end_s
    assert span > 0
    dec = s["pd"]["energy"]["pools"]["decode"]
    assert dec["energy_J"] == 4 * IDLE * span          # exactly: 4 GPUs at idle power for the whole run
    assert dec["active_energy_J"] == 0.0
    assert s["pd"]["energy"]["pools"]["prefill"]["active_energy_J"] > 0


def test_busy_constant_cost_energy_by_hand(monkeypatch):
    # one request, prompt 100, 10 output tokens, FCFS: 1 prefill + 9 decode steps of 10 ms each at
    # MFU 0.3, MBU 0.1: the step draws idle + (max - idle) x 0.3
    _fixed(monkeypatch, 0.01, 0.3, 0.1)
    sc = scenario({"c": {"kind": "colocated", "device": "h100-sxm", "tp": 2}}, num_requests=1, arrival="constant",
                  rate=1.0, prompt_tokens=100, output_tokens=10)
    res, s = _summary(sc)
    span = res[0].sim_end_s
    assert span == pytest.approx(1.0 + 10 * 0.01, abs=1e-12)        # arrives at 1 s, 10 steps
    e = s["c"]["energy"]
    expect = 2 * (IDLE * span + (MAX - IDLE) * 0.3 * 10 * 0.01)
    assert e["energy_J"] == pytest.approx(expect, rel=1e-12)
    assert e["J_per_request"] == pytest.approx(expect, rel=1e-12)
    assert e["J_per_output_token"] == pytest.approx(expect / 10, rel=1e-12)
    assert e["output_tokens_per_s_per_kW"] == pytest.approx((10 / span) / (expect / span / 1e3), rel=1e-12)
    assert e["provisioned_kW"] == 2 * MAX / 1e3


@pytest.mark.parametrize("mfu,mbu,u", [(0.2, 0.6, 0.6), (2.0, 0.1, 1.0)])
def test_busy_energy_uses_the_busier_unit_and_fast_path_agrees(monkeypatch, mfu, mbu, u):
    # 300 output tokens: the decode steps run in fast-path windows; u = min(1, max(MFU, MBU))
    _fixed(monkeypatch, 0.005, mfu, mbu)
    sc = scenario({"c": {"kind": "colocated", "device": "h100-sxm"}}, num_requests=1, arrival="constant", rate=1.0,
                  prompt_tokens=50, output_tokens=300)
    res, s = _summary(sc)
    assert res[0].topology.instances[0].windows > 0
    span = res[0].sim_end_s
    expect = IDLE * span + (MAX - IDLE) * u * 300 * 0.005
    assert s["c"]["energy"]["energy_J"] == pytest.approx(expect, rel=1e-9)
    _, slow = _summary(sc, fast=False)
    assert slow["c"]["energy"]["energy_J"] == pytest.approx(expect, rel=1e-9)


def test_clock_fraction_cube_law():
    assert clock_fraction(70, 700, 700) == 1.0 == clock_fraction(70, 700, 900)
    assert clock_fraction(70, 700, 385) == pytest.approx(0.5 ** (1 / 3))      # half the dynamic power
    assert clock_fraction(70, 700, 148.75) == pytest.approx(0.5)             # 1/8 of it: half the clock


def test_capped_cost_slows_compute_not_memory():
    f = 0.5
    pm = PowerModel(70, 148.75, "test", PF * f, PB, f, 148.75)
    compute = FixedCost(0.01, 0.8, 0.1)          # roofline: c = 8 ms, m = 1 ms
    memory = FixedCost(0.01, 0.05, 0.8)          # c = 0.5 ms, m = 8 ms
    assert CappedCost(compute, pm).step(1, 0, 0, 1, 1).time_s == pytest.approx(0.01 * (0.008 / f) / 0.008)
    assert CappedCost(memory, pm).step(1, 0, 0, 1, 1).time_s == pytest.approx(0.01)   # max(1 ms, 8 ms) unchanged
    balanced = FixedCost(0.01, 0.6, 0.5)         # c = 6 ms -> 12 ms, m = 5 ms: 12/6
    t, _, _ = CappedCost(balanced, pm).decode_steps(1, 0, 0, 3)
    assert np.allclose(t, 0.02)


def test_power_cap_in_a_run_lowers_power_and_slows_prefill():
    topos = {"full": {"kind": "colocated", "device": "h100-sxm"},
             "capped": {"kind": "colocated", "device": "h100-sxm", "power_cap_W": 300}}
    sc = scenario(topos, num_requests=1, arrival="constant", rate=1.0, prompt_tokens=4000, output_tokens=2)
    res, s = _summary(sc)
    ttft = {r.name: r.requests[0].first_token_s - r.requests[0].arrival_s for r in res}
    f = ((300 - IDLE) / (MAX - IDLE)) ** (1 / 3)
    assert s["capped"]["energy"]["pools"]["replica"]["clock_fraction"] == pytest.approx(f)
    # a 4000-token prefill is compute-bound: slower by up to 1/f (kernel overheads and memory-bound ops do not stretch)
    assert ttft["full"] < ttft["capped"] <= ttft["full"] / f * (1 + 1e-9)
    assert ttft["capped"] > ttft["full"] * (1 + 0.5 * (1 / f - 1))
    assert s["capped"]["energy"]["pools"]["replica"]["max_W_per_gpu"] == 300


@pytest.mark.parametrize("pool,key", [
    ({"device": "h100-sxm", "power_cap_W": 50}, "power_cap_W"),           # below idle
    ({"device": "cpu-epyc-2c", "power_cap_W": 100}, "power_cap_W"),        # no power model
    ({"device": "h100-sxm", "power_cap_W": -1}, "power_cap_W"),
    ({"device": "h100-sxm", "power_cap_W": 199}, "power_cap_W"),          # below 200 of 700 W: boards refuse it
    ({"device": "h100-sxm", "power_cap_W": 701}, "power_cap_W"),          # above the board's 700 W: does nothing
])
def test_bad_power_cap_is_one_line(pool, key):
    with pytest.raises(ConfigError) as e:
        simulate(scenario({"c": {"kind": "colocated", **pool}}, num_requests=2))
    assert "\n" not in str(e.value) and key in str(e.value)


def test_profile_power_max_below_idle_is_rejected(tmp_path):
    raw = H100.spec.model_dump(exclude_none=True)
    raw["power"] = {"idle_W": 500, "max_W": 400, "source": "test"}
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as e:
        get_device(str(p))
    assert "power" in str(e.value) and "\n" not in str(e.value)


def test_device_without_power_model_reports_no_energy():
    sc = scenario({"c": {"kind": "colocated", "device": "cpu-epyc-2c", "kv_blocks": 200}}, num_requests=1,
                  prompt_tokens=10, output_tokens=2)
    _, s = _summary(sc)
    assert s["c"]["energy"] is None


def test_report_shows_the_energy_of_summary_json(tmp_path):
    from pdsim.__main__ import main
    from pdsim.charts import num
    from conftest import REPO
    out = tmp_path / "run"
    rc = main(["run", str(REPO / "scenarios/quickstart.yaml"), "--out", str(out), "--quiet",
               "--set", "workload.num_requests=40"])
    assert rc in (0, 1)
    s = json.loads((out / "summary.json").read_text())["topologies"]
    html = (out / "report.html").read_text()
    assert "Energy (estimated" in html
    cards = re.findall(r"<dt>J per output token \(est\.\)</dt><dd>([^<]*)</dd><dt>out tok/s per kW \(est\.\)</dt>"
                       r"<dd>([^<]*)</dd>", html)
    assert len(cards) == len(s)
    for t, (j_tok, tok_kw) in zip(s.values(), cards):      # cards in summary order
        e = t["energy"]
        assert e["energy_J"] > 0
        assert (j_tok, tok_kw) == (num(e["J_per_output_token"]), num(e["output_tokens_per_s_per_kW"]))
        assert f">{num(e['J_per_request'])}<" in html        # the energy table


def test_power_caps_at_the_boards_limits():
    """H100 SXM: 200 W (2/7 of its 700 W) and 700 W are the board's limits and run; 199 W and 701 W are refused
    with the limit named."""
    for cap in (200, 700):
        simulate(scenario({"c": {"kind": "colocated", "device": "h100-sxm", "power_cap_W": cap}}, num_requests=1))
    with pytest.raises(ConfigError, match="lowest cap a board accepts, 200 W"):
        simulate(scenario({"c": {"kind": "colocated", "device": "h100-sxm", "power_cap_W": 199}}, num_requests=1))
    with pytest.raises(ConfigError, match="maximum power \\(700 W\\)"):
        simulate(scenario({"c": {"kind": "colocated", "device": "h100-sxm", "power_cap_W": 701}}, num_requests=1))


def test_energy_per_request_covers_the_same_requests_as_the_energy_under_warmup(monkeypatch):
    """Two requests (constant rate 1/s: arrivals at 1 s and 2 s), prompt 100, 10 output tokens each, every step
    10 ms at MFU 0.3: each request is 1 prefill + 9 decode steps, 1.0-1.1 s and 2.0-2.1 s, so the run spans
    2.1 s and one GPU uses E = 70 W x 2.1 s + (700 - 70) W x 0.3 x 20 x 0.01 s = 147 + 37.8 = 184.8 J.
    ``client.warmup_requests: 1`` leaves the first request out of latency figures, but its joules are in E:
    per request E / 2 = 92.4 J and per output token E / 20 = 9.24 J (the old code gave E / 1 and E / 10,
    the whole run's energy over the second request alone)."""
    _fixed(monkeypatch, 0.01, 0.3, 0.1)
    from pdsim import config
    sc = config.parse({"seed": 0, "model": "llama-3.1-8b",
                       "workload": {"arrival": "constant", "rate": 1.0, "num_requests": 2, "prompt_tokens": 100,
                                    "output_tokens": 10},
                       "client": {"warmup_requests": 1},
                       "topologies": {"c": {"kind": "colocated", "device": "h100-sxm"}}}, "t.yaml")
    res = simulate(sc)
    s = summarize(res, requests_frame(res, sc.client), sc)["c"]
    assert s["warmup_excluded"] == 1 and res[0].sim_end_s == pytest.approx(2.1, abs=1e-12)
    assert (IDLE, MAX) == (70, 700)
    e = s["energy"]
    assert e["energy_J"] == pytest.approx(184.8, rel=1e-12)
    assert e["J_per_request"] == pytest.approx(92.4, rel=1e-12)
    assert e["J_per_output_token"] == pytest.approx(9.24, rel=1e-12)
    # 20 tokens in 2.1 s over 184.8 J / 2.1 s = 0.088 kW: 20 / 0.1848 tokens/s per kW
    assert e["output_tokens_per_s_per_kW"] == pytest.approx(20 / 0.1848, rel=1e-12)


def test_provisioned_kw_is_the_peak_alive_at_once_at_the_cap_where_set():
    """A PD pair of one-GPU H100 instances on a schedule: prefill 1 -> 2 at 10 s and back to 1 at 20 s (idle at
    1 request/s of 100 + 10 tokens: it leaves at once), decode 1 -> 2 at 30 s.  The prefill pool is capped at
    300 W, decode runs at its 700 W TDP.  Alive at once: 10-20 s 2 x 300 + 1 x 700 = 1300 W, from 30 s
    1 x 300 + 2 x 700 = 1700 W, so 1.7 kW provisioned; each pool's own peak summed (2 x 300 + 2 x 700 = 2.0 kW,
    the old figure) counts GPUs that were never alive together."""
    from pdsim import config
    sc = config.parse({"seed": 0, "model": "llama-3.1-8b",
                       "workload": {"arrival": "constant", "rate": 1.0, "num_requests": 40, "prompt_tokens": 100,
                                    "output_tokens": 10},
                       "slo": {"ttft_s": 1.0, "tpot_s": 0.1},
                       "topologies": {"pd": {
                           "kind": "disaggregated",
                           "prefill": {"instances": 1, "device": "h100-sxm", "power_cap_W": 300},
                           "decode": {"instances": 1, "device": "h100-sxm"},
                           "kv_link": {"bandwidth_GBps": 50, "latency_us": 10},
                           "autoscaler": {"policy": "schedule", "provisioning_s": 0, "load_s": 0,
                                          "schedule": [{"at_s": 10, "prefill": 2}, {"at_s": 20, "prefill": 1},
                                                       {"at_s": 30, "decode": 2}]}}}}, "t.yaml")
    res, s = _summary(sc)
    s = s["pd"]
    tl = {n: [(x["t_s"], x["alive"]) for x in p["timeline"]] for n, p in s["autoscaling"]["pools"].items()}
    assert tl == {"prefill": [(0.0, 1), (10.0, 2), (20.0, 1)], "decode": [(0.0, 1), (30.0, 2)]}
    assert s["gpus"] == 3
    assert s["energy"]["provisioned_kW"] == pytest.approx(1.7, rel=1e-12)


def test_a_power_cap_over_a_pipelined_mla_pool_prices_its_mixed_steps_as_the_stages_do():
    # A pipelined pool's stages price a mixed MLA step whole (no separate decodes); a power cap wraps them and
    # took ``decodes`` from its own signature, so the first mixed step of DeepSeek-V3 at pp 2 under a cap
    # raised TypeError.  Whether to split is now asked of every layer of the wrapping.  A cap these small
    # steps never reach (500 W on a 700 W H200) throttles nothing: every latency equals the uncapped run's.
    from conftest import scenario

    from pdsim import metrics
    from pdsim.costmodel import splits_mla_steps
    from pdsim.simulation import simulate

    base = {"kind": "colocated", "device": "h200", "tp": 8, "ep": 8, "pp": 2, "kv_blocks": 2000}
    out = []
    for extra in ({}, {"power_cap_W": 500}):
        sc = scenario({"t": {**base, **extra}}, model="deepseek-v3", num_requests=4, rate=50, prompt_tokens=600,
                      output_tokens=20).model_copy(update={"weight_dtype": "fp8"})
        res = simulate(sc)
        inst = res[0].topology.instances[0]
        assert not splits_mla_steps(inst.cost) and isinstance(inst.cost, CappedCost) == bool(extra)
        df = metrics.requests_frame(res)
        assert (df.status == "finished").all()
        out.append(df[["ttft_s", "tpot_s", "e2e_s"]].to_numpy())
    assert np.array_equal(out[0], out[1])
