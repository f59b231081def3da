"""workload.shared_prefix_tokens: every synthetic prompt starts with the same tokens (vllm bench serve's
--random-prefix-len, a shared system prompt), which a pool with prefix caching reuses.  Hash chains and
timings worked out by hand under a linear cost model."""
from __future__ import annotations

import pytest

from pdsim.errors import ConfigError
from pdsim.simulation import simulate
from pdsim.validate import row_scenario
from pdsim.workload import shared_prefix_ids

from conftest import scenario

LIN = {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-6}


def test_shared_prefix_ids_by_hand():
    # 24 shared tokens at 16 per id: one whole shared unit (id 0); fresh ids start at 24 // 16 = 1.
    # 40 tokens: id 0, then 24 tokens of its own -> 2 fresh (1, 2); 20 tokens: id 0 + 4 own -> 1 fresh (3);
    # 8 tokens (all inside the shared part, but no whole unit): 1 fresh (4).  A partial unit is never shared:
    # the shared part counts in whole 16-token units, rounded down (an engine with 1-token pages, SGLang's
    # radix cache, would reuse those 8 tokens; pdsim does not: the cost of ids per token).
    assert shared_prefix_ids([40, 20, 8], 24) == [[0, 1, 2], [0, 3], [4]]
    # everything shared (prompt == shared): the same chain for every request
    assert shared_prefix_ids([32, 32], 32) == [[0, 1], [0, 1]]
    assert shared_prefix_ids([33, 32], 32) == [[0, 1, 2], [0, 1]]
    # a shared part longer than a prompt: the prompt is all shared
    assert shared_prefix_ids([16, 48], 1000) == [[0], [0, 1, 2]]


