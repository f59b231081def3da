"""TTFT mechanisms worked by hand: what a closed-loop benchmark counts (the cold first wave) and
TensorRT-LLM's in-flight batching without chunked prefill (``scheduler: inflight``).

Every expected value below is computed in the comments, step by step, not read off a run."""
from __future__ import annotations

from collections import deque

import pytest

from pdsim.kvcache import KVCache
from pdsim.scheduler import SCHEDULERS, Limits
from pdsim.validate import client_mode_for, read_measured, row_scenario, simulate_row
from pdsim.workload import Request

from test_validate import _silicon


# --- the client: a long run's mean leaves the cold first wave out ----------------------------------------
def _vllm_row(tmp_path, source="x/aic-auto-gap-analysis/y; silicon_concurrency=3", **kw):
    row = {"id": "r", "backend": "vllm", "backend_version": "0.12.0", "isl": 8192, "osl": 3,
           "silicon_data_source": source, "batch_size": 3, "silicon_ttft_ms": 20.0, "silicon_tpot_ms": 10.0, **kw}
    (r, why), = read_measured(_silicon(tmp_path / "s.csv", [row]))
    assert why is None
    return r


def test_client_mode_auto_is_steady_only_for_silicon_rows_of_an_unknown_harness(tmp_path):
    r = _vllm_row(tmp_path)
    assert r["harness"] == "unknown" and client_mode_for(r) == "steady"
    imax = _vllm_row(tmp_path, source="2026-04-06.csv; silicon_concurrency=8", isl=1024, osl=1024)
    assert imax["harness"] == "inferencemax" and client_mode_for(imax) == "sync"   # 10 x CONC, all counted
    assert client_mode_for({"source": "vllm"}) == "sync"            # a vllm bench serve JSON counts every request
    assert client_mode_for(r, "sync") == "sync" and client_mode_for(imax, "steady") == "steady"
    from pdsim.errors import ConfigError
    with pytest.raises(ConfigError):
        client_mode_for(r, "lockstep")


def test_steady_mean_leaves_out_the_first_wave_by_hand(tmp_path):
    """vLLM v1 preset (chunked, token budget 8192), a constant 10 ms step, 3 clients, 8192-token prompts
    (exactly the budget), 3 output tokens, 16 requests (min_requests).  A request sent when a step ends
    misses the step that starts at that instant (the engine forms it first).  Steps (ms; A, B, C the
    clients, A2 A's second request):

    - [0,10]    A's whole prompt (8192)                      -> A first token at 10
    - [10,20]   A decode (1), B's first 8191 tokens
    - [20,30]   A decode -> A done at 30; B's last token -> B first token at 30; C's first 8190
    - [30,40]   B decode; C's last 2 -> C first token at 40 (A2, sent at 30, missed this step)
    - [40,50]   B decode -> B done at 50; C decode; A2's first 8190
    - [50,60]   C decode -> C done at 60; A2's last 2 -> A2 first token at 60 (TTFT 30)
    - [60,70]   A2 decode; B2 (sent at 50) 8191
    - [70,80]   A2 decode -> A2 done at 80; B2's last 1 -> B2 first token at 80 (TTFT 30); C2 8190 ...

    From A2 on the pattern repeats every 50 ms with each client in turn: every later request's TTFT is
    30 ms (it waits out one step, then its prompt is split over two by the decodes sharing the budget),
    and every request decodes one token per 10 ms step (TPOT 10 ms).  The first wave's TTFTs are 10, 30
    and 40 ms, so the mean over all 16 (``sync``) is (10 + 30 + 40 + 13 x 30) / 16 = 29.375 ms; ``steady``
    leaves out the first 3 to finish (A at 30, B at 50, C at 60: exactly the first wave): 30 ms over 13."""
    r = _vllm_row(tmp_path)
    cost = {"kind": "constant", "step_s": 0.010}
    from pdsim.simulation import simulate
    reqs = sorted(simulate(row_scenario(r, requests_per_client=4, cost_model=cost))[0].requests,
                  key=lambda q: (q.arrival_s, q.first_token_s))
    assert len(reqs) == 16
    first = [(round(q.arrival_s * 1e3, 6), round(q.first_token_s * 1e3, 6), round(q.finish_s * 1e3, 6))
             for q in reqs[:5]]
    assert first == [(0, 10, 30), (0, 30, 50), (0, 40, 60), (30, 60, 80), (50, 80, 100)]
    sync = simulate_row(r, requests_per_client=4, client_mode="sync", cost_model=cost)
    steady = simulate_row(r, requests_per_client=4, cost_model=cost)        # auto -> steady for this row
    assert steady["client_mode"] == "steady" and sync["client_mode"] == "sync"
    assert sync["sim_ttft_ms"] == pytest.approx((10 + 30 + 40 + 13 * 30) / 16, abs=1e-9)
    assert (sync["sim_finished"], steady["sim_finished"]) == (16, 13)
    assert steady["sim_ttft_ms"] == pytest.approx(30.0, abs=1e-9)
    assert steady["sim_tpot_ms"] == pytest.approx(10.0, abs=1e-9) == sync["sim_tpot_ms"]
    # throughput: all 16 x 3 output tokens over the run's span in both modes (steady keeps the first wave's)
    assert steady["sim_throughput_tok_s"] == pytest.approx(sync["sim_throughput_tok_s"])


