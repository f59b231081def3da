"""TensorRT-LLM's attention-DP balance (a DP-attention pool's ``attention_dp_balance``, scheduler.BalancedDP):
requests keep the rank they joined, each rank schedules its own token budget, and new prompts wait until every
rank has one or ``timeout_iters`` steps have passed (the count runs on every step and restarts when prompts
go), plus ``batching_wait_iters`` steps once every rank has one while all decode.

Oracles: exact timelines worked by hand with a constant cost model (every step 1 s, so a step's end is
the number of steps so far), TensorRT-LLM's rules as its ``_balance_adp_requests`` states them; the rank
placement rule by hand; per-rank step parts by hand; conservation (every request finishes, every block
comes back) on random streams.
"""
from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pdsim import config, metrics
from pdsim.costmodel import ranked_parts
from pdsim.errors import ConfigError
from pdsim.scheduler import assign_rank
from pdsim.simulation import simulate
from pdsim.validate import harness_engine_config

from conftest import run_trace


def _run(tmp_path, rows, balance, budget=200, scheduler="inflight", tp=2, **extra):
    pool = {"tp": tp, "ep": tp, "dp_attention": True, "kv_blocks": 1000,
            "cost_model": {"kind": "constant", "step_s": 1.0}, "scheduler": scheduler, "max_batched_tokens": budget}
    if balance is not None:
        pool["attention_dp_balance"] = balance
    return run_trace(tmp_path, "qwen3-30b-a3b", {**pool, **extra}, rows)


def test_a_prompt_on_one_rank_waits_for_the_step_count_by_hand(tmp_path):
    """Two requests at t=0 go to ranks 0 and 1 (no rank has a decode: no hold) and prefill in step 1; the
    count then runs 1 (t=1), 2 (t=2), 3 = timeout (t=3: restart).  A prompt arriving at 3.5 joins rank 0
    (ranks tie on tokens and requests); at t=4 and t=5 only rank 0 has a prompt (count 1, 2): held; at t=6
    the count reaches 3 and it goes: first token at 7, TTFT 3.5 s (without the balance: admitted at 4,
    TTFT 1.5 s).  Its 3 tokens: 7, 8, 9."""
    rows = ["0,10,20", "0,10,20", "3.5,10,3"]
    reqs, _ = _run(tmp_path, rows, {"timeout_iters": 3, "batching_wait_iters": 0})
    assert [r.rank for r in reqs] == [0, 1, 0]
    assert [r.first_token_s for r in reqs] == [1.0, 1.0, 7.0]
    assert reqs[2].finish_s == 9.0 and reqs[0].finish_s == 20.0
    plain, _ = _run(tmp_path, rows, None)
    assert plain[2].first_token_s == 5.0


def test_once_every_rank_has_a_prompt_they_wait_the_batching_steps_by_hand(tmp_path):
    """Two prompts at 3.5 join ranks 0 and 1; every rank has one and every rank decodes, so with
    batching_wait_iters 2 they wait the steps at t=4 and t=5 and go at t=6 (first token 7); with 0 they go
    at t=4 (first token 5): the timeout plays no part once every rank has a prompt."""
    rows = ["0,10,20", "0,10,20", "3.5,10,3", "3.5,10,3"]
    reqs, _ = _run(tmp_path, rows, {"timeout_iters": 3, "batching_wait_iters": 2})
    assert [r.rank for r in reqs] == [0, 1, 0, 1]
    assert [r.first_token_s for r in reqs[2:]] == [7.0, 7.0]
    reqs, _ = _run(tmp_path, rows, {"timeout_iters": 100, "batching_wait_iters": 0})
    assert [r.first_token_s for r in reqs[2:]] == [5.0, 5.0]


def test_prompts_on_every_rank_restart_the_step_count_by_hand(tmp_path):
    """Timeout 3: the count is 1 at t=1; two prompts arriving at 1.5 (ranks 0, 1) go at t=2 and restart it
    (0), so it runs 1, 2, 3 at t=3, 4, 5: a prompt arriving at 3.5 on rank 0 goes at t=5 (first token 6).
    Had the count not restarted it would have reached 3 at t=4."""
    rows = ["0,10,30", "0,10,30", "1.5,10,20", "1.5,10,20", "3.5,10,3"]
    reqs, _ = _run(tmp_path, rows, {"timeout_iters": 3, "batching_wait_iters": 0})
    assert [r.rank for r in reqs] == [0, 1, 0, 1, 0]
    assert [r.first_token_s for r in reqs] == [1.0, 1.0, 3.0, 3.0, 6.0]


def test_a_prompt_part_way_counts_as_its_ranks_prompt_by_hand(tmp_path):
    """Chunked, 100 tokens per rank, timeout 100.  C (250 tokens, rank 0) and D (10, rank 1) arrive at 1.5:
    every rank has a prompt, they go at t=2 (C computes 99 beside A's decode).  E (rank 1: fewer tokens)
    arrives at 2.5; at t=3 rank 0 is still part-way through C, so every rank has a prompt and E goes at
    once (first token 4), while C takes 99 then 52 (first token 5).  Were C counted as a decode, E would
    wait for the count to reach 100."""
    rows = ["0,10,30", "0,10,30", "1.5,250,3", "1.5,10,20", "2.5,10,3"]
    reqs, _ = _run(tmp_path, rows, {"timeout_iters": 100, "batching_wait_iters": 0}, scheduler="chunked")
    assert [r.rank for r in reqs] == [0, 1, 0, 1, 1]
    assert [r.first_token_s for r in reqs] == [1.0, 1.0, 5.0, 3.0, 4.0]


def test_a_rank_with_no_decode_lets_prompts_go_at_once(tmp_path):
    """A lone request: no rank decodes, so nothing is held however long the timeout (TensorRT-LLM lets
    prompts through when some rank has no generation request)."""
    reqs, _ = _run(tmp_path, ["0,10,4"], {"timeout_iters": 1000, "batching_wait_iters": 1000})
    assert reqs[0].first_token_s == 1.0 and reqs[0].finish_s == 4.0


def test_each_rank_schedules_its_own_budget_by_hand(tmp_path):
    """Budget 200 over 2 ranks: 100 tokens per rank.  80 -> rank 0, 10 -> rank 1, then 95 -> rank 1 (the rank
    with fewer tokens): 10 + 95 > 100, so it waits a step though the instance's 200 would hold all three
    (timeout 0: nothing held by the balance).  Without the balance all three prefill in step 1."""
    rows = ["0,80,5", "0,10,5", "0,95,5"]
    reqs, _ = _run(tmp_path, rows, {"timeout_iters": 0, "batching_wait_iters": 0})
    assert [r.rank for r in reqs] == [0, 1, 1]
    assert [r.first_token_s for r in reqs] == [1.0, 1.0, 2.0]
    plain, _ = _run(tmp_path, rows, None)
    assert [r.first_token_s for r in plain] == [1.0, 1.0, 1.0]


