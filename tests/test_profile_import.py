"""Importing public measured kernel databases (pdsim.profile_import) and the table lookups they feed.

The aiconfigurator-core package is not needed: each test writes a small synthetic ``systems``
folder shaped like the package's (same paths, file stems and columns; CSV instead of parquet so
pyarrow is not needed either).  Its latencies follow closed-form power laws, which log-space
interpolation must reproduce exactly between the table points: that is the oracle.
"""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from pdsim import profile_import as pi
from pdsim.__main__ import main
from pdsim.devices import DeviceProfile, ProfileSpec, get_device, load_profile_file
from pdsim.errors import ConfigError
from pdsim.profile_tables import LogCurve, LogGrid, MeasuredTables

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "calibration" / "profiles"
VIDUR = ROOT.parent / "shared" / "reference" / "vidur" / "measured" / "data" / "profiling"

# closed-form "measurements" (latency in ms, as the package stores them)
def gemm_ms(m, n, k):
    return 2e-9 * m * n * k                       # a power law: bilinear in log space is exact


def prefill_ms(b, s):
    return 3e-7 * b * s * s


def decode_ms(b, c):
    return 4e-6 * b * c


def ar_ms(elements, tp, impl):
    return (0.01 if impl == "nccl" else 0.005) * (elements / 1024) ** 0.5 * tp / 2


def moe_ms(t):
    return 0.02 * t ** 0.5


MOE_TOKENS = [1, 4, 16, 64, 256]
GEMM_MS = [1, 4, 16, 64, 256]
GEMM_NK = [256, 1024, 4096]
PRE_B, PRE_S = [1, 2, 4], [128, 512, 2048]
DEC_B, DEC_STEP = [1, 4, 16], [127, 511, 2047]     # context = step + 1
AR_ELEMS = [1024, 16384, 262144]


