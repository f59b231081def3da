"""pdsim.workload by hand and by theory: arrival processes, lengths, rate curves, chat sessions.

Written to kill mutmut survivors in workload.py (tests/MUTANTS.md section 2). Expected values are
arithmetic on the inputs or the moments of the distributions (with sampling bounds of several
standard errors), never a second call into pdsim's own code path.
"""
from __future__ import annotations

import numpy as np
import pytest

from pdsim import workload as wl


def test_constant_arrivals_by_hand():
    # 4 requests at 2/s: one every 0.5 s, the first after one gap
    assert list(wl.constant_arrivals(2.0, 4)) == [0.5, 1.0, 1.5, 2.0]


def _sc(tmp_path=None, **workload):
    from pdsim import config
    raw = {"seed": 0, "model": "llama-3.1-8b", "workload": workload,
           "topologies": {"c": {"kind": "colocated", "kv_blocks": 100, "cost_model": {"kind": "constant", "step_s": 0.1}}}}
    return config.parse(raw, "s.yaml", base_dir=tmp_path or ".")


def _gen(sc):
    from pdsim.simulation import resolve_model
    return wl.generate(sc, resolve_model(sc))


def test_request_progress_by_hand():
    r = wl.Request(7, 1.5, 10, 5, computed=3, generated=2, hash_ids=[1, 2], hash_block_tokens=8, hash_tokens=15)
    assert r.known == 12                       # 10 prompt + 2 generated
    assert r.remaining == 11                   # 10 + 5 - 1 (the last token's KV is never computed) - 3
    c = r.clone()
    assert (c.id, c.arrival_s, c.prompt_tokens, c.output_tokens) == (7, 1.5, 10, 5)
    assert (c.computed, c.generated, c.hash_ids, c.hash_block_tokens, c.hash_tokens) == (0, 0, [1, 2], 8, 15)
    c = wl.Request(3, 2.5, 4, 2, computed=1).clone()           # no hash ids: the plain copy
    assert (c.id, c.arrival_s, c.prompt_tokens, c.output_tokens) == (3, 2.5, 4, 2)
    assert c.computed == 0 and c.hash_ids is None and c.hash_block_tokens == 0 and c.hash_tokens == 0


def test_make_requests_by_hand():
    rs = wl.make_requests(np.array([0.5, 1.0]), np.array([10, 20]), np.array([3, 4]))
    assert [(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.hash_ids) for r in rs] == \
        [(0, 0.5, 10, 3, None), (1, 1.0, 20, 4, None)]
    rs = wl.make_requests(np.array([0.5, 1.0]), np.array([10, 20]), np.array([3, 4]), [[1], [1, 2]], 512)
    assert [(r.id, r.hash_ids, r.hash_block_tokens) for r in rs] == [(0, [1], 512), (1, [1, 2], 512)]
    assert type(rs[0].arrival_s) is float and type(rs[0].prompt_tokens) is int


def test_poisson_and_gamma_gaps_have_mean_one_over_rate():
    # 100,000 gaps at 4/s: mean 0.25 s, standard error 0.25 x cv / sqrt(n) (cv 1: 0.00079); 5 errors allowed
    rng = np.random.default_rng(1)
    n = 100_000
    g = wl.poisson_gaps(rng, 4.0, n)
    assert len(g) == n and abs(g.mean() - 0.25) < 5 * 0.25 / np.sqrt(n)
    assert abs(g.std() / g.mean() - 1.0) < 0.02                 # exponential: CV 1
    g = wl.gamma_gaps(rng, 4.0, 0.5, n)
    assert abs(g.mean() - 0.25) < 5 * 0.25 * 0.5 / np.sqrt(n) and abs(g.std() / g.mean() - 0.5) < 0.01
    a = wl.poisson_arrivals(rng, 4.0, 1000)
    assert len(a) == 1000 and (np.diff(a) > 0).all() and a[0] > 0 and abs(a[-1] / 1000 - 0.25) < 0.05
    a = wl.gamma_arrivals(rng, 4.0, 0.5, 1000)
    assert len(a) == 1000 and (np.diff(a) > 0).all() and abs(a[-1] / 1000 - 0.25) < 0.03


def test_lognormal_lengths_mean_cv_and_clip():
    # lognormal with mean 200, CV 0.5: sample mean within 1% on 200,000 draws (standard error 0.11%),
    # rounding to integers moves it by far less; CV within 2%
    rng = np.random.default_rng(2)
    x = wl.lognormal_lengths(rng, 200.0, 0.5, 200_000)
    assert x.dtype == np.int64 and abs(x.mean() / 200 - 1) < 0.01 and abs(x.std() / x.mean() / 0.5 - 1) < 0.02
    assert x.min() >= 1 and x.max() > 1000                      # unclipped above: P(x > 1000) ~ 1e-5 x n
    # mean 1.5: about a third of the draws round to 0 and are clipped up to the default floor of 1 token
    z = wl.lognormal_lengths(rng, 1.5, 1.0, 10_000)
    assert z.min() == 1 and (z == 1).mean() > 0.3
    y = wl.lognormal_lengths(rng, 200.0, 0.5, 10_000, low=150, high=250)
    assert y.min() == 150 and y.max() == 250                    # both ends hit (P(< 150) ~ 0.27, P(> 250) ~ 0.25)


def test_uniform_lengths_include_both_ends():
    x = wl.uniform_lengths(np.random.default_rng(3), 3, 5, 30_000)
    counts = np.bincount(x, minlength=6)
    assert counts[:3].sum() == 0 and counts.sum() == 30_000
    assert all(abs(c - 10_000) < 500 for c in counts[3:])         # 1/3 each, sd 82


def test_generate_constant_stream_cut_at_duration_by_hand():
    # 2 req/s for 10 s: arrivals 0.5, 1.0, ..., 9.5 (10.0 is not < 10): 19 requests of the fixed sizes
    rs = _gen(_sc(arrival="constant", rate=2.0, duration_s=10.0, prompt_tokens=7, output_tokens=3))
    assert [r.arrival_s for r in rs] == [0.5 * k for k in range(1, 20)]
    assert {(r.prompt_tokens, r.output_tokens) for r in rs} == {(7, 3)}
    # num_requests with duration_s: duration only cuts
    rs = _gen(_sc(arrival="constant", rate=2.0, num_requests=5, duration_s=2.0))
    assert [r.arrival_s for r in rs] == [0.5, 1.0, 1.5]
    rs = _gen(_sc(arrival="constant", rate=2.0, num_requests=5))
    assert [r.arrival_s for r in rs] == [0.5, 1.0, 1.5, 2.0, 2.5]


def test_generate_poisson_over_a_duration_fills_it():
    # Poisson at 50/s over 100 s: 5000 +- 4 x sqrt(5000) = 283 arrivals, all inside, the last within a few gaps
    # of the end (P(no arrival in the last 0.2 s) = e^-10)
    for arrival, extra in (("poisson", {}), ("gamma", {"cv": 3.0})):
        rs = _gen(_sc(arrival=arrival, rate=50.0, duration_s=100.0, **extra))
        t = np.array([r.arrival_s for r in rs])
        assert t.max() < 100.0 and (np.diff(t) >= 0).all()
        if arrival == "poisson":
            assert abs(len(rs) - 5000) < 283 and t.max() > 99.8
        else:    # gamma, cv 3: a count's variance is cv^2 times Poisson's: 5000 +- 4 x 3 x 71
            assert abs(len(rs) - 5000) < 850