def test_a_prompt_larger_than_its_ranks_budget_runs_alone_there(tmp_path):
    """A 150-token prompt on a 100-token rank: whole (inflight), alone on its rank; with chunked prefill it
    takes 100 then 50 tokens (first token at the end of step 2)."""
    reqs, _ = _run(tmp_path, ["0,150,3"], {"timeout_iters": 0, "batching_wait_iters": 0})
    assert reqs[0].first_token_s == 1.0
    reqs, _ = _run(tmp_path, ["0,150,3"], {"timeout_iters": 0, "batching_wait_iters": 0}, scheduler="chunked")
    assert reqs[0].first_token_s == 2.0 and reqs[0].finish_s == 4.0


def test_assign_rank_by_hand():
    """Among ranks with fewer requests than the even share max(ceil((n + 1) / R), most held), the fewest
    tokens (prompt + generated), then fewest requests, then the lowest rank; queued requests count."""
    r = lambda rank, p, g=0: NS(rank=rank, prompt_tokens=p, generated=g)    # noqa: E731
    new = NS(rank=-1)
    # share = max(ceil(4 / 2), 2) = 2: only rank 1 (one request) is below it, though it holds more tokens
    assert assign_rank(new, [r(0, 10), r(0, 10), r(1, 500)], [], 2) == 1
    # share 2: ranks 1 and 2 (one each) qualify; rank 2 holds fewer tokens (100 + 50 < 120 + 40)
    assert assign_rank(new, [r(0, 1), r(0, 1), r(1, 120, 40)], [r(2, 100, 50)], 3) == 2
    # all equal: the lowest rank
    assert assign_rank(new, [r(0, 7), r(1, 7)], [], 2) == 0
    # two ranks below the share (3): the fewer prompt tokens wins over the fewer requests
    assert assign_rank(new, [r(0, 1)] * 3 + [r(1, 900)] + [r(2, 10)] * 2, [], 3) == 2
    # prompt tokens only: rank 0's request has generated 100 tokens, yet its prompt (10) is the shorter
    assert assign_rank(new, [r(0, 10, 100), r(1, 50)], [], 2) == 0
    # a waiting request with no rank yet (-1) is not counted
    assert assign_rank(new, [r(0, 7)], [NS(rank=-1, prompt_tokens=5, generated=0)], 2) == 1


def test_ranked_parts_keep_each_request_on_its_rank_by_hand():
    """Rank 0: two decodes at context 100 and 300; rank 1: a 50-token chunk after 20 cached tokens.  Each
    rank's (tokens, attention work, KV read, sampled, requests, decodes part), by hand; a decode-only step
    is None (the proportional share prices it)."""
    d1 = NS(rank=0, computed=100, prompt_tokens=80, generated=21)
    d2 = NS(rank=0, computed=300, prompt_tokens=290, generated=11)
    ch = NS(rank=1, computed=20, prompt_tokens=200, generated=0)
    parts = ranked_parts([(d1, 1), (ch, 50), (d2, 1)], 3)
    assert parts == [(2, 100.5 + 300.5, 101 + 301, 2, 2, (2, 401.0, 402, 2)),
                     (50, 50 * (20 + 25), 70, 0, 1, (0, 0.0, 0, 0))]
    assert ranked_parts([(d1, 1), (d2, 1)], 2) is None


def test_a_balanced_step_is_priced_on_the_ranks_requests_hold():
    """On a roofline cost, a chunk on the rank that already holds decodes costs more than the same chunk
    on an idle rank (the least-loaded placement an unbalanced pool would choose)."""
    from pdsim.costmodel import RooflineCost
    from pdsim.devices import get_device
    from pdsim.models import get_model
    cost = RooflineCost(get_model("deepseek-v3"), get_device("h200"), 8, "fp8", "fp8", 8, 0.0, 1, True)
    decs = [NS(rank=0, computed=4000, prompt_tokens=3990, generated=11) for _ in range(6)]
    for j in (0, 1):
        ch = NS(rank=j, computed=0, prompt_tokens=2000, generated=0)
        items = [(d, 1) for d in decs] + [(ch, 2000)]
        t = sum(n for _, n in items)
        attn = sum(n * (r.computed + 0.5 * n) for r, n in items)
        kvr = sum(r.computed + n for r, n in items)
        cost_j = cost.step(t, attn, kvr, 6, 7, rank=ranked_parts(items, 8)).time_s
        if j == 0:
            same = cost_j
        else:
            apart = cost_j
    assert same > apart


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=12)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 30), rate=st.floats(0.5, 50),
       timeout=st.integers(0, 8), batching=st.integers(0, 4), chunked=st.booleans())
def test_nothing_lost_under_the_balance(seed, n, rate, timeout, batching, chunked):
    """Random streams through a balanced DeepSeek instance with a small KV pool (preemption happens): every
    request finishes exactly once with all its tokens, each on one rank, and every KV block comes back."""
    pool = {"kind": "colocated", "device": "h200", "tp": 4, "ep": 4, "dp_attention": True, "kv_blocks": 240,
            "max_running": 10, "attention_dp_balance": {"timeout_iters": timeout, "batching_wait_iters": batching}}
    pool.update({"chunked_prefill": {"token_budget": 256}} if chunked else {"scheduler": "inflight",
                                                                           "max_batched_tokens": 1024})
    sc = config.parse({"seed": seed, "model": "deepseek-v3", "weight_dtype": "fp8", "kv_dtype": "fp8",
                       "workload": {"rate": rate, "num_requests": n,
                                    "prompt_tokens": {"dist": "uniform", "low": 1, "high": 600},
                                    "output_tokens": {"dist": "uniform", "low": 1, "high": 80}},
                       "topologies": {"t": pool}})
    (res,) = simulate(sc)
    df = metrics.requests_frame([res])
    assert len(df) == n == (df.status == "finished").sum()
    assert all(r.generated == r.output_tokens and 0 <= r.rank < 4 for r in res.requests)
    inst = res.topology.instances[0]
    assert inst.kv.free_blocks == inst.kv.total_blocks
    assert inst.kv.rank_free == [60] * 4 and not inst.kv.owner      # every rank's pool whole again


