"""The speed work keeps results exact: column-wise outputs equal the per-row/pandas originals, shared
streams equal freshly generated ones.  (Speed itself is measured by benchmarks/, never asserted here.)"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pdsim import metrics
from pdsim.output import write_csv


class _Req:
    def __init__(self, token_s):
        self.token_s = token_s


def test_itl_columns_hand_worked():
    # tokens at 0, 1, 3, 6 s: gaps 1, 2, 3; p99 at index (3 - 1) * 0.99 = 1.98 of the sorted gaps:
    # 2 + 0.98 * (3 - 2) = 2.98.  A request with one token has no gap; None: not recorded.
    rs = [_Req([0.0, 1.0, 3.0, 6.0]), _Req([5.0]), _Req(None), _Req([2.0, 2.5])]
    mean, p99, mx = metrics.itl_columns(rs, np.zeros(4, np.int64))
    assert mean[0] == pytest.approx(2.0) and p99[0] == pytest.approx(2.98) and mx[0] == 3.0
    assert np.isnan([mean[1], p99[1], mx[1], mean[2], p99[2], mx[2]]).all()
    assert (mean[3], p99[3], mx[3]) == (0.5, 0.5, 0.5)
    # the client's first token is the second one (k0 = 1): gaps 2, 3 only
    mean, p99, mx = metrics.itl_columns(rs, np.array([1, 0, 0, 1]))
    assert mean[0] == pytest.approx(2.5) and p99[0] == pytest.approx(2.99) and mx[0] == 3.0
    assert np.isnan(mean[3])          # one token left after the first: no gap


def test_itl_columns_bit_exact_against_per_request_numpy():
    """The oracle is numpy applied to each request alone (what the per-request loop computed)."""
    rng = np.random.default_rng(3)
    rs = []
    for i in range(400):
        n = int(rng.integers(0, 300))
        scale = rng.choice([1e-3, 1.0, 1e3])
        rs.append(_Req(None if i % 13 == 0 else np.cumsum(rng.exponential(scale, n)).tolist()))
    k0 = rng.integers(0, 2, len(rs))
    mean, p99, mx = metrics.itl_columns(rs, k0)
    for i, r in enumerate(rs):
        if r.token_s is None or len(r.token_s) - k0[i] < 2:
            assert np.isnan(mean[i]) and np.isnan(p99[i]) and np.isnan(mx[i])
            continue
        g = np.diff(np.asarray(r.token_s[k0[i]:]))
        assert (mean[i], p99[i], mx[i]) == (g.mean(), np.percentile(g, 99), g.max()), i
    keep = rng.random(len(rs)) < 0.5
    want = [np.diff(np.asarray(r.token_s[k0[i]:])) for i, r in enumerate(rs)
            if keep[i] and r.token_s is not None and len(r.token_s) - k0[i] >= 2]
    assert np.array_equal(metrics.itl_gaps(rs, k0, keep), np.concatenate(want))


@pytest.mark.parametrize("frame", [
    pd.DataFrame({"topology": np.array(["a", "b,c", 'q"x', None, float("nan"), "line\nbreak"], dtype=object),
                  "mixed": np.array([pd.NA, 1.5, 0.1 + 0.2, True, pd.NaT, 7], dtype=object),
                  "x_s": [np.inf, -np.inf, np.nan, 1e-300, -0.0, 123456789.123456],
                  "n": np.arange(6) - 3, "warmup": [True, False] * 3}),
    pd.DataFrame({"topology": np.array(["a", "b", None], dtype=object), "x_s": [0.1, 2.0 / 3.0, np.nan],
                  "n": [1, 2, 3]}),
    pd.DataFrame({"topology": np.array(['q"x', "line\nbreak", "cr\r"], dtype=object), "x_s": [1.0, 2.0, 3.0]}),
    pd.DataFrame({"only": ["", "", ""]}),
    pd.DataFrame({"a,b": [1.0, 2.5], "c": [1, 2]}),
    pd.DataFrame(columns=metrics.REQUEST_COLUMNS),
    pd.DataFrame(),
], ids=["awkward", "plain", "quotes-no-comma", "one-empty-column", "comma-header", "no-rows", "no-columns"])
@pytest.mark.parametrize("fmt", ["%.9g", "%.6g"])
@pytest.mark.parametrize("chunk_rows", [65_536, 2, 1])     # rows formatted at a time: chunks with and without quoting
def test_write_csv_same_bytes_as_pandas(tmp_path, frame, fmt, chunk_rows):
    frame.to_csv(tmp_path / "pandas.csv", index=False, float_format=fmt)
    write_csv(frame, tmp_path / "ours.csv", fmt, chunk_rows=chunk_rows)
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_gemm_roofline_scalar_path_matches_formula_and_array_path():
    """The scalar fast path of kernels.gemm_roofline: a hand-computed roofline, and bit-equality with
    the array path (which the k-step decode evaluation uses) over many shapes and dtypes."""
    from pdsim import kernels
    from pdsim.devices import get_device
    dev = get_device("h100-sxm")
    e = dev.spec.efficiency
    m, n, k = 1000, 4096, 4096
    flops, bytes_ = 2.0 * m * n * k, n * k * 2.0 + (m * k + m * n) * 2.0
    want = max(flops * (m + e.gemm_m_half) / (m * dev.peak_flops("bf16") * e.gemm_max),
               bytes_ / (dev.mem_bw_Bps * e.memory)) + e.kernel_overhead_us * 1e-6
    got = kernels.gemm_roofline(dev, m, n, k, 2.0)
    assert isinstance(got, float) and got == pytest.approx(want, rel=1e-12)
    rng = np.random.default_rng(5)
    for _ in range(2000):
        m = int(rng.integers(1, 20000)) if rng.random() < 0.7 else float(rng.uniform(0.5, 5000))
        n, k = int(rng.integers(1, 60000)), int(rng.integers(1, 20000))
        wb, wo = float(rng.choice([2.0, 1.0, 0.5])), rng.choice([None, "int4", "int8"])
        dt = str(rng.choice(["bf16", "fp8"]))
        arr = kernels.gemm_roofline(dev, np.array([m], float), n, k, wb, 2.0, dt, wo)
        assert kernels.gemm_roofline(dev, m, n, k, wb, 2.0, dt, wo) == arr[0]


def _fields(r):
    return (r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.computed, r.generated, r.blocks, r.status,
            r.hash_ids, r.hash_block_tokens, r.hash_tokens)


def test_shared_stream_equals_a_fresh_generation_and_hands_out_independent_copies(tmp_path):
    from pdsim import config
    from pdsim.simulation import generate, resolve_model, shared_stream
    raw = {"seed": 4, "model": "llama-3.1-8b",
           "workload": {"arrival": "poisson", "rate": 5, "num_requests": 50,
                        "prompt_tokens": {"dist": "lognormal", "mean": 300, "cv": 1.0},
                        "output_tokens": {"dist": "uniform", "low": 2, "high": 40},
                        "conversation": {"turns": 3, "think_s": 2.0, "system_prompts": 2, "system_tokens": 64}},
           "topologies": {"c": {"kind": "colocated"}}}
    sc = config.parse(raw, "t.yaml")
    model = resolve_model(sc)
    a = shared_stream(sc, model)
    assert [_fields(r) for r in a] == [_fields(r) for r in generate(sc, model)]
    a[0].computed, a[0].generated, a[0].status = 7, 3, "finished"     # what a simulation does to its copy
    b = shared_stream(sc, model)
    assert b[0] is not a[0] and _fields(b[0]) == _fields(generate(sc, model)[0])
    # another seed is another stream
    other = shared_stream(config.parse({**raw, "seed": 5}, "t.yaml"), model)
    assert [r.arrival_s for r in other] != [r.arrival_s for r in b]


def test_shared_stream_rereads_a_trace_that_changed(tmp_path):
    from pdsim import config
    from pdsim.simulation import resolve_model, shared_stream
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.0,100,10\n"
                     "2023-11-16 18:17:04.0,200,20\n")
    raw = {"model": "llama-3.1-8b", "workload": {"arrival": "trace", "trace": {"path": "t.csv"}},
           "topologies": {"c": {"kind": "colocated"}}}
    sc = config.parse(raw, str(tmp_path / "s.yaml"), base_dir=tmp_path)
    model = resolve_model(sc)
    assert [r.prompt_tokens for r in shared_stream(sc, model)] == [100, 200]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.0,100,10\n"
                     "2023-11-16 18:17:04.0,200,20\n2023-11-16 18:17:05.0,3000,30\n")
    assert [r.prompt_tokens for r in shared_stream(sc, model)] == [100, 200, 3000]


def test_lazy_command_stubs_say_what_the_real_parsers_say():
    """`pdsim run ...` builds calibrate/profile as help-only stubs; their help must stay the real one."""
    import argparse

    from pdsim.__main__ import _LAZY_COMMANDS, build_parser

    def helps(ap):
        sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
        return {c.dest: c.help for c in sub._choices_actions}
    full, lazy = helps(build_parser()), helps(build_parser(["run", "x.yaml"]))
    assert lazy == full
    assert {k: full[k] for k in _LAZY_COMMANDS} == _LAZY_COMMANDS
    assert helps(build_parser(["--help"])) == full == helps(build_parser(["-h"]))


def test_help_and_run_do_not_import_the_lazy_commands():
    """`pdsim --help` and `pdsim run` build calibrate/profile as stubs: their modules (devices tables, pyarrow
    probing, ~0.2 s) are not imported; `pdsim profile ...` imports its own."""
    import subprocess
    import sys
    code = ("import sys; from pdsim.__main__ import build_parser; build_parser({argv}); "
            "print('pdsim.profile_import' in sys.modules, 'pdsim.calibrate' in sys.modules)")
    for argv, want in ((["--help"], "False False"), (["run", "x.yaml"], "False False"), (["profile", "list"], "True")):
        out = subprocess.run([sys.executable, "-c", code.format(argv=argv)], capture_output=True, text=True, check=True)
        assert out.stdout.strip().startswith(want), (argv, out.stdout)


def test_arrivals_that_only_queue_do_not_cut_the_window():
    """A replica whose batch is full (max_running 2) while a queue waits: new arrivals cannot be admitted
    before a running request finishes, so they must not end the decode window.  The oracle is the
    step-by-step loop (one event per step): same requests, same counters; and fewer windows than
    arrivals-while-queued would force."""
    from conftest import scenario
    from pdsim.simulation import simulate
    from test_fastpath import _assert_same
    topo = {"kind": "colocated", "replicas": 1, "device": "h100-sxm", "max_running": 2}
    sc = scenario({"t": topo}, rate=200.0, num_requests=30, prompt_tokens=64,
                  output_tokens={"dist": "uniform", "low": 200, "high": 400})
    fast, slow = simulate(sc), simulate(sc, fast=False)
    _assert_same(fast, slow)
    inst = fast[0].topology.instances[0]
    # 30 requests through a batch of 2: a window ends at each finish (a queued request is then admitted),
    # so at most one window per request; arrivals that cut windows (the old behaviour) made it 45
    assert inst.windows <= 30, inst.windows


def _disagg_sc(itl: str, seed: int = 2):
    from pdsim import config
    return config.parse({
        "seed": seed, "model": "llama-3.1-8b",
        "workload": {"arrival": "poisson", "rate": 40, "num_requests": 120,
                     "prompt_tokens": {"dist": "lognormal", "mean": 400, "cv": 1.0},
                     "output_tokens": {"dist": "uniform", "low": 1, "high": 60}},
        "client": {"itl": itl, "warmup_requests": 5, "network_rtt_s": 0.002},
        "topologies": {"pd": {"kind": "disaggregated", "prefill": {"instances": 1, "device": "h100-sxm"},
                              "decode": {"instances": 1, "device": "h100-sxm"}, "kv_link": {"preset": "infiniband"}},
                       "c": {"kind": "colocated", "replicas": 2, "device": "h100-sxm"}}}, "t.yaml")


def test_requests_frame_chunk_by_chunk_equals_all_at_once(monkeypatch):
    """The frame is read from the objects FRAME_CHUNK requests at a time; chunks of 7 (ITL columns, a PD
    proxy's first token, warm-up, RTT) give the very same frame as one chunk."""
    from pdsim.simulation import simulate
    sc = _disagg_sc("on")
    res = simulate(sc)
    whole = metrics.requests_frame(res, sc.client)
    assert whole.itl_mean_s.notna().any() and (whole.warmup.sum() == 10)
    monkeypatch.setattr(metrics, "FRAME_CHUNK", 7)
    pd.testing.assert_frame_equal(metrics.requests_frame(res, sc.client), whole, check_exact=True)


@pytest.mark.parametrize("itl", ["off", "on"])
def test_release_drops_the_requests_only_where_nothing_reads_them_after(tmp_path, monkeypatch, itl):
    """write_outputs(release=True) (pdsim run): the same files and summary as without; the Request objects
    are dropped only when releasable (no token times, no prefix pool), else left in place."""
    from pdsim.output import write_outputs
    from pdsim.simulation import simulate
    monkeypatch.setattr(metrics, "FRAME_CHUNK", 16)
    sc = _disagg_sc(itl)
    kept, freed = simulate(sc), simulate(sc)
    a = write_outputs(kept, sc, tmp_path / "a", report=False)
    b = write_outputs(freed, sc, tmp_path / "b", report=False, release=True)
    assert a == b
    for name in ("requests.csv", "timeseries.csv", "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert all(len(r.requests) == 120 for r in kept)
    assert all(len(r.requests) == (0 if itl == "off" else 120) for r in freed)
    assert metrics.releasable(kept) == (itl == "off")


def test_window_sums_in_python_are_numpys():
    """instance._sum (Python for fewer than 8 values) is float(a.sum()) bit for bit, and instance._growth
    is the numpy expression the window used, over many sizes, magnitudes and slices (issue 19)."""
    from pdsim.instance import _growth, _sum
    rng = np.random.default_rng(19)
    for _ in range(3000):
        n = int(rng.integers(0, 40))
        a = rng.random(n + 5) * 10.0 ** rng.integers(-9, 9, n + 5)
        lo = int(rng.integers(0, 5))
        v = a[lo:lo + n]
        assert _sum(v) == float(v.sum()) and type(_sum(v)) is float
    assert _sum(np.array([-0.0])) == float(np.array([-0.0]).sum()) and str(_sum(np.array([-0.0]))) == "0.0"
    for _ in range(2000):
        B, bs = int(rng.integers(1, 30)), int(rng.choice([1, 16, 32]))
        c0 = rng.integers(0, 5000, B)
        blk1 = -(-(c0 + 1) // bs) + rng.integers(0, 3, B)
        j = int(rng.integers(1, 300))
        want = int(np.maximum(0, -(-(c0 + j) // bs) - blk1).sum())
        assert _growth(c0.tolist(), blk1.tolist(), j, bs) == want


def test_itl_percentiles_from_sorted_gaps_are_numpys():
    """metrics.itl_summary takes its percentiles of the sorted gaps: bit for bit np.percentile of the gaps
    as they come (order statistics and their lerp), ties and NaN-free heavy tails included (issue 19)."""
    from types import SimpleNamespace as NS
    from pdsim import config
    rng = np.random.default_rng(7)
    for trial in range(20):
        rs = []
        for i in range(int(rng.integers(1, 60))):
            t = np.cumsum(np.round(rng.lognormal(-3, 1.5, int(rng.integers(1, 40))), int(rng.integers(2, 6))))
            rs.append(NS(id=i, first_token_s=float(t[0]), decode_first_s=float("nan"), token_s=t.tolist()))
        d = {"request_id": np.arange(len(rs)), "status": np.array(["finished"] * len(rs), dtype=object)}
        s = metrics.itl_summary(NS(requests=rs, topology=NS(kind="colocated")), d, config.ClientSpec())
        g = np.concatenate([np.diff(np.asarray(r.token_s)) for r in rs])
        if len(g) == 0:
            assert s is None
            continue
        q = np.percentile(g, [50, 90, 99])
        assert (s["p50"], s["p90"], s["p99"], s["mean"]) == (q[0], q[1], q[2], g.mean())
        assert s["quantiles"] == [float(v) for v in np.percentile(g, metrics.ITL_QUANTILE_LEVELS)]