def test_generate_closed_loop_has_no_arrival_times():
    rs = _gen(_sc(arrival="closed", clients=2, num_requests=3, prompt_tokens=5, output_tokens=2))
    assert len(rs) == 3 and all(np.isnan(r.arrival_s) for r in rs)


def test_generate_lengths_by_distribution():
    rs = _gen(_sc(arrival="constant", rate=1.0, num_requests=2000,
                  prompt_tokens={"dist": "uniform", "low": 10, "high": 12},
                  output_tokens={"dist": "lognormal", "mean": 100, "cv": 2.0, "max": 150}))
    assert {r.prompt_tokens for r in rs} == {10, 11, 12}
    out = np.array([r.output_tokens for r in rs])
    assert out.max() == 150 and out.min() >= 1                     # clipped at max (P(> 150) ~ 0.16)
    # lognormal without max: clipped at the model's 131,072-token context, not below it
    rs = _gen(_sc(arrival="constant", rate=1.0, num_requests=20000, prompt_tokens=10,
                  output_tokens={"dist": "lognormal", "mean": 2000, "cv": 8.0}))
    assert max(r.output_tokens for r in rs) > 8192


def test_generate_refuses_requests_longer_than_the_context():
    from pdsim.errors import ConfigError
    # llama-3.1-8b: 131,072 tokens
    for w, key in (({"prompt_tokens": 131072, "output_tokens": 1}, "workload.prompt_tokens"),
                   ({"prompt_tokens": 10, "output_tokens": 131072}, "workload.output_tokens"),
                   ({"prompt_tokens": 100000, "output_tokens": 31073}, "workload.output_tokens")):
        with pytest.raises(ConfigError) as e:
            _gen(_sc(arrival="constant", rate=1.0, num_requests=2, **w))
        assert key in str(e.value), (w, str(e.value))
    # exactly the context is allowed: 100,000 + 31,072 = 131,072
    rs = _gen(_sc(arrival="constant", rate=1.0, num_requests=2, prompt_tokens=100000, output_tokens=31072))
    assert len(rs) == 2
    rs = _gen(_sc(arrival="constant", rate=1.0, num_requests=2, prompt_tokens=131071, output_tokens=1))
    assert len(rs) == 2


def _curve(**kw):
    from pdsim import config
    return config.RateCurveSpec(**kw)


def test_rate_breakpoints_of_points_by_hand():
    # points (0, 1) -> (10, 3), constant after 10; x2 scale; a x4 burst over [5, 7)
    c = _curve(points=[[0, 1], [10, 3]], scale=2.0, bursts=[{"at_s": 5, "duration_s": 2, "multiplier": 4}])
    starts, r0, r1 = wl.rate_breakpoints(c, 20.0)
    assert list(starts) == [0, 5, 7, 10]
    # [0,5): 1 -> 2; [5,7): 2 -> 2.4 (x4); [7,10): 2.4 -> 3; [10,20): 3 flat, all x2
    assert list(r0) == pytest.approx([2, 16, 4.8, 6]) and list(r1) == pytest.approx([4, 19.2, 6, 6])
    assert wl.rate_at(c, 20.0, [0.0, 2.5, 6.0, 8.5, 15.0]) == pytest.approx([2, 3, 17.6, 5.4, 6])
    # time_scale 0.5: the curve's 10 s pass in 5 simulated seconds
    starts, r0, r1 = wl.rate_breakpoints(_curve(points=[[0, 1], [10, 3]], time_scale=0.5), 8.0)
    assert list(starts) == [0, 5] and list(r0) == pytest.approx([1, 3]) and list(r1) == pytest.approx([3, 3])
    # repeating every 10 s: the ramp again on [10, 20), cut at duration 15
    starts, r0, r1 = wl.rate_breakpoints(_curve(points=[[0, 1], [10, 3]], period_s=10), 15.0)
    assert list(starts) == [0, 10] and list(r0) == pytest.approx([1, 1]) and list(r1) == pytest.approx([3, 2])
    # a burst of multiplier 0 silences its window
    c = _curve(points=[[0, 2], [10, 2]], bursts=[{"at_s": 2, "duration_s": 3, "multiplier": 0}])
    assert wl.rate_at(c, 10.0, [1.0, 3.0, 4.99, 5.0]) == pytest.approx([2, 0, 0, 2])


def test_rate_breakpoints_of_hours_by_hand():
    # hourly 1, 2, 3 req/s; time_scale 0.01: an hour is 36 simulated seconds; the 3-hour day repeats
    c = _curve(hourly=[1, 2, 3], time_scale=0.01)
    starts, r0, r1 = wl.rate_breakpoints(c, 120.0)
    assert list(starts) == pytest.approx([0, 36, 72, 108])
    assert list(r0) == [1, 2, 3, 1] and list(r1) == [1, 2, 3, 1]
    # a 2-hour period over 3 hours of values: the third hour is never reached
    starts, r0, _ = wl.rate_breakpoints(_curve(hourly=[1, 2, 3], period_s=7200), 4 * 3600.0)
    assert list(starts) == [0, 3600, 7200, 10800] and list(r0) == [1, 2, 1, 2]


def test_nhpp_arrival_counts_follow_the_integral_of_the_rate():
    # rate 100 -> 300 over [0, 10) then 300 on [10, 20): expected counts 2000 on [0, 10) (of which
    # integral_0^5 (100 + 20 t) dt = 750 on [0, 5)) and 3000 on [10, 20); sd = sqrt(count), 5 sd allowed
    c = _curve(points=[[0, 1], [10, 3]], scale=100.0)
    t = wl.nhpp_arrivals(np.random.default_rng(5), c, 20.0)
    assert (np.diff(t) >= 0).all() and t.min() >= 0 and t.max() < 20
    for lo, hi, want in ((0, 5, 750), (5, 10, 1250), (10, 20, 3000)):
        k = int(((t >= lo) & (t < hi)).sum())
        assert abs(k - want) < 5 * np.sqrt(want), (lo, hi, k, want)
    # a curve silenced by a x0 burst over the whole run gives nothing
    c = _curve(points=[[0, 1], [1, 1]], bursts=[{"at_s": 0, "duration_s": 10, "multiplier": 0}])
    assert len(wl.nhpp_arrivals(np.random.default_rng(5), c, 10.0)) == 0


def test_generate_with_a_rate_curve():
    from pdsim.errors import ConfigError
    rs = _gen(_sc(rate_curve={"points": [[0, 50], [100, 50]]}, duration_s=100.0))
    assert abs(len(rs) - 5000) < 5 * np.sqrt(5000) and max(r.arrival_s for r in rs) < 100
    rs = _gen(_sc(rate_curve={"points": [[0, 50], [100, 50]]}, duration_s=100.0, num_requests=10))
    assert len(rs) == 10 and rs[-1].arrival_s < 1.0            # the first 10 of ~50 a second
    with pytest.raises(ConfigError) as e:
        _gen(_sc(rate_curve={"points": [[0, 1], [10, 1]],
                             "bursts": [{"at_s": 0, "duration_s": 10, "multiplier": 0}]}, duration_s=10.0))
    assert "workload.rate_curve" in str(e.value)