@pytest.mark.parametrize("pool,words", [
    ({"tp": 2, "ep": 2, "attention_dp_balance": {}}, "needs dp_attention: true"),
    ({"tp": 2, "ep": 2, "dp_attention": True, "scheduler": "fcfs", "attention_dp_balance": {}}, "not fcfs"),
    ({"tp": 2, "ep": 2, "dp_attention": True, "scheduler": "inflight",
      "attention_dp_balance": {"timeout_iters": -1}}, "timeout_iters"),
    ({"tp": 2, "ep": 2, "dp_attention": True, "scheduler": "inflight", "attention_dp_balance": {"timout_iters": 5}},
     "timout_iters"),
])
def test_bad_balance_settings_are_one_clear_error(pool, words):
    with pytest.raises(ConfigError, match=words):
        config.parse({"model": "qwen3-30b-a3b", "workload": {"rate": 1, "num_requests": 2},
                      "topologies": {"t": {"kind": "colocated", **pool}}}, "b.yaml")


def test_balance_with_speculative_decoding_is_refused(tmp_path):
    sc = config.parse({"model": "deepseek-v3", "weight_dtype": "fp8", "kv_dtype": "fp8",
                       "workload": {"rate": 1, "num_requests": 2},
                       "topologies": {"t": {"kind": "colocated", "device": "h200", "tp": 8, "ep": 8,
                                            "dp_attention": True, "scheduler": "inflight",
                                            "attention_dp_balance": {},
                                            "speculative": {"method": "mtp", "k": 1, "acceptance": 0.8}}}},
                      "s.yaml")
    with pytest.raises(ConfigError, match="speculative decoding is not modelled"):
        simulate(sc)


def test_the_harness_config_of_inferencemax_trtllm_dp_rows():
    """InferenceMAX's TensorRT-LLM DP launch: balance at timeout 60 / batching 0, chunked prefill off, and
    max_num_tokens per rank = max(8192, conc + ISL + 64 rounded up to 64); no other row gets anything."""
    row = {"dp_attention": True, "engine": "trtllm", "harness": "inferencemax", "concurrency": 256, "isl": 8192,
           "tp": 8}
    cfg = harness_engine_config(row)
    assert cfg == {"attention_dp_balance": {"timeout_iters": 60, "batching_wait_iters": 0},
                   "scheduler": "inflight", "max_batched_tokens": 8 * 8512}    # 256 + 8192 + 64 = 8512 = 133 x 64
    assert harness_engine_config({**row, "concurrency": 257})["max_batched_tokens"] == 8 * 8576  # 8513 -> 8576
    assert harness_engine_config({**row, "isl": 1024})["max_batched_tokens"] == 8 * 8192
    assert harness_engine_config({**row, "engine": "sglang"}) == {}
    assert harness_engine_config({**row, "harness": "unknown"}) == {}
    assert harness_engine_config({**row, "dp_attention": False}) == {}


def test_a_balanced_instance_prices_a_step_by_its_requests_ranks(tmp_path, monkeypatch):
    """A, B, C at t=0 join ranks 0, 1, 0; B (one output token) leaves after the first step, so A and C
    decode on rank 0 when D arrives at 0.5 s and joins rank 1.  D's prefill step is priced with rank 0
    holding the two decodes and rank 1 D's whole prompt alone (the unbalanced pool's placement would have
    spread the decodes one per rank and put D beside one)."""
    from pdsim.costmodel import RooflineCost
    calls = []
    orig = RooflineCost.step

    def spy(self, *a, **kw):
        calls.append(kw.get("rank"))
        return orig(self, *a, **kw)
    monkeypatch.setattr(RooflineCost, "step", spy)
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,16,50\n0,16,1\n0,16,50\n0.5,900,2\n")
    sc = config.parse({"model": "deepseek-v3", "weight_dtype": "fp8", "kv_dtype": "fp8",
                       "workload": {"arrival": "trace", "trace": {"path": str(trace)}},
                       "topologies": {"t": {"kind": "colocated", "device": "h200", "tp": 2, "ep": 2,
                                            "dp_attention": True, "kv_blocks": 1000, "scheduler": "inflight",
                                            "attention_dp_balance": {"timeout_iters": 0,
                                                                     "batching_wait_iters": 0}}}}, "p.yaml")
    (res,) = simulate(sc)
    assert [r.rank for r in sorted(res.requests, key=lambda r: r.id)] == [0, 1, 0, 1]
    with_d = [c for c in calls if c is not None and any(p[0] == 900 for p in c)]
    assert len(with_d) == 1
    (r0, r1) = with_d[0]
    assert (r0[0], r0[4], r0[5][3]) == (2, 2, 2)          # rank 0: two decodes, nothing else
    assert (r1[0], r1[4], r1[5][3]) == (900, 1, 0)        # rank 1: D's prompt alone
    # decode-only steps too: between B's exit and D's arrival, A and C decode on rank 0, rank 1 idle; such a
    # step takes rank 0's time (two decodes on one GPU), not the even share's (one decode a rank)
    only_a_c = [c for c in calls if c is not None and len(c) == 1 and c[0][4] == 2 and c[0][5][3] == 2]
    assert only_a_c and all(c[0][0] == 2 for c in only_a_c)
    cost = res.topology.pools[0].cost
    a, _, c = sorted(res.requests, key=lambda r: r.id)[:3]
    a.computed = c.computed = 20
    a.generated = c.generated = 5
    parts = ranked_parts([(a, 1), (c, 1)], 2, True)
    assert parts == [(2, 2 * 20.5, 42, 2, 2, (2, 41.0, 42, 2))]
    slow = cost.step(2, 41.0, 42, 2, 2, rank=parts).time_s
    even = cost.step(2, 41.0, 42, 2, 2).time_s
    one = cost.step(1, 20.5, 21, 1, 1, rank=ranked_parts([(a, 1)], 2, True)).time_s
    assert slow > even and slow > one