def write_fake_package(root: Path, *, generation=True, version="1.0.0") -> Path:
    """A ``systems`` folder like aiconfigurator-core's, for one system ``tsys`` and backend trtllm."""
    sysdir = root / "systems"
    d = sysdir / "data" / "tsys"
    (sysdir).mkdir(parents=True)
    (sysdir / "tsys.yaml").write_text(
        "data_dir: data/tsys\ngpu:\n  mem_bw: 2000000000000\n  mem_capacity: 85899345920\n"
        "  bfloat16_tc_flops: 500000000000000\n  fp8_tc_flops: 1000000000000000\n"
        "node:\n  intra_node_bw: 300000000000\n  p2p_latency: 0.00001\nmisc:\n  nccl_version: '2.0'\n")
    (sysdir / "other.yaml").write_text("data_dir: data/other\ngpu:\n  mem_bw: 1\n")   # no data: listed as such
    common = {"framework": "TRTLLM", "version": version, "device": "Fake GPU", "kernel_source": "x"}
    rows = [{**common, "op_name": "gemm", "gemm_dtype": dt, "m": m, "n": n, "k": k,
             "latency": gemm_ms(m, n, k) * (0.5 if dt == "fp8" else 1)}
            for dt in ("bfloat16", "fp8") for m in GEMM_MS for n in GEMM_NK for k in GEMM_NK]
    _csv(d / "gemm" / "trtllm" / version / "gemm_perf.csv", rows)
    att = {"num_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "beam_width": 1}
    rows = [{**common, **att, "op_name": "context_attention", "batch_size": b, "isl": s, "window_size": w,
             "attn_dtype": "bfloat16", "kv_cache_dtype": kv, "step": 0,
             "latency": prefill_ms(b, s) * (1 if w == 0 else 0.1) * (1 if kv == "bfloat16" else 0.7)}
            for b in PRE_B for s in PRE_S for w in (0, 128) for kv in ("bfloat16", "fp8")
            if b * s <= 4096]                                 # ragged, as the real tables are
    _csv(d / "attention" / "trtllm" / version / "context_attention_perf.csv", rows)
    if generation:
        rows = [{**common, **att, "op_name": "generation_attention", "batch_size": b, "isl": 1, "window_size": 0,
                 "attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "step": s, "latency": decode_ms(b, s + 1)}
                for b in DEC_B for s in DEC_STEP if b * (s + 1) <= 8192]        # ragged: 16 x 2048 missing
        _csv(d / "attention" / "trtllm" / version / "generation_attention_perf.csv", rows)
    rows = [{**common, "op_name": op, "nccl_dtype": dt, "num_gpus": tp, "message_size": e,
             "latency": ar_ms(e, tp, "nccl") * (1 if op == "all_reduce" else 0.5)}
            for op in ("all_reduce", "all_gather") for dt in ("half", "int8") for tp in (2, 4) for e in AR_ELEMS]
    _csv(d / "comm" / "nccl" / "2.0" / "nccl_perf.csv", rows)
    rows = [{**common, "op_name": "all_reduce", "allreduce_dtype": "bfloat16", "num_gpus": tp, "message_size": e,
             "latency": ar_ms(e, tp, "custom"), "implementation": "trtllm"} for tp in (2, 4) for e in AR_ELEMS[:2]]
    _csv(d / "comm" / "trtllm" / version / "custom_allreduce_perf.csv", rows)
    # MoE: Qwen3-30B-A3B's layer shape (hidden 2048, expert width 768, top-8 of 128); only balanced
    # routing is imported, the power-law rows are not; a non-gated kernel's rows stay apart
    shape = {"hidden_size": 2048, "inter_size": 768, "topk": 8, "num_experts": 128, "moe_tp_size": 1,
             "moe_ep_size": 1}
    rows = [{**common, **shape, "op_name": "moe", "kernel_source": ks, "moe_dtype": dt, "num_tokens": t,
             "distribution": dist, "latency": moe_ms(t) * f * (3.0 if dist != "balanced" else 1.0)}
            for ks, dt, f in (("moe_torch_flow_cutlass", "bfloat16", 1.0), ("moe_torch_flow_cutlass", "fp8_block", 0.5),
                              ("moe_torch_flow_cutlass", "fp8", 0.6), ("moe_torch_flow_nongated", "bfloat16", 0.7))
            for t in MOE_TOKENS for dist in ("balanced", "power_law_1.2")]
    _csv(d / "moe" / "trtllm" / version / "moe_perf.csv", rows)
    (d / "mla_bmm" / "trtllm" / version).mkdir(parents=True)       # a family pdsim does not import
    return sysdir


def _csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    return write_fake_package(tmp_path_factory.mktemp("aic"))


@pytest.fixture(scope="module")
def imported(fake, tmp_path_factory):
    out = tmp_path_factory.mktemp("prof") / "tsys.yaml"
    assert main(["profile", "import", "aiconfigurator", "--system", "tsys", "--backend", "trtllm",
                 "--data-dir", str(fake), "--out", str(out)]) == 0
    return out, load_profile_file(out)


REL = 1e-3      # times are stored to 4 significant digits


# --- the importer on the synthetic package ----------------------------------------------------------
def test_import_writes_a_valid_attributed_profile(imported):
    out, dev = imported
    assert dev.is_measured and dev.source.startswith("measured: NVIDIA aiconfigurator-core")
    assert "system tsys, backend trtllm 1.0.0" in dev.source
    meta = dev.spec.meta
    assert meta["imported_from"]["license"] == "Apache-2.0"
    assert meta["imported_from"]["tables"]["allreduce_nccl"] == "comm/nccl/2.0/nccl_perf.csv"
    assert "mla_bmm" in meta["not_imported"] and meta["imported_from"]["tables"]["moe"] == "moe/trtllm/1.0.0/moe_perf.csv"
    # peaks and memory come from the system file, in pdsim units
    assert dev.spec.peak_tflops["bf16"] == 500 and dev.spec.peak_tflops["fp8"] == 1000
    assert dev.mem_bw_Bps == 2e12 and dev.spec.memory_GiB == 80
    assert dev.interconnect_Bps == 300e9
    ms = dev.spec.measured
    assert len(ms.gemm) == 2 * 3 * 3                          # dtype x n x k
    assert {g.dtype for g in ms.gemm} == {"bf16", "fp8"}
    # the sliding-window rows and the bf16-attention-over-fp8-KV rows are not imported
    assert all(t.dtype == "bf16" for t in ms.attention_prefill)
    assert meta["details"]["attention_prefill"]["rows_dropped"]["window_size!=0"] > 0
    # all-reduce: half only (int8 dropped), all_gather ignored; bytes = elements x 2
    nccl = [t for t in ms.transfers if t.impl == "nccl"]
    assert sorted(t.tp for t in nccl) == [2, 4]
    assert nccl[0].bytes == [2.0 * e for e in AR_ELEMS]
    # (this fake package has no MLA or all-to-all tables: tests/test_mla_a2a_tables.py adds them)
    assert meta["fallback_to_roofline"] == ["mla_prefill", "mla_decode", "alltoall",
                                            "kv_transfer (device_copy, h2d, d2h: not in the package)"]
    assert out.stat().st_size < pi.MAX_PROFILE_BYTES


def test_gemm_exact_at_table_points_and_loglinear_between_grid_shapes(imported):
    _, dev = imported
    for m in GEMM_MS:
        r = dev.gemm_lookup(m, 1024, 4096, 2.0)
        assert r.source == "exact" and r.time_s == pytest.approx(gemm_ms(m, 1024, 4096) * 1e-3, rel=REL)
    # between m points, and between (n, k) grid shapes: the power law comes back
    for m, n, k in [(8, 1024, 4096), (100, 3000, 600), (3, 256, 2048)]:
        r = dev.gemm_lookup(m, n, k, 2.0)
        assert r.source == "interpolated"
        assert r.time_s == pytest.approx(gemm_ms(m, n, k) * 1e-3, rel=3 * REL)
    assert dev.gemm_lookup(8, 1024, 4096, 1.0, dtype="fp8").time_s == pytest.approx(gemm_ms(8, 1024, 4096) * 5e-4,
                                                                                     rel=3 * REL)
    # outside the grid in n or in m: the roofline
    assert dev.gemm_lookup(8, 8192, 4096, 2.0).source == "roofline"
    assert dev.gemm_lookup(512, 1024, 4096, 2.0).source == "roofline"


def test_prefill_attention_batches_and_ragged(imported):
    _, dev = imported
    qh, kvh, d = 8, 2, 128

    def lookup(b, s):
        return dev.attention_lookup(0, 0, True, "bf16", (b * s, b * s * s / 2.0, b * s, b, qh, kvh, d))

    r = lookup(2, 512)
    assert r.source == "exact" and r.time_s == pytest.approx(prefill_ms(2, 512) * 1e-3, rel=REL)
    r = lookup(3, 300)                        # between batches 2 and 4 and seq 128 and 512
    assert r.source == "interpolated" and r.time_s == pytest.approx(prefill_ms(3, 300) * 1e-3, rel=3 * REL)
    # batch 4 x 2048 was not measured (ragged): batch 1's row scaled by 4 (linear in prompts)
    r = lookup(4, 2048)
    assert r.source == "extrapolated" and r.time_s == pytest.approx(prefill_ms(4, 2048) * 1e-3, rel=3 * REL)
    assert lookup(1, 4096).source == "roofline"


def test_decode_attention_grid_ragged_cells_scale_by_batch(imported):
    _, dev = imported

    def lookup(b, c):
        return dev.attention_lookup(0, 0, False, "bf16", (b, float(b * (c - 1)), b * c, b, 8, 2, 128))

    r = lookup(4, 512)
    assert r.source == "exact" and r.time_s == pytest.approx(decode_ms(4, 512) * 1e-3, rel=REL)
    r = lookup(2, 1000)
    assert r.source == "interpolated" and r.time_s == pytest.approx(decode_ms(2, 1000) * 1e-3, rel=3 * REL)
    r = lookup(16, 2048)                      # not measured: batch 4 at 2048 scaled by 16/4
    assert r.source == "extrapolated" and r.time_s == pytest.approx(decode_ms(16, 2048) * 1e-3, rel=3 * REL)
    assert lookup(32, 128).source == "roofline"          # beyond the largest batch


def test_allreduce_table_used_when_present_and_changing_it_changes_the_time(imported, tmp_path):
    out, dev = imported
    b = 2.0 * 16384
    nccl = dev.allreduce_lookup(b, 4, "nccl")
    assert nccl.source == "exact" and nccl.impl == "nccl"
    assert nccl.time_s == pytest.approx(ar_ms(16384, 4, "nccl") * 1e-3, rel=REL)
    custom = dev.allreduce_lookup(b, 4, "custom")
    assert custom.time_s == pytest.approx(ar_ms(16384, 4, "custom") * 1e-3, rel=REL)
    best = dev.allreduce_lookup(b, 4)                       # no impl: the faster one at this size
    assert best.impl == "custom" and best.time_s == custom.time_s
    # the custom table stops at 16384 elements: above it, NCCL's table is the only one in range,
    # but custom is extrapolated linearly in bytes, which here is slower than NCCL's sqrt law
    big = 2.0 * 262144
    assert dev.allreduce_lookup(big, 4, "custom").source == "extrapolated"
    assert dev.allreduce_lookup(big, 4).impl == "nccl"
    # between points: log-log, the sqrt law is exact
    mid = dev.allreduce_lookup(2.0 * 4096, 2, "nccl")
    assert mid.source == "interpolated" and mid.time_s == pytest.approx(ar_ms(4096, 2, "nccl") * 1e-3, rel=3 * REL)
    # tp without a table: the datasheet model by hand, the faster of a one-shot all-reduce (read the 7
    # peers' buffers, one launch) and a two-shot (2 (t-1)/t of the message, two launches)
    roof = dev.allreduce_lookup(b, 8)
    e = dev.spec.efficiency
    bw, base = 300e9 * e.allreduce, (e.allreduce_base_us + 7 * e.allreduce_per_peer_us) * 1e-6
    assert roof.source == "roofline"
    assert roof.time_s == pytest.approx(min(base + 7 * b / bw, 2 * base + 2 * 7 / 8 * b / bw))
    # changing the table changes the time (all tables x 3)
    raw = dev.spec.model_dump()
    for t in raw["measured"]["transfers"]:
        t["time_s"] = [3 * v for v in t["time_s"]]
    dev3 = DeviceProfile(ProfileSpec.model_validate(raw))
    assert dev3.allreduce_time(b, 4, "nccl") == pytest.approx(3 * nccl.time_s)
    assert dev3.allreduce_time(b, 4) == pytest.approx(3 * best.time_s)


def test_missing_table_is_named_in_fallback_meta(tmp_path):
    sysdir = write_fake_package(tmp_path, generation=False)
    spec = pi.import_aiconfigurator("tsys", "trtllm", None, sysdir, "test")
    assert "attention_decode" in spec["meta"]["fallback_to_roofline"]
    dev = DeviceProfile(ProfileSpec.model_validate(spec))
    assert dev.attention_lookup(1e9, 1e6, False, "bf16", (4, 2044.0, 2048, 4, 8, 2, 128)).source == "roofline"


def test_version_choice_and_bad_input_one_line(fake, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"available: tsys$"):
        pi.import_aiconfigurator("h100_sxm", "trtllm", None, fake, "test")
    with pytest.raises(ConfigError, match=r"--backend.*available: trtllm"):
        pi.import_aiconfigurator("tsys", "vllm", None, fake, "test")
    with pytest.raises(ConfigError, match=r"--version.*available: 1\.0\.0"):
        pi.import_aiconfigurator("tsys", "trtllm", "9.9", fake, "test")
    out = tmp_path / "x.yaml"
    rc = main(["profile", "import", "aiconfigurator", "--system", "nope", "--backend", "trtllm",
               "--data-dir", str(fake), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "available: tsys" in err and "--system" in err
    assert not out.exists()


def test_package_not_installed_says_how_to_install(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "aiconfigurator_core" else real(name, *a))
    rc = main(["profile", "import", "aiconfigurator", "--system", "h100_sxm", "--backend", "trtllm",
               "--out", str(tmp_path / "x.yaml")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "pip install 'pdsim[aic]'" in err


def test_profile_list_shows_systems_backends_versions_and_presets(fake, capsys):
    assert main(["profile", "list", "--data-dir", str(fake)]) == 0
    out = capsys.readouterr().out
    assert "tsys" in out and "trtllm : 1.0.0" in out and "nccl 2.0" in out
    assert "other" in out and "no measured data" in out
    assert "h200" in out and "datasheet" in out
    for p in PROFILES.glob("*.yaml"):
        assert p.name in out


# --- interpolation properties (hypothesis) --------------------------------------------------------
increasing_xs = st.lists(st.integers(1, 10 ** 6), min_size=2, max_size=8, unique=True).map(sorted)


@settings(max_examples=60, deadline=None)
@given(xs=increasing_xs, steps=st.lists(st.floats(0.0, 3.0), min_size=8, max_size=8),
       t0=st.floats(1e-7, 1e-2), probes=st.lists(st.floats(0, 1), min_size=1, max_size=20))
def test_logcurve_exact_at_points_monotone_between(xs, steps, t0, probes):
    ys = [t0]
    for s in steps[:len(xs) - 1]:
        ys.append(ys[-1] * (1 + s))                   # non-decreasing measured times
    c = LogCurve(tuple(map(float, xs)), tuple(ys))
    assert [c(x) for x in xs] == ys
    grid = sorted(xs[0] + p * (xs[-1] - xs[0]) for p in probes)
    vals = [c(x) for x in grid]
    assert all(v is not None for v in vals)
    assert all(b >= a * (1 - 1e-12) for a, b in zip(vals, vals[1:]))
    assert all(ys[0] * (1 - 1e-12) <= v <= ys[-1] * (1 + 1e-12) for v in vals)


@settings(max_examples=40, deadline=None)
@given(bs=increasing_xs, cs=increasing_xs, t0=st.floats(1e-6, 1e-3),
       gb=st.floats(0.0, 1.5), gc=st.floats(0.0, 1.5), probe=st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)))
def test_loggrid_exact_at_points_monotone_in_each_axis(bs, cs, t0, gb, gc, probe):
    t = tuple(tuple(t0 * (1 + gb) ** i * (1 + gc) ** j for j in range(len(cs))) for i in range(len(bs)))
    g = LogGrid(tuple(map(float, bs)), tuple(map(float, cs)), t)
    for i, b in enumerate(bs):
        for j, c in enumerate(cs):
            r = g.lookup(b, c)
            assert r.how == "exact" and r.time_s == t[i][j]
    b = bs[0] + probe[0] * (bs[-1] - bs[0])
    c1 = cs[0] + probe[1] * (cs[-1] - cs[0])
    c2 = c1 + probe[2] * (cs[-1] - c1)
    assert g(b, c2) >= g(b, c1) * (1 - 1e-12)
    b2 = b + probe[2] * (bs[-1] - b)
    assert g(b2, c1) >= g(b, c1) * (1 - 1e-12)


# --- committed profiles ------------------------------------------------------------------------
COMMITTED = sorted(PROFILES.glob("*-aic.yaml")) + sorted(PROFILES.glob("*-vidur.yaml"))


def test_committed_imported_profiles_exist_and_are_attributed():
    names = {p.name for p in COMMITTED}
    for system in ("h100_sxm", "h200_sxm", "a100_sxm", "b200_sxm"):
        assert any(n.startswith(system) for n in names), names
    for p in COMMITTED:
        assert p.stat().st_size < pi.MAX_PROFILE_BYTES, p
        dev = load_profile_file(p)
        assert dev.is_measured and dev.source.startswith("measured: ")
        assert ("Apache-2.0" in dev.source) or ("MIT" in dev.source)


def test_committed_profile_round_trips_through_estimate(capsys):
    path = next(p for p in COMMITTED if p.name.startswith("h100_sxm"))
    dev = load_profile_file(path)
    # Llama-3.1-8B's qkv at tp 1 is (n, k) = (6144, 4096), a grid shape; M = 1024 is a table point
    g = next(t for t in dev.spec.measured.gemm if (t.n, t.k, t.dtype) == (6144, 4096, "bf16"))
    t_qkv = g.time_s[g.m.index(1024)]
    assert main(["estimate", "--model", "llama-3.1-8b", "--device", str(path), "--prefill", "1024", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["device_source"] == dev.source
    assert res["ops"]["qkv"]["time_s"] == pytest.approx(32 * t_qkv)       # 32 layers, the table value each
    datasheet = get_device("h100-sxm")
    assert main(["estimate", "--model", "llama-3.1-8b", "--device", "h100-sxm", "--prefill", "1024", "--json"]) == 0
    res_ds = json.loads(capsys.readouterr().out)
    assert res_ds["device_source"] == datasheet.source and res_ds["ops"]["qkv"]["time_s"] != res["ops"]["qkv"]["time_s"]


def test_vidur_profile_matches_a_documented_measurement():
    """shared/reference/vidur/measured/README.md: Llama-2-7B, TP1, A100, 1024 tokens, mlp_up_proj 0.877 ms."""
    path = next((p for p in COMMITTED if p.name.startswith("a100") and p.name.endswith("-vidur.yaml")), None)
    if path is None:
        pytest.skip("no committed a100 Vidur profile")
    dev = load_profile_file(path)
    r = dev.gemm_lookup(1024, 2 * 11008, 4096, 2.0)            # gated up: n = 2 x ffn
    assert r.source == "exact" and r.time_s == pytest.approx(0.877e-3, rel=0.01)


@pytest.mark.skipif(not VIDUR.is_dir(), reason="shared Vidur reference data not present")
def test_vidur_import_from_the_reference_folder():
    spec = pi.import_vidur(VIDUR, "h100")
    dev = DeviceProfile(ProfileSpec.model_validate(spec))
    # README: Llama-2-7B TP1 H100 1024 tokens: mlp_up_proj 0.256 ms, mlp_down_proj 0.109 ms
    assert dev.gemm_time(1024, 2 * 11008, 4096, 2.0) == pytest.approx(0.256e-3, rel=0.02)
    assert dev.gemm_time(1024, 4096, 11008, 2.0) == pytest.approx(0.109e-3, rel=0.02)
    assert "MIT" in dev.source
    with pytest.raises(ConfigError, match="available: a100, h100"):
        pi.import_vidur(VIDUR, "b200")


@pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None,
                    reason="aiconfigurator-core not installed (pip install 'pdsim[aic]')")
def test_real_package_imports_one_system():
    spec = pi.import_aiconfigurator("l40s", "trtllm")
    dev = DeviceProfile(ProfileSpec.model_validate(spec))
    assert dev.spec.measured.gemm and dev.spec.measured.attention_decode
    assert "aiconfigurator-core" in dev.source and "l40s" in dev.source
    assert len(pi.dump_profile(spec).encode()) < pi.MAX_PROFILE_BYTES
    # a grid GEMM point comes back exactly
    g = dev.spec.measured.gemm[len(dev.spec.measured.gemm) // 2]
    assert dev.gemm_lookup(g.m[0], g.n, g.k, 2.0, dtype=g.dtype) == (g.time_s[0], "exact", None)


def test_imported_gemms_agree_with_vidurs_independent_measurements():
    """Two public measurements of one SKU, different engines and harnesses: the aiconfigurator
    grid, interpolated to the shapes Vidur measured exactly, lands within 20% in the median."""
    import statistics
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from check_aic_vs_vidur import compare
    for aic, vid in (("a100_sxm-trtllm-aic", "a100-vidur"), ("h100_sxm-trtllm-aic", "h100-vidur")):
        ratios, sources = compare(aic, vid)
        assert len(ratios) > 100 and sources.get("interpolated", 0) > 50
        assert 0.8 < statistics.median(ratios) < 1.2


def test_committed_profile_is_a_scenario_device():
    """An imported profile is a ``device:`` like a calibrated one; its tables set the prefill time."""
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import scenario
    from pdsim.simulation import simulate
    path = PROFILES / "a100_sxm-trtllm-aic.yaml"
    dev = load_profile_file(path)
    topo = {"kind": "colocated", "replicas": 1, "tp": 2, "device": str(path), "cost_model": {"kind": "roofline"}}
    sc = scenario({"m": topo}, rate=0.5, num_requests=3, prompt_tokens=1024, output_tokens=4)
    reqs = simulate(sc)[0].requests
    assert len(reqs) == 3 and all(r.finish_s is not None for r in reqs)
    # lower bound from the raw table alone: 32 layers of the tp-2 qkv GEMM (n 3072, k 4096) at M = 1024
    g = next(t for t in dev.spec.measured.gemm if (t.n, t.k, t.dtype) == (3072, 4096, "bf16"))
    first = min(reqs, key=lambda r: r.arrival_s)
    assert first.first_token_s - first.arrival_s >= 32 * g.time_s[g.m.index(1024)]


# --- MoE tables ------------------------------------------------------------------------------------------
def test_moe_tables_are_balanced_routing_with_gating_and_pdsim_dtype_names(imported):
    _, dev = imported
    ms = dev.spec.measured.moe
    assert {(t.dtype, t.gated) for t in ms} == {("bf16", True), ("fp8", True), ("fp8_tensor", True), ("bf16", False)}
    assert all(t.distribution == "balanced" and t.tokens == MOE_TOKENS for t in ms)
    bf = next(t for t in ms if t.dtype == "bf16" and t.gated)
    assert bf.time_s == pytest.approx([moe_ms(x) * 1e-3 for x in MOE_TOKENS], rel=REL)   # not the 3x power-law rows


def _moe_layer(cm, tokens):
    bd = cm.breakdown(tokens, float(tokens), tokens, 0, tokens)
    return bd, sum(v["time_s"] for k, v in bd.items() if k.startswith("experts") or k == "moe_route") / cm.moe_layers


def test_cost_model_prices_a_moe_layer_from_the_table_exact_between_and_beyond(imported):
    from pdsim.costmodel import RooflineCost
    from pdsim.models import get_model
    _, dev = imported
    m = get_model("qwen3-30b-a3b")
    assert "experts" not in _moe_layer(RooflineCost(m, dev, 1, "bf16"), 64)[0]      # opt-in (moe_tables)
    cm = RooflineCost(m, dev, 1, "bf16", moe_tables=True)
    bd, t64 = _moe_layer(cm, 64)
    assert bd["experts"]["source"] == "exact" and "experts_gate_up" not in bd and "moe_route" not in bd
    assert t64 == pytest.approx(moe_ms(64) * 1e-3, rel=REL)
    bd, t32 = _moe_layer(cm, 32)            # between 16 and 64: log-log, exact for a power law
    assert bd["experts"]["source"] == "interpolated" and t32 == pytest.approx(moe_ms(32) * 1e-3, rel=2 * REL)
    bd, t1k = _moe_layer(cm, 1024)          # beyond 256: scaled by tokens from the last point
    assert bd["experts"]["source"] == "extrapolated"
    assert t1k == pytest.approx(moe_ms(256) * 1e-3 * 1024 / 256, rel=REL)
    # FLOPs and bytes are still the roofline's (MFU/MBU do not change with where the time came from)
    rf = RooflineCost(m, get_device("h100-sxm"), 1, "bf16").breakdown(64, 64.0, 64, 0, 64)
    got = cm.breakdown(64, 64.0, 64, 0, 64)["experts"]
    assert got["flops"] == pytest.approx(rf["experts_gate_up"]["flops"] + rf["experts_down"]["flops"])
    assert got["bytes"] == pytest.approx(sum(rf[k]["bytes"] for k in ("experts_gate_up", "experts_down",
                                                                     "experts_act", "moe_route")))
    # fp8 weights: the block-scaled table (0.5x), not the per-tensor one (0.6x)
    assert _moe_layer(RooflineCost(m, dev, 1, "fp8", moe_tables=True), 64)[1] == pytest.approx(0.5 * moe_ms(64) * 1e-3,
                                                                                            rel=REL)


def test_moe_shapes_the_table_lacks_and_skewed_routing_fall_back_to_the_roofline(imported):
    from pdsim.costmodel import RooflineCost
    from pdsim.models import get_model
    _, dev = imported
    m = get_model("qwen3-30b-a3b")
    for cm in (RooflineCost(m, dev, 2, "bf16", ep=2, moe_tables=True),                   # moe_ep 2: not measured
               RooflineCost(m, dev, 1, "bf16", expert_skew=1.2, moe_tables=True),        # a skew: the roofline what-if
               RooflineCost(get_model("mixtral-8x7b"), dev, 1, "bf16", moe_tables=True)):
        bd = cm.breakdown(64, 64.0, 64, 0, 64)
        assert "experts" not in bd and bd["experts_down"]["source"] == "roofline"


def test_only_balanced_moe_tables_are_used_and_bad_ones_are_refused():
    from pdsim.devices import MeasuredSpec
    row = {"hidden": 8, "inter": 4, "topk": 2, "experts": 4, "tokens": [1, 16], "time_s": [1e-5, 4e-5]}
    tabs = MeasuredTables.from_profile(MeasuredSpec.model_validate(
        {"moe": [row, {**row, "hidden": 16, "distribution": "power_law_1.2"}]}))
    assert list(tabs.moe) == [(8, 4, 2, 4, 1, 1, True, "bf16")]
    key = (8, 4, 2, 4, 1, 1, True, "bf16")
    assert tabs.moe_lookup(4, key) == (pytest.approx(2e-5), "interpolated")     # 1e-5 x 4^0.5
    assert tabs.moe_lookup(0.5, key) == (1e-5, "extrapolated") and tabs.moe_lookup(32, key) == (8e-5, "extrapolated")
    with pytest.raises(ValueError, match="tokens must be strictly increasing"):
        MeasuredSpec.model_validate({"moe": [{**row, "tokens": [16, 1]}]})