def test_conversations_by_hand():
    # 2 sessions (at 0 and 5 s), a 20-token system prompt, messages of 10 and replies of 5 tokens, hash
    # ids per 16 tokens, 50-token context, turns unbounded (mean 1e6): each session has 2 turns, the
    # third (20 + 2 x 15 + 10 = 60 tokens) passing the context
    # session 0: system ids [1], 4 tokens left over. Turn 0: prompt 20 + 10 = 30, +5 reply = 35 tokens:
    #   ids 1 (0-15), 2 (16-31), then a partial block: a fresh id 3 -> [1, 2, 3]
    #   turn 1: prompt 35 + 10 = 45, reply 5 -> 50 <= 50: ids 1, 2, 4 (32-47), partial 5 -> [1, 2, 4, 5]
    # session 1: the same system id 1, then its own: [1, 6, 7], [1, 6, 8, 9]
    rs = wl.conversations(np.random.default_rng(0), np.array([0.0, 5.0]), np.full(4, 10), np.full(4, 5),
                          turns_mean=1e6, system_prompts=1, system_tokens=20, unit_tokens=16, max_context=50)
    assert [(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.hash_ids, r.hash_tokens) for r in rs] == [
        (0, 0.0, 30, 5, [1, 2, 3], 35), (1, 0.0, 45, 5, [1, 2, 4, 5], 50),
        (2, 5.0, 30, 5, [1, 6, 7], 35), (3, 5.0, 45, 5, [1, 6, 8, 9], 50)]
    assert {r.hash_block_tokens for r in rs} == {16}
    # no system prompt, one turn per session (mean 1): ids of the message and reply only
    # session 0: 5 + 2 = 7 tokens of 4 per id: 1 whole id, 3 left -> [1, 2]; session 1: 3 + 6 = 9 -> [3, 4, 5]
    rs = wl.conversations(np.random.default_rng(0), np.array([0.0, 1.0]), np.array([5, 3]), np.array([2, 6]),
                          unit_tokens=4)
    assert [(r.prompt_tokens, r.output_tokens, r.hash_ids, r.hash_tokens) for r in rs] == \
        [(5, 2, [1, 2], 7), (3, 6, [3, 4, 5], 9)]
    # a 48-token context: the second turn (45 + 5 = 50 tokens) never fits; each session has one turn
    rs = wl.conversations(np.random.default_rng(0), np.array([0.0, 5.0]), np.full(4, 10), np.full(4, 5),
                          turns_mean=1e6, system_prompts=1, system_tokens=20, unit_tokens=16, max_context=48)
    assert [(r.arrival_s, r.prompt_tokens) for r in rs] == [(0.0, 30), (5.0, 30)]
    # two sessions starting together: renumbered in arrival order, a tie kept in session order
    rs = wl.conversations(np.random.default_rng(0), np.array([0.0, 0.0]), np.array([10, 5]), np.array([2, 2]),
                          unit_tokens=4)
    assert [(r.id, r.prompt_tokens) for r in rs] == [(0, 10), (1, 5)]
    # more sessions than messages: at most len(user_tokens) requests
    rs = wl.conversations(np.random.default_rng(0), np.arange(5.0), np.full(3, 5), np.full(3, 2), unit_tokens=4)
    assert [r.arrival_s for r in rs] == [0.0, 1.0, 2.0]


def test_conversation_turns_arrive_think_time_apart_in_the_mean():
    # 2000 sessions of unbounded turns over 20,000 messages, think time exponential, mean 2 s. Turn k's
    # prompt and reply are 15 (k + 1) tokens: a 150-token context ends every session after 10 turns.
    # The gaps within a session average 2 s (standard error 2 / sqrt(18000) = 0.015; 5 allowed)
    n = 20_000
    rs = wl.conversations(np.random.default_rng(1), np.arange(0.0, 2000 * 1e4, 1e4), np.full(n, 10), np.full(n, 5),
                          turns_mean=1e6, think_s=2.0, max_context=150)
    assert rs[0].hash_block_tokens == 16                           # the default: one hash id per 16 tokens
    t = np.array([r.arrival_s for r in rs]).reshape(-1, 10)          # 10 turns per session, sorted by time
    gaps = np.diff(t, axis=1)
    assert len(rs) == n and {r.prompt_tokens for r in rs[:10]} == {10 + 15 * k for k in range(10)}
    assert gaps.min() > 0 and abs(gaps.mean() - 2.0) < 5 * 2.0 / np.sqrt(gaps.size)
    # a think time below 1 s is a think time too: 0.5 s on average
    rs = wl.conversations(np.random.default_rng(3), np.arange(0.0, 200 * 1e4, 1e4), np.full(2000, 10),
                          np.full(2000, 5), turns_mean=1e6, think_s=0.5, max_context=150)
    gaps = np.diff(np.array([r.arrival_s for r in rs]).reshape(-1, 10), axis=1)
    assert abs(gaps.mean() - 0.5) < 5 * 0.5 / np.sqrt(gaps.size)
    # turns_mean 3: geometric turns, mean 3 (p = 1/3, variance 6): 3000 sessions of at most 9000 messages
    rs = wl.conversations(np.random.default_rng(2), np.arange(3000.0), np.full(12_000, 10), np.full(12_000, 5),
                          turns_mean=3.0)
    assert abs(len(rs) / 3000 - 3.0) < 5 * np.sqrt(6 / 3000)


def _vidur(path, rows):
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(f"{a},{p},{o}\n" for a, p, o in rows))
    return path.name


def test_generate_replays_a_trace_window_by_hand(tmp_path):
    from pdsim.errors import ConfigError
    name = _vidur(tmp_path / "t.csv", [(0.0, 10, 1), (1.0, 20, 2), (2.0, 30, 3), (3.0, 40, 4)])
    rs = _gen(_sc(tmp_path, arrival="trace", trace={"path": name}))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in rs] == \
        [(0.0, 10, 1), (1.0, 20, 2), (2.0, 30, 3), (3.0, 40, 4)]
    # the window [1, 3) mapped to 0, at twice the rate: rows 1 and 2 at 0 and 0.5 s
    rs = _gen(_sc(tmp_path, arrival="trace", trace={"path": name, "start_s": 1.0, "duration_s": 2.0, "rate_scale": 2}))
    assert [(r.arrival_s, r.prompt_tokens) for r in rs] == [(0.0, 20), (0.5, 30)]
    rs = _gen(_sc(tmp_path, arrival="trace", num_requests=2, trace={"path": name}))
    assert [r.prompt_tokens for r in rs] == [10, 20]
    # jitter spreads each arrival over [t, t + jitter): with jitter 0.5, each stays in its own half second
    rs = _gen(_sc(tmp_path, arrival="trace", trace={"path": name, "jitter_s": 0.5}))
    t = [r.arrival_s for r in rs]
    assert all(k <= x < k + 0.5 for k, x in enumerate(t)) and t != [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ConfigError) as e:
        _gen(_sc(tmp_path, arrival="trace", trace={"path": name, "start_s": 10.0}))
    assert "workload.trace" in str(e.value)
    (tmp_path / "l.csv").write_text("num_prefill_tokens,num_decode_tokens\n5,1\n")
    with pytest.raises(ConfigError) as e:
        _gen(_sc(tmp_path, arrival="trace", trace={"path": "l.csv"}))
    assert "workload.trace.path" in str(e.value)