def test_ranks_balance_prompt_lengths_and_the_batching_count_runs_on_by_hand(tmp_path):
    """Timeout 100, batching 2.  A, B at 0 -> ranks 0, 1 (no decode anywhere: they go).  C, D at 1.5 -> ranks
    0, 1; at t=2 every rank has a prompt and decodes: batching count 1, held; B leaves at 3, so rank 1 has no
    decode and C, D go at t=3 (first token 4) -- the batching count stays 1 (TensorRT-LLM restarts it only
    when it lets prompts go while every rank decodes).  E, F at 4.5: E -> rank 1 (the only one below the even
    share), F -> rank 0: the ranks' prompts sum to 20 tokens each (A + C, D + E; A has generated 4 tokens by
    then, which TensorRT-LLM does not count), the tie goes to the lower rank.  At t=5 the batching count
    reaches 2, at t=6 they go: first token 7."""
    rows = ["0,10,30", "0,10,3", "1.5,10,30", "1.5,10,30", "4.5,10,5", "4.5,10,5"]
    reqs, _ = _run(tmp_path, rows, {"timeout_iters": 100, "batching_wait_iters": 2})
    assert [r.rank for r in reqs] == [0, 1, 0, 1, 1, 0]
    assert [r.first_token_s for r in reqs] == [1.0, 1.0, 4.0, 4.0, 7.0, 7.0]


def test_a_part_way_prompt_gets_what_its_ranks_decodes_leave_by_hand(tmp_path):
    """Chunked, 100 tokens per rank, no hold (timeout 0).  40 two-token requests at 0 (20 a rank) decode when a
    340-token prompt (rank 0) and a 10-token one (rank 1) arrive at 1.5: rank 0's 20 decodes leave 80 a step,
    at its admission (t=2) and after, so the long prompt takes 80 at t=2, 3, 4, 5 and 20 at t=6: first token
    7 (100 a step, or 100 at admission only, would end its prompt at t=6)."""
    rows = ["0,2,40"] * 40 + ["1.5,340,3", "1.5,10,3"]
    reqs, _ = _run(tmp_path, rows, {"timeout_iters": 0, "batching_wait_iters": 0}, scheduler="chunked")
    assert (reqs[40].rank, reqs[41].rank) == (0, 1)
    assert (reqs[40].first_token_s, reqs[41].first_token_s) == (7.0, 3.0)


@pytest.mark.parametrize("max_running", [4, 5])
def test_a_rank_with_no_free_slot_holds_every_ranks_prompts_by_hand(tmp_path, max_running):
    """max_running 4 (or 5: the instance's batch then has room for both) over 2 ranks: 2 slots a rank.  A, B, C
    at 0 -> ranks 0, 1, 0 (all go: no decode yet).  E, F at 2.5 -> rank 1 (the only one below the share), then
    rank 0 (equal prompts, the lower rank).  Both ranks have a prompt waiting, but rank 0's two slots are
    full, so it has none to start and the count runs (1 at t=1 ... 5 at t=5 = timeout): E goes at t=5 (first
    token 6); F waits for a slot on rank 0 (A, C decode until 30).  Were a full rank not a reason to hold,
    E would go at t=3."""
    rows = ["0,10,30", "0,10,30", "0,10,30", "2.5,10,3", "2.5,10,3"]
    reqs, res = _run(tmp_path, rows, {"timeout_iters": 5, "batching_wait_iters": 0}, max_running=max_running)
    assert [r.rank for r in reqs] == [0, 1, 0, 1, 0]
    assert reqs[3].first_token_s == 6.0
    assert reqs[4].first_token_s > 30.0


def test_admit_ranked_stops_a_rank_at_its_first_misfit_only_by_hand():
    """Rank 0 already carries a decode and has 50 tokens left: its head (150 tokens) does not fit, so the
    10-token request behind it waits too (the engine's per-rank FCFS); rank 1's request goes.  Chunked, the
    head takes the 50 and rank 0 stops there.  A KV pool too small for rank 0's head stops every rank."""
    from collections import deque
    from pdsim.kvcache import KVCache
    from pdsim.scheduler import Limits, StepPlan, _admit_ranked
    from pdsim.workload import Request

    def reqs():
        out = []
        for i, (rank, p) in enumerate([(0, 150), (0, 10), (1, 10)]):
            r = Request(i, 0.0, p, 5)
            r.rank = rank
            out.append(r)
        return out
    for chunk, want in ((False, [(2, 10)]), (True, [(0, 50), (2, 10)])):
        w = deque(reqs())
        running, plan = [], StepPlan()
        _admit_ranked(w, running, KVCache(1000, 16, 0.0), Limits(), plan, [50, 100], [True, False], chunk, 8)
        assert [(r.id, n) for r, n in plan.items] == want
        assert [r.id for r in w] == [i for i in (0, 1, 2) if i not in {r.id for r, _ in plan.items}]
    w = deque(reqs())
    plan = StepPlan()
    _admit_ranked(w, [], KVCache(5, 16, 0.0), Limits(), plan, [200, 100], [False, False], False, 8)
    assert plan.items == [] and len(w) == 3


def test_prefix_caching_on_a_balanced_pool_is_refused_and_no_engine_default(tmp_path):
    from pdsim.engines import engine_prefix_cache
    from pdsim.models import get_model
    with pytest.raises(ConfigError, match="prefix caching on a DP-balanced pool is not modelled"):
        config.parse({"model": "qwen3-30b-a3b", "workload": {"rate": 1, "num_requests": 2},
                      "topologies": {"t": {"kind": "colocated", "tp": 2, "ep": 2, "dp_attention": True,
                                           "scheduler": "inflight", "attention_dp_balance": {},
                                           "prefix_cache": {"enabled": True}}}}, "p.yaml")
    pool = config.PoolSpec(tp=2, ep=2, dp_attention=True, engine="trtllm", attention_dp_balance={})
    assert engine_prefix_cache(pool, get_model("qwen3-30b-a3b")) is False
    assert engine_prefix_cache(config.PoolSpec(tp=2, ep=2, dp_attention=True, engine="trtllm"),
                               get_model("qwen3-30b-a3b")) is True


def test_a_failure_restarts_the_counts_and_the_summary_counts_held_steps(tmp_path):
    """The policy's counts restart on a failure; summary.json's pool reports the steps that held prompts (the
    first by-hand timeline: t=4 and t=5)."""
    rows = ["0,10,20", "0,10,20", "3.5,10,3"]
    reqs, res = _run(tmp_path, rows, {"timeout_iters": 3, "batching_wait_iters": 0})
    inst = res.topology.instances[0]
    pool = metrics.summarize([res], metrics.requests_frame([res]), res.scenario)["t"]["pools"]["replica"]
    assert pool["attention_dp_balance"] == {"timeout_iters": 3, "batching_wait_iters": 0, "steps_held": 2}
    inst.policy.waited, inst.policy.batched = 2, 1
    inst.fail()
    assert (inst.policy.waited, inst.policy.batched) == (0, 0)