def _closed(shared: int, cache: bool = True, block: int = 16):
    topo = {"kind": "colocated", "replicas": 1, "kv_blocks": 1600 // block, "block_size": block, "cost_model": LIN}
    if cache:
        topo["prefix_cache"] = {"enabled": True}
    sc = scenario({"t": topo}, arrival="closed", clients=1, num_requests=2, prompt_tokens=160, output_tokens=2,
                  **({"shared_prefix_tokens": shared} if shared else {}))
    return simulate(sc)[0].requests


@pytest.mark.parametrize("shared,cached", [(160, 144), (64, 64), (70, 64), (0, 0)])
def test_a_closed_loop_client_reuses_the_shared_prefix_by_hand(shared, cached):
    """One client, two 160-token prompts in a row.  The first computes all 160 tokens: 0.01 + 160 x 1e-4
    + 160 x 1e-6 s to its first token.  The second finds the shared part's whole blocks cached (all 160
    shared: 9 blocks = 144, the last block holding the token to compute is computed again; 64 or 70 shared:
    4 blocks = 64) and computes the rest, attention still over all 160 tokens."""
    a, b = _closed(shared)
    assert a.first_token_s - a.arrival_s == pytest.approx(0.01 + 160e-4 + 160e-6, abs=1e-12)
    assert (a.cached_tokens, b.cached_tokens) == (0, cached)
    assert b.first_token_s - b.arrival_s == pytest.approx(0.01 + (160 - cached) * 1e-4 + 160e-6, abs=1e-12)


@pytest.mark.parametrize("block,shared,cached", [
    (32, 24, 0),      # no whole 32-token block inside the shared part
    (32, 64, 64),     # two blocks
    (32, 160, 128),   # all shared: whole blocks below the last token, 159 // 32 x 32
    (1, 160, 159),    # 1-token pages: every token but the last
    (1, 24, 16),      # the shared part in whole 16-token units: 16 of its 24 tokens
])
def test_engine_block_sizes_other_than_the_units_by_hand(block, shared, cached):
    a, b = _closed(shared, block=block)
    assert (a.cached_tokens, b.cached_tokens) == (0, cached)
    assert b.first_token_s - b.arrival_s == pytest.approx(0.01 + (160 - cached) * 1e-4 + 160e-6, abs=1e-12)


def test_without_prefix_caching_the_shared_prefix_changes_nothing_and_says_so():
    with pytest.warns(UserWarning, match="no pool caches prefixes"):
        a, b = _closed(160, cache=False)
    assert b.cached_tokens == 0
    assert b.first_token_s - b.arrival_s == pytest.approx(0.01 + 160e-4 + 160e-6, abs=1e-12)


@pytest.mark.parametrize("extra,says", [
    ({"arrival": "trace", "trace": {"path": "t.csv"}}, "not with arrival: trace"),
    ({"conversation": {"turns": 2}}, "not with conversation"),
    ({"shared_prefix_tokens": -1}, "shared_prefix_tokens"),
])
def test_shared_prefix_tokens_refused_where_it_has_no_meaning(extra, says):
    w = {"shared_prefix_tokens": 64, **extra}
    with pytest.raises(ConfigError, match=says):
        scenario(**w)


def test_validate_rows_can_state_a_shared_prefix():
    r = {"id": "x", "model": "llama-3.1-8b", "device": "h200", "engine": "vllm-v1", "tp": 1, "weight_dtype": "fp8",
         "kv_dtype": "fp8", "isl": 1000, "osl": 100, "concurrency": 4}
    plain = row_scenario(r)
    assert plain.workload.shared_prefix_tokens == 0 and not plain.topologies["t"].prefix_on
    sc = row_scenario(r, shared_prefix=512)
    assert sc.workload.shared_prefix_tokens == 512 and sc.topologies["t"].prefix_on


def test_validate_and_its_cli_simulate_the_stated_shared_prefix(tmp_path, capsys):
    """One client sending four 1000-token prompts with 992 tokens in common (62 units): from the second
    request on, 992 tokens come from the cache, so the mean TTFT falls; validate.json records the setting."""
    import csv
    import json

    from pdsim.__main__ import main
    from pdsim.validate import read_measured, validate
    path = tmp_path / "s.csv"
    cols = ["id", "silicon_data_source", "backend", "backend_version", "model_path", "system", "precision", "mode",
            "isl", "osl", "batch_size", "tp_size", "silicon_ttft_ms", "silicon_tpot_ms"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerow({"id": "one", "silicon_data_source": "made-up; silicon_concurrency=1", "backend": "vllm",
                    "backend_version": "0.10.1", "model_path": "meta-llama/Llama-3.1-8B-Instruct", "system": "h100_sxm",
                    "precision": "", "mode": "agg", "isl": 1000, "osl": 8, "batch_size": 1, "tp_size": 1,
                    "silicon_ttft_ms": 50.0, "silicon_tpot_ms": 5.0})
    rows = read_measured(path)
    fresh = validate(rows, requests_per_client=4, client_mode="sync")
    shared = validate(rows, requests_per_client=4, client_mode="sync", shared_prefix=992)
    assert shared["settings"]["shared_prefix_tokens"] == 992 and fresh["settings"]["shared_prefix_tokens"] == 0
    t_fresh, t_shared = fresh["rows"][0]["sim_ttft_ms"], shared["rows"][0]["sim_ttft_ms"]
    # three of the four prefills compute 8 tokens instead of 1000: the mean TTFT drops to well under half
    assert t_shared < 0.5 * t_fresh
    assert main(["validate", str(path), "--out", str(tmp_path / "o"), "--quiet", "--requests-per-client", "4",
                 "--client", "sync", "--shared-prefix-tokens", "992"]) == 0
    summary = json.loads((tmp_path / "o" / "validate.json").read_text())
    assert summary["settings"]["shared_prefix_tokens"] == 992
    assert "share their first 992 tokens" in (tmp_path / "o" / "validate.html").read_text()
    with open(tmp_path / "o" / "validate.csv") as f:
        (row,) = csv.DictReader(f)
    assert float(row["sim_ttft_ms"]) == pytest.approx(t_shared, rel=1e-9)


# --- the engines' default prefix caching (engines.engine_prefix_cache) ------------------------------------------
def _engine_run(pool_extra: dict, engine: str = "vllm-v1", shared: int = 160, kind: str = "colocated",
                model: str = "llama-3.1-8b"):
    from pdsim import config
    from pdsim.metrics import requests_frame, summarize
    pool = {"device": "h100-sxm", "engine": engine, **pool_extra}
    topo = ({"kind": "colocated", "replicas": 1, **pool} if kind == "colocated" else
            {"kind": "disaggregated", "prefill": {"instances": 1, **pool}, "decode": {"instances": 1, **pool}})
    w = {"arrival": "closed", "clients": 1, "num_requests": 2, "prompt_tokens": 160, "output_tokens": 4}
    if shared:
        w["shared_prefix_tokens"] = shared
    sc = config.parse({"seed": 0, "model": model, "workload": w, "topologies": {"t": topo}}, "t.yaml")
    res = simulate(sc)
    return res[0], summarize(res, requests_frame(res, sc.client), sc)["t"]


@pytest.mark.parametrize("engine,cached", [
    ("vllm-v1", 144),    # 16-token blocks: 159 // 16 x 16
    ("sglang", 159),     # 1-token pages: every token but the last
    ("trtllm", 128),     # 32-token blocks: 159 // 32 x 32 (TRT-LLM's partial reuse of a last, partly matched
                         # block, enable_partial_reuse, is not modelled: the engine would reuse more)
    ("vllm-v0", 0),      # vLLM v0 had automatic prefix caching off by default
])
def test_engine_presets_cache_prefixes_as_the_engines_do_by_default(engine, cached):
    import warnings
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res, summary = _engine_run({}, engine)
    # the "nothing caches" warning fires for vLLM v0 only
    assert [str(w.message).split(":")[0] for w in seen if "shared_prefix" in str(w.message)] == \
        ([] if cached else ["workload.shared_prefix_tokens = 160"])
    assert [r.cached_tokens for r in res.requests] == [0, cached]
    if cached:
        assert summary["prefix_cache"]["enabled_by"] == {"replica": f"engine default ({engine})"}
    else:
        assert "prefix_cache" not in summary


def test_a_prefix_cache_key_overrides_the_engine_default():
    with pytest.warns(UserWarning, match="no pool caches prefixes"):
        off, summary = _engine_run({"prefix_cache": {"enabled": False}})
    assert [r.cached_tokens for r in off.requests] == [0, 0] and "prefix_cache" not in summary
    on, summary = _engine_run({"prefix_cache": {"enabled": True}}, engine="vllm-v0")
    assert [r.cached_tokens for r in on.requests] == [0, 144]
    assert summary["prefix_cache"]["enabled_by"] == {"replica": "scenario"}


def test_engine_default_caching_only_where_it_can_matter():
    # no content ids in the stream: the plain KV pool (a cache would find nothing)
    plain, summary = _engine_run({}, shared=0)
    assert not plain.topology.instances[0].kv.prefix_on and "prefix_cache" not in summary
    # disaggregated: the prefill pool caches by default, the decode pool keeps its own key
    pd, summary = _engine_run({}, kind="disaggregated")
    assert [r.cached_tokens for r in pd.requests] == [0, 144]
    assert summary["prefix_cache"]["enabled_by"] == {"prefill": "engine default (vllm-v1)"}
    assert not pd.topology.decode.instances[0].kv.prefix_on
    # prefix_cache: null (as summary.json writes a pool's scenario back) is the default, not "off"
    again, summary = _engine_run({"prefix_cache": None})
    assert [r.cached_tokens for r in again.requests] == [0, 144]
    # a model with sliding-window layers, which pdsim cannot cache for: the default stays off (no error)
    with pytest.warns(UserWarning, match="does not model prefix caching with sliding-window layers"):
        swa, summary = _engine_run({"tp": 4}, model="gpt-oss-120b", engine="vllm-v1")
    assert [r.cached_tokens for r in swa.requests] == [0, 0] and "prefix_cache" not in summary


def test_ideal_cached_tokens_by_hand():
    from pdsim.simulation import ideal_cached_tokens
    from pdsim.workload import Request
    reqs = [Request(0, 0.0, 48, 2, hash_ids=[1, 2, 3], hash_block_tokens=16),
            Request(1, 0.0, 48, 2, hash_ids=[1, 2, 4], hash_block_tokens=16),   # ids 1, 2 seen: 32
            Request(2, 0.0, 48, 2, hash_ids=[1, 2, 3], hash_block_tokens=16),   # all 3 seen: 48, less its last: 47
            Request(3, 0.0, 40, 2),                                            # no ids: 0
            Request(4, 0.0, 48, 2, hash_ids=[9, 2, 3], hash_block_tokens=16)]  # its first id unseen: 0
    assert ideal_cached_tokens(reqs).tolist() == [0, 32, 47, 0, 0]


def test_a_plan_judges_and_bounds_what_a_run_will_simulate():
    """plan.evaluate builds the topology as `pdsim run` does (engine-default prefix caching on a stream with
    content ids), and the plan's analytic bound takes each prompt at its ideal hit, so it stays an upper
    bound.  Two 160-token prompts 1 s apart, all shared, vLLM v1 under a linear cost model: the second finds
    144 tokens cached."""
    from pdsim import config
    from pdsim.plan import evaluate
    from pdsim.simulation import simulate
    sc = {"name": "x", "seed": 0, "model": "llama-3.1-8b",
          "workload": {"arrival": "constant", "rate": 1, "num_requests": 2, "prompt_tokens": 160, "output_tokens": 2,
                       "shared_prefix_tokens": 160},
          "slo": {"ttft_s": 0.02, "tpot_s": 1.0, "attainment_target": 0.5},
          "topologies": {"c": {"kind": "colocated", "replicas": 1, "engine": "vllm-v1", "cost_model": LIN,
                               "kv_blocks": 100, "device": "h100-sxm"}}}
    run = simulate(config.parse(sc, "x"))[0].requests
    ttft = [r.first_token_s - r.arrival_s for r in run]
    # as simulated: the first prompt whole, the second 16 tokens; the 20 ms bound between the two
    assert [r.cached_tokens for r in run] == [0, 144] and ttft[1] < 0.02 < ttft[0]
    r = evaluate({"scenario": sc, "base_dir": ".", "early": None})
    assert (r["ttft_ok"], r["ttft_p"]) == (1, max(ttft))      # p90 of two by nearest rank: the larger


@pytest.mark.parametrize("engine", ["vllm-v1", "trtllm"])
def test_a_cache_on_a_stream_without_content_ids_changes_no_timing(engine):
    """Why id-less streams keep the plain KV pool: with no ids nothing can be found cached, so a run with the
    cache on gives the same times as with it off (an invariance, not a hand value; 40 Poisson requests)."""
    from pdsim import config
    runs = []
    for on in (True, False):
        sc = config.parse({"seed": 3, "model": "llama-3.1-8b",
                           "workload": {"arrival": "poisson", "rate": 20, "num_requests": 40,
                                        "prompt_tokens": {"dist": "uniform", "low": 100, "high": 3000},
                                        "output_tokens": {"dist": "uniform", "low": 2, "high": 200}},
                           "topologies": {"t": {"kind": "colocated", "replicas": 1, "device": "h100-sxm",
                                                "engine": engine, "prefix_cache": {"enabled": on}}}}, "t.yaml")
        res = simulate(sc)[0]
        assert res.topology.instances[0].kv.prefix_on == on
        runs.append([(r.first_token_s, r.finish_s) for r in res.requests])
    assert runs[0] == runs[1]


def test_the_report_says_who_turned_the_cache_on():
    from pdsim.report import _prefix_section
    pc = {"hit_rate": 0.5, "gpu_hit_rate": 0.5, "host_hit_rate": 0.0, "tokens_saved": 10, "prefill_flops_saved": None,
          "transfer_bytes_saved": 0.0}
    by = {"t": {"prefix_cache": {**pc, "enabled_by": {"replica": "engine default (vllm-v1)"}}},
          "u": {"prefix_cache": {**pc, "enabled_by": {"prefill": "scenario"}}}}
    html = _prefix_section(by)["table"]
    assert "<th>cached by</th>" in html
    assert ">replica: engine default (vllm-v1)</td>" in html and ">prefill: scenario</td>" in html


def test_a_run_says_on_stderr_that_the_engine_default_caches(capsys):
    from pdsim import config
    sc = config.parse({"seed": 0, "model": "llama-3.1-8b",
                       "workload": {"arrival": "closed", "clients": 1, "num_requests": 2, "prompt_tokens": 160,
                                    "output_tokens": 4, "shared_prefix_tokens": 160},
                       "topologies": {"t": {"kind": "colocated", "replicas": 1, "device": "h100-sxm",
                                            "engine": "sglang"}}}, "t.yaml")
    simulate(sc, progress=True)
    assert "pdsim: t: replica pool caches prefixes (sglang default); prefix_cache: {enabled: false} turns it off" \
        in capsys.readouterr().err