def test_mooncake_trace_replay_keeps_hash_ids(tmp_path):
    from pdsim.errors import ConfigError
    (tmp_path / "m.jsonl").write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 500, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]}\n'
        '{"timestamp": 1000, "input_length": 30, "output_length": 4, "hash_ids": [1, 2, 3]}\n')
    rs = _gen(_sc(tmp_path, arrival="trace", num_requests=2, trace={"path": "m.jsonl", "hash_block_tokens": 10}))
    assert [(r.arrival_s, r.prompt_tokens, r.hash_ids, r.hash_block_tokens) for r in rs] == \
        [(0.0, 10, [1], 10), (0.5, 20, [1, 2], 10)]
    # ids and lengths must agree at the block size: at 8 tokens an id the 10-token row needs 2 ids, not 1
    with pytest.raises(ConfigError) as e:
        _gen(_sc(tmp_path, arrival="trace", trace={"path": "m.jsonl", "hash_block_tokens": 8}))
    assert e.value.key == "workload.trace.hash_block_tokens" and e.value.value == 8
    assert "row 1 by arrival (at 0.000 s): 1 hash ids for input_length 10, where 8 tokens an id need 2" in str(e.value)
    # 9 tokens an id: 10 -> 2 ids again (a short last block is an id too)
    with pytest.raises(ConfigError):
        _gen(_sc(tmp_path, arrival="trace", trace={"path": "m.jsonl", "hash_block_tokens": 9}))


def test_trace_lengths_keep_pairs_from_one_file_and_mix_two(tmp_path):
    # one file for both: every request is a real (prompt, output) row; two files: prompts from one, outputs
    # from the other, independently (all 3 x 3 pairs show up in 2000 requests)
    a = _vidur(tmp_path / "a.csv", [(0.0, 100, 1), (1.0, 200, 2), (2.0, 300, 3)])
    b = _vidur(tmp_path / "b.csv", [(0.0, 7, 70), (1.0, 8, 80), (2.0, 9, 90)])
    tr = lambda p: {"dist": "trace", "path": p}                      # noqa: E731
    rs = _gen(_sc(tmp_path, arrival="constant", rate=1.0, num_requests=2000, prompt_tokens=tr(a), output_tokens=tr(a)))
    assert {(r.prompt_tokens, r.output_tokens) for r in rs} == {(100, 1), (200, 2), (300, 3)}
    rs = _gen(_sc(tmp_path, arrival="constant", rate=1.0, num_requests=2000, prompt_tokens=tr(a), output_tokens=tr(b)))
    assert {(r.prompt_tokens, r.output_tokens) for r in rs} == {(p, o) for p in (100, 200, 300) for o in (70, 80, 90)}
    rs = _gen(_sc(tmp_path, arrival="constant", rate=1.0, num_requests=50, prompt_tokens=5, output_tokens=tr(b)))
    assert {r.prompt_tokens for r in rs} == {5} and {r.output_tokens for r in rs} == {70, 80, 90}
    rs = _gen(_sc(tmp_path, arrival="constant", rate=1.0, num_requests=50, prompt_tokens=tr(b), output_tokens=6))
    assert {r.prompt_tokens for r in rs} == {7, 8, 9} and {r.output_tokens for r in rs} == {6}


def test_trace_format_given_is_the_format_read(tmp_path):
    # a Vidur file read as an Azure trace lacks Azure's columns: the format given is used, not guessed
    from pdsim.errors import TraceError
    a = _vidur(tmp_path / "a.csv", [(0.0, 100, 1), (1.0, 200, 2)])
    b = _vidur(tmp_path / "b.csv", [(0.0, 7, 70), (1.0, 8, 80)])
    for p, o in (({"dist": "trace", "path": a, "format": "azure"}, {"dist": "trace", "path": a, "format": "azure"}),
                 ({"dist": "trace", "path": a, "format": "azure"}, {"dist": "trace", "path": b})):
        with pytest.raises(TraceError):
            _gen(_sc(tmp_path, arrival="constant", rate=1.0, num_requests=5, prompt_tokens=p, output_tokens=o))


def test_generate_conversations_cut_at_duration():
    # sessions start every 0.5 s over 10 s (19 arrivals draw 19 messages: at most 19 requests); turns 5 s
    # apart on average (4 per session): later turns pass 10 s and are dropped, the first turns all stay
    rs = _gen(_sc(arrival="constant", rate=2.0, duration_s=10.0, prompt_tokens=10, output_tokens=5,
                  conversation={"turns": 4, "think_s": 5.0}))
    t = [r.arrival_s for r in rs]
    assert max(t) < 10.0 and len(rs) < 19 and t == sorted(t) and t[0] == 0.5 and 1.0 in t
    assert all(r.hash_ids for r in rs) and [r.id for r in rs] == list(range(len(rs)))


def test_rate_curve_periods_and_time_scale_by_hand():
    # points (2, 1) -> (4, 3), constant outside them, repeating every 10 s: rate 1 until 2 in each period,
    # 1 -> 3 on [2, 4), 3 until the period ends, then back to 1 (the wrap is an edge of its own)
    c = _curve(points=[[2, 1], [4, 3]], period_s=10)
    starts, r0, r1 = wl.rate_breakpoints(c, 25.0)
    assert list(starts) == [0, 2, 4, 10, 12, 14, 20, 22, 24]
    assert list(r0) == [1, 1, 3, 1, 1, 3, 1, 1, 3] and list(r1) == [1, 3, 3, 1, 3, 3, 1, 3, 3]
    # the same at time_scale 0.5: every simulated time halves
    starts, r0, r1 = wl.rate_breakpoints(_curve(points=[[2, 1], [4, 3]], period_s=10, time_scale=0.5), 12.5)
    assert list(starts) == [0, 1, 2, 5, 6, 7, 10, 11, 12]
    assert list(r0) == [1, 1, 3, 1, 1, 3, 1, 1, 3] and list(r1) == [1, 3, 3, 1, 3, 3, 1, 3, 3]
    # an interior knot: (0, 1) -> (4, 3) -> (10, 1) every 10 s
    starts, r0, r1 = wl.rate_breakpoints(_curve(points=[[0, 1], [4, 3], [10, 1]], period_s=10), 20.0)
    assert list(starts) == [0, 4, 10, 14] and list(r0) == [1, 3, 1, 3] and list(r1) == [3, 1, 3, 1]


def test_hourly_rates_hold_the_last_hour_and_switch_on_the_hour():
    # hourly 1, 2 over a 3-hour period: the third hour holds the last value (2), then the day repeats
    starts, r0, _ = wl.rate_breakpoints(_curve(hourly=[1, 2], period_s=10800), 4 * 3600.0)
    assert list(starts) == [0, 3600, 7200, 10800] and list(r0) == [1, 2, 2, 1]   # 7200: the end of the values
    # a burst (x1) from 3600 to 3601 cuts a one-second segment at the start of hour 2: it has hour 2's rate
    c = _curve(hourly=[1, 2], bursts=[{"at_s": 3600, "duration_s": 1, "multiplier": 1}])
    starts, r0, _ = wl.rate_breakpoints(c, 7200.0)
    assert list(starts) == [0, 3600, 3601] and list(r0) == [1, 2, 2]