def test_each_rank_admits_from_its_own_kv_pool_by_hand(tmp_path):
    """8 blocks of 16 tokens over 2 ranks: 4 a rank (64 tokens).  A (60 tokens) -> rank 0, B1, B2 (5 each) ->
    rank 1, then C (20) -> rank 0 (the only rank below the even share).  Step 1: A takes rank 0's 4 blocks, so
    C (2 blocks) waits though rank 1 has 2 free -- and the 8-block instance 2; A's output grows its KV to
    63 tokens, still 4 blocks, and it finishes at t=4; C goes at t=4: first token 5, finish 6.  With one
    pool for the instance C would have gone in step 1 (first token 1).  A rank's shortage does not stop
    the other rank: B1, B2 prefill in step 1, and D (5 tokens, at 1.5 -> rank 1, the fewer prompt tokens)
    goes at t=2 from behind C in the queue: first token 3."""
    rows = ["0,60,4", "0,5,10", "0,5,10", "0,20,2", "1.5,5,2"]
    reqs, res = _run(tmp_path, rows, {"timeout_iters": 0, "batching_wait_iters": 0}, kv_blocks=8)
    assert [r.rank for r in reqs] == [0, 1, 1, 0, 1]
    assert [r.first_token_s for r in reqs] == [1.0, 1.0, 1.0, 5.0, 3.0]
    assert (reqs[0].finish_s, reqs[3].finish_s) == (4.0, 6.0)
    kv = res.topology.instances[0].kv
    assert (kv.per_rank, kv.peak_used) == (4, 7)          # rank 0: A's 4, rank 1: B1, B2, D; C never beside A
    cap = metrics.kv_capacity(res.topology.pools[0], metrics.requests_frame([res]))
    # mean request 123 / 5 = 24.6 -> 25 tokens = 2 blocks: 4 // 2 = 2 a rank
    assert (cap["kv_blocks"], cap["kv_blocks_per_rank"], cap["kv_capacity_requests"]) == (8, 4, 4)
    # the busiest GPU's peak: rank 0 full (A's 4 blocks), not the instance's 7 of 8
    pool = metrics.summarize([res], metrics.requests_frame([res]), res.scenario)["t"]["pools"]["replica"]
    assert kv.rank_peak == 4 and pool["kv_peak_bytes"] == pool["kv_capacity_bytes"]


def test_a_rank_short_of_blocks_preempts_its_own_newest_request_by_hand(tmp_path):
    """8 blocks over 2 ranks: 4 a rank.  A (16 tokens, 30 out) -> rank 0; B1 (20, 3 out) -> rank 1; C (40, 20
    out) -> rank 0 (A's prompt is the shorter); B2 (1, 40 out) -> rank 1 (the only rank below the share).
    Step 1: A 1 block + C 3 fill rank 0, B1 2 + B2 1 leave rank 1 one free.  Step 2: A's 17th token needs a
    second block; the newest request not yet scheduled is B2, but its blocks are rank 1's: C (rank 0) goes
    (40 tokens to recompute).  B2 keeps decoding: its 40 tokens at 1..40.  C's 41 tokens (prompt + its first)
    need 3 blocks, rank 0 has 2 free, then 1 from A's third block at t=17, until A finishes at t=30: C
    recomputes at t=30 (token 2 at 31), token 20 at 49.  D (5 tokens, 3 out) arrives at 0.5 and joins rank 1
    (fewer prompt tokens); rank 0's preemption at t=1 does not stop rank 1, whose pool has 1 block free: D
    goes at t=1, first token 2, finish 4."""
    rows = ["0,16,30", "0,20,3", "0,40,20", "0,1,40", "0.5,5,3"]
    reqs, _ = _run(tmp_path, rows, {"timeout_iters": 0, "batching_wait_iters": 0}, kv_blocks=8)
    assert [r.rank for r in reqs] == [0, 1, 0, 1, 1]
    assert [r.preemptions for r in reqs] == [0, 0, 1, 0, 0]
    assert [r.finish_s for r in reqs] == [30.0, 3.0, 49.0, 40.0, 4.0]
    assert reqs[4].first_token_s == 2.0
    assert reqs[2].recomputed_tokens == 40


def test_a_request_larger_than_one_ranks_pool_is_rejected_naming_the_rank(tmp_path):
    """8 blocks over 2 ranks: a request whose prompt + output needs 5 blocks (70 tokens) fits the instance's
    8 but no rank's 4: rejected at once, the reason naming the per-rank capacity."""
    reqs, _ = _run(tmp_path, ["0,60,11", "0,60,4"], {"timeout_iters": 0, "batching_wait_iters": 0}, kv_blocks=8)
    assert reqs[0].status == "rejected" and "per attention rank (2 ranks)" in reqs[0].reject_reason
    assert reqs[1].status == "finished" and reqs[1].finish_s == 4.0


def test_ranked_kv_pool_by_hand():
    """RankedKVCache: a remainder block unused, the watermark per rank, blocks back to the rank they came
    from whatever rank the request holds later, a reset makes every rank whole."""
    from pdsim.kvcache import RankedKVCache
    from pdsim.workload import Request
    kv = RankedKVCache(9, 16, 0.25, 2)                      # 4 a rank, watermark int(0.25 x 4) = 1 a rank
    assert (kv.total_blocks, kv.per_rank, kv.watermark_blocks, kv.max_request_blocks()) == (8, 4, 2, 3)
    assert kv.fits_ever(48) and not kv.fits_ever(49)
    assert kv.requests_fit(1) == 6 and kv.requests_fit(2) == 2
    a, b = Request(0, 0.0, 40, 5), Request(1, 0.0, 10, 5)
    a.rank, b.rank = 0, 0
    assert kv.grow(a, 40, admit=True)                        # 3 blocks: rank 0 at its watermark
    assert not kv.grow(b, 10, admit=True) and b.blocks == 0  # admission keeps rank 0's 1 spare
    assert kv.grow(b, 10) and kv.rank_used() == [4, 0]       # a running request may take it
    assert not kv.grow(a, 49)
    b.rank = 1                                               # (a rank given elsewhere later)
    kv.release(b)
    assert kv.rank_used() == [3, 0] and kv.free_blocks == 5
    kv.reset()
    assert kv.rank_free == [4, 4] and kv.free_blocks == 8 and not kv.owner
    # blocks come from the rank they were first taken on, even when the request holds another rank later
    a.blocks = 0
    a.rank = 0
    assert kv.grow(a, 16) and kv.grow(a, 16) and a.blocks == 1     # no new block: True, nothing taken
    a.rank = 1
    assert kv.grow(a, 17) and kv.rank_used() == [2, 0]
    kv.release(Request(7, 0.0, 5, 5))                        # a request holding nothing: a no-op
    kv.release(a)
    assert kv.rank_used() == [0, 0] and not kv.owner
    d = RankedKVCache(8)                                     # defaults: 16-token blocks, no watermark, 2 ranks
    assert (d.block_size, d.watermark_blocks, d.ranks, d.per_rank) == (16, 0, 2, 4)
    one = RankedKVCache(2, 16, 0.0, 2)                       # one block a rank is a pool
    assert one.per_rank == 1 and one.max_request_blocks() == 1