# --- TensorRT-LLM in-flight batching without chunked prefill -----------------------------------------------
def _decoding(rid, prompt, kv):
    """A request that has its prompt's KV and one output token: its next step is a 1-token decode."""
    q = Request(rid, 0.0, prompt, 10)
    assert kv.grow(q, prompt + 1)
    q.computed, q.generated = prompt, 1
    return q


def _state():
    kv = KVCache(1000, 16)
    running = [_decoding(1, 10, kv), _decoding(2, 10, kv)]
    waiting = deque([Request(3, 0.0, 60, 5), Request(4, 0.0, 50, 5), Request(5, 0.0, 5, 5)])
    return running, waiting, kv, Limits(max_running=256, max_batched_tokens=100)


def _plan(name):
    running, waiting, kv, limits = _state()
    plan = SCHEDULERS[name](running, waiting, kv, limits)
    return [(q.id, n) for q, n in plan.items], plan.tokens


def test_inflight_decodes_first_then_whole_prompts_until_one_does_not_fit():
    """Budget 100, two running decodes, waiting prompts of 60, 50 and 5 tokens (in that order).

    - inflight: decodes 1 + 1 (98 left); the 60-token prompt fits whole (38 left); the 50-token one
      does not and stops admission, so the 5-token prompt behind it waits too: 62 tokens.
    - chunked (vLLM v1): the same, but the 50-token prompt gets a 38-token chunk: 100 tokens.
    - fcfs (prefill first): prompts only, 60 (40 left), then 50 > 40 stops: 60 tokens, no decode."""
    assert _plan("inflight") == ([(1, 1), (2, 1), (3, 60)], 62)
    assert _plan("chunked") == ([(1, 1), (2, 1), (3, 60), (4, 38)], 100)
    assert _plan("fcfs") == ([(3, 60)], 60)


def test_inflight_prompt_over_the_budget_runs_alone_and_waits_behind_decodes():
    """A 150-token prompt with a 100-token budget: with a running decode it cannot join (150 > 99) and the
    step is the decode alone; with nothing running it runs whole, alone (TensorRT-LLM would refuse a
    context over max_num_tokens; pdsim, as for fcfs, runs it alone rather than never)."""
    kv = KVCache(1000, 16)
    limits = Limits(max_running=256, max_batched_tokens=100)
    big = Request(9, 0.0, 150, 5)
    running, waiting = [_decoding(1, 10, kv)], deque([big])
    plan = SCHEDULERS["inflight"](running, waiting, kv, limits)
    assert [(q.id, n) for q, n in plan.items] == [(1, 1)] and list(waiting) == [big]
    plan = SCHEDULERS["inflight"]([], deque([big]), kv, limits)
    assert [(q.id, n) for q, n in plan.items] == [(9, 150)] and plan.tokens == 150


def test_inflight_is_a_pool_scheduler(tmp_path):
    """``scheduler: inflight`` parses and runs: one client, linear cost 1 ms per token, 100-token prompts and
    4 output tokens: TTFT = 100 ms (the whole prompt in one step), TPOT = 1 ms (one token per decode step)."""
    from pdsim import config
    from pdsim.simulation import simulate
    sc = config.parse({"model": "llama-3.1-8b",
                       "workload": {"arrival": "closed", "clients": 1, "num_requests": 3, "prompt_tokens": 100,
                                    "output_tokens": 4},
                       "topologies": {"t": {"kind": "colocated", "scheduler": "inflight",
                                            "cost_model": {"kind": "linear", "per_token_s": 0.001}}}}, "t")
    assert sc.topologies["t"].scheduler_name == "inflight"
    for q in simulate(sc)[0].requests:
        assert q.first_token_s - q.arrival_s == pytest.approx(0.100)
        assert (q.finish_s - q.first_token_s) / 3 == pytest.approx(0.001)


def test_validate_cli_offers_every_client_mode_and_passes_it_on(monkeypatch, tmp_path):
    # `pdsim validate --client MODE` reaches validate(); its choices are validate.CLIENT_MODES
    import pdsim.validate as V
    from pdsim.__main__ import main
    seen = {}

    def fake_validate(rows, **kw):
        seen.update(kw)
        raise SystemExit(0)
    monkeypatch.setattr(V, "validate", fake_validate)
    monkeypatch.setattr(V, "read_measured", lambda path, defaults: [({"id": "r", "device": "h100-sxm"}, None)])
    f = tmp_path / "m.csv"
    f.write_text("x\n")
    for mode in V.CLIENT_MODES:
        try:
            main(["validate", str(f), "--client", mode, "--out", str(tmp_path / "o"), "--quiet"])
        except SystemExit:
            pass
        assert seen.get("client_mode") == mode


def test_validate_refuses_an_unknown_client_mode_once_instead_of_skipping_every_row():
    import pdsim.validate as V
    from pdsim.errors import ConfigError
    with pytest.raises(ConfigError, match="client_mode"):
        V.validate([({"id": "r"}, None)], client_mode="bogus")