def test_nhpp_low_rates_zero_segments_and_ramps_away_from_zero():
    rng = np.random.default_rng(11)
    # 0.5 req/s for 2000 s: 1000 +- 5 x 32 arrivals (a rate below 1 is still a rate)
    t = wl.nhpp_arrivals(rng, _curve(points=[[0, 0.5], [1, 0.5]]), 2000.0)
    assert abs(len(t) - 1000) < 5 * np.sqrt(1000)
    # silent (x0) on [0, 5), 100/s on [5, 10): 500 +- 112, all in [5, 10)
    c = _curve(points=[[0, 100], [1, 100]], bursts=[{"at_s": 0, "duration_s": 5, "multiplier": 0}])
    t = wl.nhpp_arrivals(rng, c, 10.0)
    assert abs(len(t) - 500) < 5 * np.sqrt(500) and t.min() >= 5.0
    # a ramp 100 -> 300 on [10, 20) after a flat 100 on [0, 10): 750 on [10, 15), 1250 on [15, 20)
    t = wl.nhpp_arrivals(rng, _curve(points=[[0, 1], [10, 1], [20, 3]], scale=100.0), 20.0)
    for lo, hi, want in ((0, 10, 1000), (10, 15, 750), (15, 20, 1250)):
        k = int(((t >= lo) & (t < hi)).sum())
        assert abs(k - want) < 5 * np.sqrt(want), (lo, hi, k, want)
    # a ramp from 0 to 2 over 2000 s: integral 2000, of which 500 in the first half (rate below 1 there)
    t = wl.nhpp_arrivals(rng, _curve(points=[[0, 0], [2000, 2]]), 2000.0)
    assert abs(len(t) - 2000) < 5 * np.sqrt(2000) and abs((t < 1000).sum() - 500) < 5 * np.sqrt(500)


def test_shared_ints_gives_ints_one_object_per_value_by_hand():
    # float token counts (a trace column read as floats) come back as Python ints; equal values share
    # one int object (1000 > 256 is not one of CPython's cached small ints)
    xs = wl.shared_ints(np.array([1000.0, 7.0, 1000.0]))
    assert xs == [1000, 7, 1000] and all(type(x) is int for x in xs) and xs[0] is xs[2]
    for bad in ([1.0, np.nan], [np.inf], [2.5], [2.0 ** 64]):
        with pytest.raises(ValueError, match="whole numbers"):
            wl.shared_ints(np.array(bad))
    with pytest.raises(ValueError, match="64 bits"):
        wl.shared_ints(np.array([2 ** 64 - 1], dtype=np.uint64))
    assert wl.shared_ints(np.array([], dtype=np.float64)) == []


def test_make_requests_hash_branch_and_integer_arrivals_by_hand():
    # whole-second arrivals given as integers are still float times; the hash branch keeps every length,
    # and without hash_block_tokens a request's hash unit is 0 (not set), as a Request's default
    rs = wl.make_requests(np.array([1, 2]), np.array([10, 20]), np.array([3, 4]), [[5], [5, 6]])
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.hash_block_tokens) for r in rs] == \
        [(1.0, 10, 3, 0), (2.0, 20, 4, 0)]
    assert all(type(r.arrival_s) is float for r in rs)


def test_trace_jitter_is_drawn_per_request_and_errors_name_their_key(tmp_path):
    from pdsim.errors import ConfigError
    name = _vidur(tmp_path / "t.csv", [(0.0, 10, 1), (1.0, 20, 2), (2.0, 30, 3), (3.0, 40, 4)])
    # each request its own uniform shift in [0, 0.5): four continuous draws, never all equal
    t = [r.arrival_s for r in _gen(_sc(tmp_path, arrival="trace", trace={"path": name, "jitter_s": 0.5}))]
    shifts = [x - k for k, x in enumerate(t)]
    assert all(0 <= s < 0.5 for s in shifts) and len(set(shifts)) == 4
    with pytest.raises(ConfigError) as e:                      # a window past the trace's end (3 s)
        _gen(_sc(tmp_path, arrival="trace", trace={"path": name, "start_s": 10.0}))
    assert (e.value.key, e.value.value) == ("workload.trace", name)
    (tmp_path / "l.csv").write_text("num_prefill_tokens,num_decode_tokens\n5,1\n")
    with pytest.raises(ConfigError) as e:                      # lengths only: no timestamps to replay
        _gen(_sc(tmp_path, arrival="trace", trace={"path": "l.csv"}))
    assert (e.value.key, e.value.value) == ("workload.trace.path", "l.csv")


def test_trace_jitter_moves_each_row_with_its_own_arrival(tmp_path):
    # four rows in one 3 s tick (as Mooncake's timestamps come): the jitter reorders them, and each request
    # keeps its own row's lengths and hash chain; the shifts are generate's first draws from the seed (0)
    (tmp_path / "m.jsonl").write_text("".join(
        f'{{"timestamp": 0, "input_length": {p}, "output_length": {o}, "hash_ids": {h}}}\n'
        for p, o, h in ((16, 1, [1]), (32, 2, [1, 2]), (48, 3, [1, 2, 3]), (64, 4, [1, 2, 3, 4]))))
    shift = np.random.default_rng(0).uniform(0, 3.0, 4)
    rows = sorted((s, 16 * (k + 1), k + 1, list(range(1, k + 2))) for k, s in enumerate(shift))
    assert [r[1] for r in rows] != [16, 32, 48, 64]          # the draw does reorder them (else no test)
    rs = _gen(_sc(tmp_path, arrival="trace", trace={"path": "m.jsonl", "jitter_s": 3.0, "hash_block_tokens": 16}))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.hash_ids) for r in rs] == \
        [(pytest.approx(s), p, o, h) for s, p, o, h in rows]
    # num_requests keeps the first two by jittered arrival, each with its own row
    rs = _gen(_sc(tmp_path, arrival="trace", num_requests=2,
                  trace={"path": "m.jsonl", "jitter_s": 3.0, "hash_block_tokens": 16}))
    assert [(r.prompt_tokens, r.hash_ids) for r in rs] == [(p, h) for _, p, _, h in rows[:2]]


def test_trace_jitter_shrinks_with_the_ticks_under_rate_scale(tmp_path):
    """Ticks at 0 and 3 s of trace time, 3 s of jitter, rate_scale 10: the ticks land at 0 and 0.3 s and each
    row moves by the seed's draw x 0.3 s (the spread in trace time, scaled as the ticks are), so the mean
    rate stays 10x; a 3 s spread after scaling would have pushed the first tick's rows past the second's."""
    (tmp_path / "m.jsonl").write_text("".join(
        f'{{"timestamp": {t}, "input_length": 16, "output_length": 1, "hash_ids": [1]}}\n' for t in (0, 0, 3000, 3000)))
    shift = np.random.default_rng(0).uniform(0, 0.3, 4)
    want = sorted(np.array([0.0, 0.0, 0.3, 0.3]) + shift)
    rs = _gen(_sc(tmp_path, arrival="trace", trace={"path": "m.jsonl", "jitter_s": 3.0, "rate_scale": 10,
                                                     "hash_block_tokens": 16}))
    assert [r.arrival_s for r in rs] == pytest.approx(want, abs=1e-12)
    assert max(r.arrival_s for r in rs) < 0.6