def test_admit_ranked_on_per_rank_pools_by_hand():
    """Waiting: B (rank 1, 10 tokens), A (rank 0, 150 tokens: 10 blocks), C (rank 1, 10), D (rank 0, 10), each
    rank 100 tokens.  Per-rank pools of 5 blocks: B goes, A does not fit rank 0's pool so rank 0 stops (D
    behind A waits: per-rank FCFS), C goes.  One shared 5-block pool: B goes, A's shortage stops every rank.
    A rank whose slots are full stops, the other goes on; an instance's max_running stops every rank; a
    prompt of exactly the tokens its rank has left fits, and a 1-token prompt fits a rank's last token."""
    from collections import deque
    from pdsim.kvcache import KVCache, RankedKVCache
    from pdsim.scheduler import Limits, StepPlan, _admit_ranked
    from pdsim.workload import Request

    def reqs(spec):
        out = []
        for i, (rank, p) in enumerate(spec):
            r = Request(i, 0.0, p, 5)
            r.rank = rank
            out.append(r)
        return out

    def admit(spec, kv, left, busy=None, running=(), limits=Limits(), slots=8, chunk=False):
        w, run, plan = deque(reqs(spec)), list(running), StepPlan()
        _admit_ranked(w, run, kv, limits, plan, list(left), busy or [False] * len(left), chunk, slots)
        return [(r.id, n) for r, n in plan.items], [r.id for r in w]
    spec = [(1, 10), (0, 150), (1, 10), (0, 10)]
    assert admit(spec, RankedKVCache(10, 16, 0.0, 2), [100, 100]) == ([(0, 10), (2, 10)], [1, 3])
    assert admit(spec, KVCache(5, 16, 0.0), [100, 100]) == ([(0, 10)], [1, 2, 3])
    # rank 0 holds its one slot already: its request waits, rank 1's goes
    held = reqs([(0, 10)])
    assert admit([(0, 10), (1, 10)], KVCache(100), [100, 100], running=held, slots=1) == ([(1, 10)], [0])
    # max_running 1 over 2 ranks (a slot each): one request in all
    assert admit([(0, 10), (1, 10)], KVCache(100), [100, 100], limits=Limits(max_running=1), slots=1) == \
        ([(0, 10)], [1])
    # exactly the 90 tokens rank 0 has left: in; then a 1-token prompt in rank 1's last token
    assert admit([(0, 90), (1, 1)], KVCache(100), [90, 1], busy=[True, True]) == ([(0, 90), (1, 1)], [])
    # a rank with 2 tokens left: two 1-token prompts, the second in its last token
    assert admit([(1, 1), (1, 1)], KVCache(100), [100, 2]) == ([(0, 1), (1, 1)], [])
    # chunked: a 5-token prompt takes the one token its rank has left
    assert admit([(0, 5)], KVCache(100), [1, 100], busy=[True, False], chunk=True) == ([(0, 1)], [])
    # three requests for a rank of two slots: the third waits
    assert admit([(0, 10)] * 3, KVCache(100), [100, 100], slots=2) == ([(0, 10), (1, 10)], [2])


def _pd(tmp_path, rows, link, prefill_blocks, decode_instances, decode_blocks, faults=None):
    """A plain prefill instance (inflight, 200 tokens a step) and DP-balanced decode instances (tp 2, no hold),
    constant 1 s steps, fed a trace of ``rows``: (requests by id, the TopologyResult)."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    const = {"kind": "constant", "step_s": 1.0}
    sc = {"model": "qwen3-30b-a3b", "workload": {"arrival": "trace", "trace": {"path": str(trace)}},
          "topologies": {"pd": {
              "kind": "disaggregated", "kv_link": link,
              "prefill": {"instances": 1, "kv_blocks": prefill_blocks, "cost_model": const,
                          "scheduler": "inflight", "max_batched_tokens": 200},
              "decode": {"instances": decode_instances, "tp": 2, "ep": 2, "dp_attention": True,
                         "kv_blocks": decode_blocks, "cost_model": const, "scheduler": "inflight",
                         "attention_dp_balance": {"timeout_iters": 0, "batching_wait_iters": 0}}}}}
    if faults is not None:
        sc["faults"] = faults
    (res,) = simulate(config.parse(sc, "pd.yaml"))
    return sorted(res.requests, key=lambda r: r.id), res


def test_a_balanced_decode_pool_places_kv_on_the_wire_by_rank_by_hand(tmp_path):
    """Disaggregated: a plain prefill instance, a DP-balanced decode instance with 4 blocks a rank (constant 1 s
    steps, a link of negligible time).  A and B (50 tokens, 10 out: 59 tokens of KV at most, 4 blocks) prefill
    together and hand off at t=1: A's KV goes to rank 0, and B's -- A's still on the wire counts -- to rank 1,
    so both decode: A's KV lands first (t=1 + 1 us) and A's step starts, B's a microsecond later and B joins the
    next step: A's tokens 2..10 at 2..10, B's at 3..11 (+ 1 us).  Placed as if A were not there yet, B would
    wait for rank 0's blocks until A finished at 10, and finish at 19 or later."""
    (a, b), res = _pd(tmp_path, ["0,50,10", "0,50,10"], {"bandwidth_GBps": 1e6, "latency_us": 1},
                      prefill_blocks=1000, decode_instances=1, decode_blocks=8)
    assert (a.rank, b.rank) == (0, 1)
    assert a.finish_s == pytest.approx(10.0, abs=1e-5) and b.finish_s == pytest.approx(11.0, abs=1e-5)
    dec = res.topology.pools[1].instances[0]
    assert dec.kv.rank_free == [4, 4] and dec.inbound == []


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=6)
@given(seed=st.integers(0, 10**6), timeout=st.integers(0, 4))
def test_nothing_lost_on_balanced_pd_pools_under_random_faults(seed, timeout):
    """Both pools DP-balanced (per-rank KV on each side, decode ranks placed as KV is reserved), prefill and
    decode instances failing at random: every request finishes, each rank's pool is whole at the end, no
    request's blocks are left on record anywhere, no reservation is left on the wire."""
    pool = {"device": "h200", "tp": 2, "ep": 2, "dp_attention": True, "scheduler": "inflight", "kv_blocks": 120,
            "max_running": 12, "attention_dp_balance": {"timeout_iters": timeout, "batching_wait_iters": 0}}
    sc = config.parse({"seed": seed, "model": "deepseek-v3", "weight_dtype": "fp8", "kv_dtype": "fp8",
                       "workload": {"rate": 30, "num_requests": 60,
                                    "prompt_tokens": {"dist": "uniform", "low": 1, "high": 900},
                                    "output_tokens": {"dist": "uniform", "low": 1, "high": 60}},
                       "faults": {"random": {"mtbf_s": 1.5, "mttr_s": 0.3}},
                       "topologies": {"pd": {"kind": "disaggregated", "prefill": {"instances": 2, **pool},
                                             "decode": {"instances": 2, **pool}}}}, "f.yaml")
    (res,) = simulate(sc)
    assert all(r.status == "finished" and r.generated == r.output_tokens for r in res.requests)
    for inst in res.topology.instances:
        assert inst.kv.free_blocks == inst.kv.total_blocks and inst.kv.rank_free == [60, 60]
        assert not inst.kv.owner and inst.inbound == [] and inst.awaiting == {} and inst.reserved_count == 0
    assert res.topology.placed == {}