def test_trace_replay_reads_the_format_given(tmp_path):
    # the arrival trace too: a Vidur file replayed as an Azure trace lacks Azure's columns
    from pdsim.errors import TraceError
    a = _vidur(tmp_path / "a.csv", [(0.0, 100, 1), (1.0, 200, 2)])
    with pytest.raises(TraceError):
        _gen(_sc(tmp_path, arrival="trace", trace={"path": a, "format": "azure"}))


# --- generate's synthetic branch and workload.shared_prefix_tokens (mutwl3, issue 18) ----------------------------
def _fake_gaps(monkeypatch, gap):
    """Replace the gap draws with constant gaps of ``gap`` s and record each call's (kind, rng, rate, cv, n)."""
    calls = []

    def poisson(rng, rate, n):
        calls.append(("poisson", rng, rate, None, n))
        return np.full(n, gap)

    def gamma(rng, rate, cv, n):
        calls.append(("gamma", rng, rate, cv, n))
        return np.full(n, gap)
    monkeypatch.setattr(wl, "poisson_gaps", poisson)
    monkeypatch.setattr(wl, "gamma_gaps", gamma)
    return calls


def test_generate_guesses_the_count_then_tops_up_on_the_same_stream_by_hand(monkeypatch):
    # rate 4 over 25 s: the guess is int(4 x 25 x 1.2 + 10 x sqrt(100) + 10) = int(120 + 100 + 10) = 230 gaps.
    # With every gap 1/16 s the first 230 reach 230 / 16 = 14.375 s < 25: a second call of 230 more gaps from
    # the same generator continues from 14.375 to 28.75 s >= 25, and the stream is cut below 25 s:
    # k / 16 for k = 1 .. 399 (400 / 16 = 25 is not < 25). Multiples of 1/16 are exact in binary.
    want = [k / 16 for k in range(1, 400)]
    for arrival, extra, cv in (("poisson", {}, None), ("gamma", {"cv": 2.0}, 2.0)):
        calls = _fake_gaps(monkeypatch, 1 / 16)
        rs = _gen(_sc(arrival=arrival, rate=4.0, duration_s=25.0, prompt_tokens=7, output_tokens=3, **extra))
        assert [r.arrival_s for r in rs] == want and [r.id for r in rs] == list(range(399))
        assert [(c[0], c[2], c[3], c[4]) for c in calls] == [(arrival, 4.0, cv, 230)] * 2
        assert isinstance(calls[0][1], np.random.Generator) and calls[1][1] is calls[0][1]
    # num_requests given: 10 gaps drawn once, no top-up although 10 / 16 s is far short of 25 s
    calls = _fake_gaps(monkeypatch, 1 / 16)
    rs = _gen(_sc(arrival="poisson", rate=4.0, duration_s=25.0, num_requests=10))
    assert [r.arrival_s for r in rs] == [k / 16 for k in range(1, 11)]
    assert [(c[0], c[2], c[4]) for c in calls] == [("poisson", 4.0, 10)]
    # num_requests alone (no duration_s): the 10 drawn, none cut
    calls = _fake_gaps(monkeypatch, 3.0)
    rs = _gen(_sc(arrival="gamma", cv=0.5, rate=4.0, num_requests=10))
    assert [r.arrival_s for r in rs] == [3.0 * k for k in range(1, 11)] and len(calls) == 1
    # constant arrivals: the guess at rate 2 over 10 s is int(24 + 10 x sqrt(20) + 10) = int(78.7) = 78 >= 19;
    # no gap is drawn at all
    calls = _fake_gaps(monkeypatch, 1 / 16)
    rs = _gen(_sc(arrival="constant", rate=2.0, duration_s=10.0))
    assert len(rs) == 19 and calls == []


def test_generate_stops_drawing_at_exactly_the_duration_by_hand(monkeypatch):
    # rate 1 over 100 s: the guess is int(120 + 100 + 10) = 230 gaps; gaps of 0.5 s reach 115 s >= 100 at once:
    # one call, arrivals 0.5 .. 99.5 (199 of them)
    calls = _fake_gaps(monkeypatch, 0.5)
    rs = _gen(_sc(arrival="poisson", rate=1.0, duration_s=100.0))
    assert [r.arrival_s for r in rs] == [0.5 * k for k in range(1, 200)] and [c[4] for c in calls] == [230]
    # rate 1 over 19 s: int(22.8 + 10 x sqrt(19) + 10) = int(22.8 + 43.59 + 10) = int(76.39) = 76 gaps of 0.25 s
    # end on 76 / 4 = 19 s exactly: the stream has reached duration_s, nothing more is drawn; the cut keeps
    # 0.25 .. 18.75 (75 arrivals)
    calls = _fake_gaps(monkeypatch, 0.25)
    rs = _gen(_sc(arrival="poisson", rate=1.0, duration_s=19.0))
    assert [r.arrival_s for r in rs] == [0.25 * k for k in range(1, 76)] and [c[4] for c in calls] == [76]


def test_shared_prefix_ids_by_hand():
    # 4 tokens per id, the first 10 tokens shared: 10 // 4 = 2 whole shared units (ids 0, 1); fresh ids from 2
    #   13 tokens: 2 shared units (8 tokens), 5 of its own -> ceil(5 / 4) = 2 fresh: [0, 1, 2, 3]
    #    6 tokens: min(10, 6) // 4 = 1 shared unit, 2 of its own -> 1 fresh: [0, 4]
    #   10 tokens: 2 shared units, 2 left (the shared part's partial unit is content of its own): [0, 1, 5]
    #    3 tokens: no whole unit, 1 fresh: [6]
    #    8 tokens: 2 shared units, nothing left: [0, 1] (no fresh id used)
    #   16 tokens: 2 shared units, 8 of its own -> 2 fresh: [0, 1, 7, 8]
    got = wl.shared_prefix_ids(np.array([13, 6, 10, 3, 8, 16]), 10, 4)
    assert got == [[0, 1, 2, 3], [0, 4], [0, 1, 5], [6], [0, 1], [0, 1, 7, 8]]
    assert all(type(i) is int for ids in got for i in ids)
    # the default unit is 16 tokens: 24 shared -> id 0 shared, fresh from 1; 40 tokens: 24 own -> 2 fresh
    assert wl.SHARED_PREFIX_UNIT == 16
    assert wl.shared_prefix_ids([40, 40], 24) == [[0, 1, 2], [0, 3, 4]]
    assert wl.shared_prefix_ids([], 24) == []


def _shared_sc(topologies, model="llama-3.1-8b", **workload):
    from pdsim import config
    w = {"arrival": "constant", "rate": 1.0, "num_requests": 3, "prompt_tokens": 40, "output_tokens": 2,
         "shared_prefix_tokens": 24, **workload}
    return config.parse({"seed": 0, "model": model, "workload": w, "topologies": topologies}, "s.yaml")


def _gen_warnings(sc):
    import warnings
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        rs = _gen(sc)
    return rs, [(w.category, str(w.message)) for w in seen]


_CONST = {"kind": "constant", "step_s": 0.1}
_PLAIN = {"kind": "colocated", "kv_blocks": 100, "cost_model": _CONST}
_CACHED = {**_PLAIN, "prefix_cache": {"enabled": True}}
_NO_CACHE_SAYS = ("workload.shared_prefix_tokens = 24: no pool caches prefixes (no prefix_cache key, no engine that "
                  "caches by default), so the shared prefix is computed again for every request")


def test_generate_gives_shared_prefix_hash_chains_by_hand():
    # 3 prompts of 40 tokens at 1/s, 24 shared: id 0 shared (16 tokens), then 24 tokens of each its own in 16-token
    # units: 2 fresh ids each, from 24 // 16 = 1 on: [0, 1, 2], [0, 3, 4], [0, 5, 6]; a pool caches: no warning
    rs, said = _gen_warnings(_shared_sc({"c": _CACHED}))
    assert [(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.hash_ids, r.hash_block_tokens) for r in rs] == [
        (0, 1.0, 40, 2, [0, 1, 2], 16), (1, 2.0, 40, 2, [0, 3, 4], 16), (2, 3.0, 40, 2, [0, 5, 6], 16)]
    assert said == []
    # no shared prefix (the default 0): no ids at all
    rs, said = _gen_warnings(_shared_sc({"c": _CACHED}, shared_prefix_tokens=0))
    assert [(r.hash_ids, r.hash_block_tokens) for r in rs] == [(None, 0)] * 3 and said == []
    # prompts of 10 tokens, all inside the 24 shared ones but no whole unit: one fresh id each, from 1
    rs, _ = _gen_warnings(_shared_sc({"c": _CACHED}, prompt_tokens=10))
    assert [r.hash_ids for r in rs] == [[1], [2], [3]]


def test_generate_warns_when_no_pool_caches_the_shared_prefix_by_hand():
    # nothing caches: the same ids, and one UserWarning that says why
    rs, said = _gen_warnings(_shared_sc({"c": _PLAIN}))
    assert [r.hash_ids for r in rs] == [[0, 1, 2], [0, 3, 4], [0, 5, 6]]
    assert said == [(UserWarning, _NO_CACHE_SAYS)]
    # one topology of two caching is enough
    assert _gen_warnings(_shared_sc({"a": _PLAIN, "b": _CACHED}))[1] == []
    assert _gen_warnings(_shared_sc({"a": _CACHED, "b": _PLAIN}))[1] == []
    # disaggregated: a cache on either pool counts ...
    pool = {"instances": 1, "kv_blocks": 100, "cost_model": _CONST}
    for pre, dec in (({}, {"prefix_cache": {"enabled": True}}), ({"prefix_cache": {"enabled": True}}, {})):
        topo = {"kind": "disaggregated", "prefill": {**pool, **pre}, "decode": {**pool, **dec}}
        assert _gen_warnings(_shared_sc({"d": topo}))[1] == [], (pre, dec)
    assert _gen_warnings(_shared_sc({"d": {"kind": "disaggregated", "prefill": pool, "decode": pool}}))[1] == \
        [(UserWarning, _NO_CACHE_SAYS)]


def test_generate_counts_an_engine_that_caches_by_default_on_the_entry_pool_only():
    # vLLM v1 caches prefixes by default: a colocated pool with it and no prefix_cache key caches; so does a
    # disaggregated prefill pool (where prompts enter); a decode pool's engine default does not count (a decode
    # pool stays uncached by default, engines.with_engine_prefix_cache); vLLM v0 does not cache by default
    eng = {"kind": "colocated", "device": "h100-sxm", "engine": "vllm-v1"}
    assert _gen_warnings(_shared_sc({"c": eng}))[1] == []
    assert _gen_warnings(_shared_sc({"c": {**eng, "engine": "vllm-v0"}}))[1] == [(UserWarning, _NO_CACHE_SAYS)]
    pool = {"instances": 1, "device": "h100-sxm"}
    v1 = {**pool, "engine": "vllm-v1"}
    assert _gen_warnings(_shared_sc({"d": {"kind": "disaggregated", "prefill": v1, "decode": pool}}))[1] == []
    assert _gen_warnings(_shared_sc({"d": {"kind": "disaggregated", "prefill": pool, "decode": v1}}))[1] == \
        [(UserWarning, _NO_CACHE_SAYS)]
    # gpt-oss-120b has sliding-window layers: no engine default caching for it, and the warning says so
    rs, said = _gen_warnings(_shared_sc({"c": {**eng, "tp": 4}}, model="gpt-oss-120b"))
    assert said == [(UserWarning, "workload.shared_prefix_tokens = 24: no pool caches prefixes (pdsim does not model "
                                  "prefix caching with sliding-window layers), so the shared prefix is computed "
                                  "again for every request")]
    assert [r.hash_ids for r in rs] == [[0, 1, 2], [0, 3, 4], [0, 5, 6]]
    # caching turned off by the scenario: the warning blames that, not the model (gpt-oss too)
    off = {**eng, "prefix_cache": {"enabled": False}}
    for model, extra in (("llama-3.1-8b", {}), ("gpt-oss-120b", {"tp": 4})):
        said = _gen_warnings(_shared_sc({"c": {**off, **extra}}, model=model))[1]
        assert said == [(UserWarning, "workload.shared_prefix_tokens = 24: no pool caches prefixes (prefix_cache: "
                                      "{enabled: false} on vllm-v1), so the shared prefix is computed again for "
                                      "every request")], model


def test_generate_errors_say_what_is_wrong_by_hand():
    from pdsim.errors import ConfigError
    # llama-3.1-8b: 131,072 tokens of context
    for w, key, value, says in (
            ({"prompt_tokens": 131072, "output_tokens": 1}, "workload.prompt_tokens", 131072,
             "longer than the 131072-token context of llama-3.1-8b"),
            ({"prompt_tokens": 10, "output_tokens": 131072}, "workload.output_tokens", 131072,
             "longer than the 131072-token context of llama-3.1-8b"),
            ({"prompt_tokens": 100000, "output_tokens": 31073}, "workload.output_tokens", 31073,
             "prompt + output exceed the 131072-token context of llama-3.1-8b")):
        with pytest.raises(ConfigError) as e:
            _gen(_sc(arrival="constant", rate=1.0, num_requests=2, **w))
        assert (e.value.key, e.value.value, e.value.reason) == (key, value, says)
    # a rate curve silenced over the whole 10 s
    with pytest.raises(ConfigError) as e:
        _gen(_sc(rate_curve={"points": [[0, 1], [10, 1]], "bursts": [{"at_s": 0, "duration_s": 10, "multiplier": 0}]},
                 duration_s=10.0))
    assert (e.value.key, e.value.value, e.value.reason) == \
        ("workload.rate_curve", 10.0, "the rate curve gives no arrivals in duration_s")