def test_capacity_estimates_count_whole_requests_per_rank_by_hand(tmp_path):
    """10 blocks of 16 over 2 ranks: 5 a rank.  A 48-token request (3 blocks) fits once a rank, twice in all
    (the instance's 10 blocks would say 3): the run holds two at once (the third starts at 9), and the pool's
    KV capacity, the validation's KV-bound test and the autoscaler's decode capacity (2 requests a step of
    1 s, 8 steps each: 0.25 req/s) all say 2."""
    from pdsim.autoscaler import capacity_per_instance
    from pdsim.validate import kv_holds_requests
    reqs, res = _run(tmp_path, ["0,40,8", "0,40,8", "0,40,8"], {"timeout_iters": 0, "batching_wait_iters": 0},
                     kv_blocks=10)
    assert [r.first_token_s for r in reqs] == [1.0, 1.0, 9.0]
    p = res.topology.pools[0]
    assert metrics.kv_capacity(p, metrics.requests_frame([res]))["kv_capacity_requests"] == 2
    assert kv_holds_requests(res.topology, 48) == 2
    assert capacity_per_instance(NS(cost=p.cost, role="decode", instances=p.instances, spec=p.spec), 40, 8,
                                 10.0) == 0.25


def test_a_request_recomputed_on_a_balanced_decode_instance_counts_kv_on_the_wire_by_hand(tmp_path):
    """A 4-block prefill pool; two balanced decode instances (8 blocks a rank), 1 s steps; a slow link
    (98,304 B a token at 1 MB/s: 0.098 s a token).  X (64 tokens, 20 out) reaches decode-0 at 7.29; Y (60, 30
    out), prefilled once X's blocks are free, reserves 4 blocks on decode-1's rank 0 and is on the wire from
    8.29 to 14.19.  decode-0 fails at 10: X (67 tokens known) no longer fits a prefill instance and is
    recomputed on decode-1.  Y's KV on the wire counts, so X joins rank 1 (empty) and recomputes in the step
    10 -> 11 (token 4), tokens 4..20 at 11..27.  Placed as if Y were not there, X would join rank 0, where 4
    free blocks are short of its 5, and wait for Y (finish 60.2)."""
    (x, y), _ = _pd(tmp_path, ["0,64,20", "2,60,30"], {"bandwidth_GBps": 0.001, "latency_us": 0},
                    prefill_blocks=4, decode_instances=2, decode_blocks=16,
                    faults=[{"at_s": 10.0, "instance": "decode-0", "down_s": 1000}])
    assert (x.rank, y.rank) == (1, 0)
    assert x.finish_s == pytest.approx(27.0, abs=1e-6) and x.fault_hits == 1
    assert y.finish_s == pytest.approx(44.0, abs=1e-6)


def test_the_report_states_each_ranks_kv_pool(tmp_path):
    """A balanced pool's report card says each attention rank has its own pool, and how many blocks; a pool
    without ranks says nothing of the kind."""
    from pdsim.report import _engine_items
    _, res = _run(tmp_path, ["0,10,2"], {"timeout_iters": 0, "batching_wait_iters": 0}, kv_blocks=8)
    s = metrics.summarize([res], metrics.requests_frame([res]), res.scenario)["t"]
    (line,) = [v for k, v in _engine_items(s) if "KV capacity" in k]
    assert "(4 blocks of 16 tokens a rank: each attention rank has its own pool)" in line
    _, res = _run(tmp_path, ["0,10,2"], None, kv_blocks=8)
    s = metrics.summarize([res], metrics.requests_frame([res]), res.scenario)["t"]
    (line,) = [v for k, v in _engine_items(s) if "KV capacity" in k]
    assert "a rank" not in line and "kv_blocks_per_rank" not in s["pools"]["replica"]


def test_a_rank_whose_pool_keeps_its_prompt_waiting_has_none_for_the_balance_by_hand(tmp_path):
    """4 blocks a rank (8 blocks over 2), timeout 3.  A (48 tokens, 10 out) -> rank 0, B (10, 30 out) -> rank 1:
    both prefill at t=0 (no decode anywhere).  A's 49th token at t=1 takes rank 0's last block.  C (30) and D
    (20) arrive at 1.5: C -> rank 1 (fewer prompt tokens), D -> rank 0 (below the even share).  At t=2 rank
    0's scheduler cannot start D (2 blocks, none free), so it has no context request, as TensorRT-LLM's
    balance counts them: the count runs (1 at t=1, 2 at t=2) and reaches 3 at t=3: C goes then (first token
    4, not 3 as if D counted), D when A's blocks come back (A finishes at 10; rank 0 then has no decode, so
    nothing holds: first token 11)."""
    rows = ["0,48,10", "0,10,30", "1.5,30,2", "1.5,20,2"]
    reqs, _ = _run(tmp_path, rows, {"timeout_iters": 3, "batching_wait_iters": 0}, kv_blocks=8)
    assert [r.rank for r in reqs] == [0, 1, 1, 0]
    assert [r.first_token_s for r in reqs] == [1.0, 1.0, 4.0, 11.0]
    assert (reqs[0].finish_s, reqs[2].finish_s) == (10.0, 5.0)