def test_generate_draws_from_the_scenario_seed_in_a_fixed_order():
    # seed 7, Poisson at 2/s, 3 requests: the gaps are the first 3 exponential(mean 0.5) draws of numpy's
    # default_rng(7), then the prompts its next 3 integers in [10, 20], then the outputs 3 more in [1, 5]
    # (numpy's generator is the reference; pdsim's only part is the order of the draws and their parameters)
    from pdsim import config
    ref = np.random.default_rng(7)
    gaps = ref.exponential(0.5, 3)
    prompts, outputs = ref.integers(10, 21, 3), ref.integers(1, 6, 3)
    w = {"arrival": "poisson", "rate": 2.0, "num_requests": 3, "prompt_tokens": {"dist": "uniform", "low": 10, "high": 20},
         "output_tokens": {"dist": "uniform", "low": 1, "high": 5}}
    sc = config.parse({"seed": 7, "model": "llama-3.1-8b", "workload": w,
                       "topologies": {"c": {"kind": "colocated", "kv_blocks": 100, "cost_model": _CONST}}}, "s.yaml")
    rs = _gen(sc)
    assert [r.arrival_s for r in rs] == pytest.approx([gaps[0], gaps[0] + gaps[1], gaps.sum()], abs=0, rel=1e-15)
    assert [r.prompt_tokens for r in rs] == prompts.tolist() and [r.output_tokens for r in rs] == outputs.tolist()


def test_generate_passes_the_conversation_keys_and_the_context_by_hand():
    # sessions start at 1, 2, 3, 4 s (constant 1/s, 4 arrivals = 4 messages); unbounded turns, no think time,
    # one 20-token system prompt, 10-token messages, 5-token replies, 16 tokens per id: session 0 takes all
    # 4 messages at 1.0 s (prompts 30, 45, 60, 75). Ids: system [1] + 4 tokens; turn 0: 4 + 10 + 5 = 19 ->
    # id 2, 3 left -> partial 3: [1, 2, 3]; turn 1: 3 + 15 = 18 -> id 4, partial 5: [1, 2, 4, 5]; turn 2:
    # 2 + 15 = 17 -> id 6, partial 7: [1, 2, 4, 6, 7]; turn 3: 1 + 15 = 16 -> id 8, no partial: [1, 2, 4, 6, 8]
    conv = {"turns": 1e6, "system_prompts": 1, "system_tokens": 20, "block_tokens": 16}
    rs = _gen(_sc(arrival="constant", rate=1.0, num_requests=4, prompt_tokens=10, output_tokens=5, conversation=conv))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.hash_ids, r.hash_block_tokens, r.hash_tokens)
            for r in rs] == [(1.0, 30, 5, [1, 2, 3], 16, 35), (1.0, 45, 5, [1, 2, 4, 5], 16, 50),
                             (1.0, 60, 5, [1, 2, 4, 6, 7], 16, 65), (1.0, 75, 5, [1, 2, 4, 6, 8], 16, 80)]
    # 8 tokens per id, no system prompt: 10 + 5 = 15 -> id 1, partial 2: [1, 2]; then 7 + 15 = 22 -> ids 3, 4,
    # partial 5 ... only the first two turns checked
    rs = _gen(_sc(arrival="constant", rate=1.0, num_requests=2, prompt_tokens=10, output_tokens=5,
                  conversation={"turns": 1e6, "block_tokens": 8}))
    assert [(r.prompt_tokens, r.hash_ids, r.hash_block_tokens) for r in rs] == [(10, [1, 2], 8), (25, [1, 3, 4, 5], 8)]
    # llama-3.1-8b's 131,072-token context ends a session: 60,000-token messages, 5-token replies: turn 0 is
    # 20 + 60,000 + 5 = 60,025 tokens, turn 1 120,030 <= 131,072, turn 2 would be 180,035: session 0 (1 s)
    # ends after 2 turns, session 1 (2 s) takes messages 3 and 4
    rs = _gen(_sc(arrival="constant", rate=1.0, num_requests=4, prompt_tokens=60000, output_tokens=5, conversation=conv))
    assert [(r.arrival_s, r.prompt_tokens) for r in rs] == [(1.0, 60020), (1.0, 120025), (2.0, 60020), (2.0, 120025)]


def test_generate_clips_lognormal_prompts_at_the_model_context():
    # lognormal prompts of mean 2000, CV 8 without max: sigma^2 = ln(65) = 4.17, mu = ln 2000 - 4.17 / 2 = 5.51;
    # P(x > 131,072) = P(z > (11.78 - 5.51) / 2.04 = 3.07) = 0.0011: about 21 of 20,000 draws pass llama-3.1-8b's
    # 131,072-token context and are clipped to it (P(none) = e^-21)
    rs = _gen(_sc(arrival="constant", rate=1.0, num_requests=20000, output_tokens=1,
                  prompt_tokens={"dist": "lognormal", "mean": 2000, "cv": 8.0}))
    prompts = np.array([r.prompt_tokens for r in rs])
    assert prompts.max() == 131072 and (prompts == 131072).sum() >= 5 and prompts.min() >= 1


def test_trace_errors_say_what_is_wrong_by_hand(tmp_path):
    from pdsim.errors import ConfigError
    name = _vidur(tmp_path / "t.csv", [(0.0, 10, 1), (1.0, 20, 2)])
    with pytest.raises(ConfigError) as e:                      # the trace ends at 1 s: nothing from 10 s on
        _gen(_sc(tmp_path, arrival="trace", trace={"path": name, "start_s": 10.0}))
    assert e.value.reason == "no trace rows in the chosen window"
    (tmp_path / "l.csv").write_text("num_prefill_tokens,num_decode_tokens\n5,1\n")
    with pytest.raises(ConfigError) as e:
        _gen(_sc(tmp_path, arrival="trace", trace={"path": "l.csv"}))
    assert e.value.reason == ("this trace has no timestamps; use it for lengths (prompt_tokens: {dist: trace, "
                              "path: ...}) with a synthetic arrival")


def test_shared_ints_guards_the_int64_range_at_its_edges_by_hand():
    # 2^63 as a float is one past int64's largest value (2^63 - 1): refused, not wrapped to -2^63
    with pytest.raises(ValueError, match="whole numbers"):
        wl.shared_ints(np.array([2.0 ** 63]))
    with pytest.raises(ValueError, match="whole numbers"):
        wl.shared_ints(np.array([2.0 ** 63 + 2.0 ** 11]))          # the next float above it, still < 2^64
    # 2^62 as a float fits: the same int back
    assert wl.shared_ints(np.array([2.0 ** 62])) == [2 ** 62]
    # an unsigned count of exactly 2^63 - 1 fits in int64; 2^63 does not
    assert wl.shared_ints(np.array([2 ** 63 - 1], dtype=np.uint64)) == [2 ** 63 - 1]
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        wl.shared_ints(np.array([2 ** 63], dtype=np.uint64))


def test_generate_lognormal_lengths_floor_at_one_token():
    # lognormal outputs of mean 1.5, CV 1: sigma^2 = ln 2 = 0.69, mu = ln 1.5 - 0.35 = 0.06; P(x < 1.5), which
    # rounds to 0 or 1, is P(z < (0.41 - 0.06) / 0.83 = 0.42) = 0.66: about 660 of 1000 outputs are 1 token
    # (the floor is 1, not 2: a one-token reply is a reply)
    rs = _gen(_sc(arrival="constant", rate=1.0, num_requests=1000, prompt_tokens=10,
                  output_tokens={"dist": "lognormal", "mean": 1.5, "cv": 1.0}))
    out = np.array([r.output_tokens for r in rs])
    assert out.min() == 1 and abs((out == 1).mean() - 0.66) < 0.08            # sd of the share: 0.015