def test_ranks_starting_a_prompt_by_hand():
    """The head of each rank's queue only (per-rank FCFS), within its slots, tokens left and free blocks."""
    from collections import deque
    from pdsim.kvcache import RankedKVCache
    from pdsim.scheduler import Limits, _ranks_starting_a_prompt
    from pdsim.workload import Request

    def req(i, rank, p):
        r = Request(i, 0.0, p, 5)
        r.rank = rank
        return r
    kv = RankedKVCache(8, 16, 0.0, 2)                        # 4 blocks a rank
    w = deque([req(0, 0, 80), req(1, 0, 10), req(2, 1, 60)])
    # rank 0's head needs 5 blocks (its 10-token follower would fit, but waits behind it); rank 1's fits
    assert _ranks_starting_a_prompt(w, [], kv, Limits(), [100, 100], [False, False], False, 8) == [False, True]
    # chunked: rank 0's head takes a 50-token chunk (4 blocks): fits
    assert _ranks_starting_a_prompt(w, [], kv, Limits(), [50, 100], [True, False], True, 8) == [True, True]
    # inflight, rank 1 busy with 50 tokens left: its 60-token head waits for a step of its own
    assert _ranks_starting_a_prompt(w, [], kv, Limits(), [100, 50], [False, True], False, 8) == [False, False]
    # idle, a prompt larger than the rank's budget runs alone: rank 1 (60 > 50, not busy) starts it
    assert _ranks_starting_a_prompt(w, [], kv, Limits(), [100, 50], [False, False], False, 8) == [False, True]
    # rank 1's one slot is taken; the instance's batch full stops every rank
    assert _ranks_starting_a_prompt(w, [req(9, 1, 5)], kv, Limits(), [100, 100], [False, False], False, 1) == \
        [False, False]
    assert _ranks_starting_a_prompt(w, [req(9, 1, 5)], kv, Limits(max_running=1), [100, 100], [False, False],
                                    False, 8) == [False, False]
    # full reservation: the whole sequence (60 + 5 - 1 = 64 tokens, 4 blocks) still fits rank 1; 60 + 10 - 1 = 69
    # (5 blocks) does not, though the prompt alone would
    assert _ranks_starting_a_prompt(w, [], kv, Limits(reserve_full=True), [100, 100], [False, False], False,
                                    8) == [False, True]
    long = req(3, 1, 60)
    long.output_tokens = 10
    for full, want in ((True, [False, False]), (False, [False, True])):
        assert _ranks_starting_a_prompt(deque([long]), [], kv, Limits(reserve_full=full), [100, 100],
                                        [False, False], False, 8) == want


def test_a_hand_off_waiting_for_decode_blocks_keeps_its_rank_and_counts_there_by_hand(tmp_path):
    """Balanced decode (4 blocks a rank), 1 s steps, a link of negligible time.  A, B (50 tokens, 10 out: 4
    blocks each) fill ranks 0 and 1 from t=1 (A's tokens 2..10 at 2..10, B's at 3..11).  C (30 + 3, at 1) is
    prefilled 1 -> 2 and placed on rank 0 (A and B one each, equal prompts: the lower rank), whose pool is
    full: it waits there.  D (30 + 3, at 2) is prefilled 2 -> 3 and placed on rank 1, C counting on rank 0.
    At 10 A leaves: C's KV lands on rank 0 a microsecond into the next step, so it joins the one after (tokens
    2, 3 at 12, 13).  D keeps rank 1 and waits for B (done at 11), though rank 0 has 2 blocks free: it joins
    the step at 12, tokens at 13, 14.  Placed again at each try, D would go to rank 0 beside C (finish 13)."""
    reqs, res = _pd(tmp_path, ["0,50,10", "0,50,10", "1,30,3", "2,30,3"], {"bandwidth_GBps": 1e6, "latency_us": 1},
                    prefill_blocks=1000, decode_instances=1, decode_blocks=8)
    a, b, c, d = reqs
    assert [r.rank for r in reqs] == [0, 1, 0, 1]
    assert [r.finish_s for r in reqs] == pytest.approx([10.0, 11.0, 13.0, 14.0], abs=1e-5)
    assert (c.kv_wait_s, d.kv_wait_s) == pytest.approx((8.0, 8.0), abs=1e-5)
    dec = res.topology.pools[1].instances[0]
    assert dec.awaiting == {} and dec.inbound == [] and res.topology.placed == {}


def test_a_waiting_hand_off_recomputed_on_decode_does_not_count_itself_by_hand(tmp_path):
    """Prefill pool 4 blocks (64 tokens); balanced decode 8 blocks a rank.  A, B (60 + 40) decode on ranks 0, 1.
    C (64 + 3, at 8) is prefilled 8 -> 9 and waits for rank 0's blocks (A holds 5+ of 8, C needs 4).  prefill-0
    fails at 9.5: C's copy is gone and 65 tokens no longer fit a prefill instance, so it is recomputed on
    decode.  Placed there, it must not count its own wait on rank 0: ranks 0 and 1 hold one request each with
    equal prompts, so rank 0 (finish 42; counting itself it went to rank 1 and finished at 44)."""
    reqs, _ = _pd(tmp_path, ["0,60,40", "1,60,40", "8,64,3"], {"bandwidth_GBps": 1e6, "latency_us": 1},
                  prefill_blocks=4, decode_instances=1, decode_blocks=16,
                  faults={"instances": [{"at_s": 9.5, "instance": "prefill-0", "down_s": 1.0}]})
    c = reqs[2]
    assert c.rank == 0 and c.finish_s == pytest.approx(42.0, abs=1e-5) and c.fault_hits == 1


def test_ranks_starting_a_prompt_count_the_instances_batch_room():
    """max_running 2 with one request running over 4 ranks (a slot each): room for one more, so only the first
    rank whose head could start counts (the batch takes no second), as admission would take just one."""
    from collections import deque
    from pdsim.kvcache import RankedKVCache
    from pdsim.scheduler import Limits, _ranks_starting_a_prompt
    from pdsim.workload import Request
    reqs = []
    for i, rank in enumerate((1, 2, 3, 0)):
        r = Request(i, 0.0, 10, 5)
        r.rank = rank
        reqs.append(r)
    running, waiting = reqs[3:], deque(reqs[:3])
    got = _ranks_starting_a_prompt(waiting, running, RankedKVCache(40, 16, 0.0, 4), Limits(max_running=2),
                                   [100] * 4, [True, False, False, False], False, 1)
    assert got == [False, True, False, False]
