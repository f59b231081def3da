"""Measured MLA attention and DeepEP all-to-all tables: import (pdsim.profile_import), lookups
(pdsim.profile_tables, pdsim.kernels) and the cost model's use of them (``mla_tables``, ``a2a_tables``).

No package needed: the fake ``systems`` folder of test_profile_import plus small CSVs shaped like
aiconfigurator-core's ``context_mla_perf``, ``generation_mla_perf`` (ms per layer; ``num_heads`` per GPU)
and ``moe_a2a_perf`` (us per call).  Latencies are closed forms that are NOT power laws, so a lookup
that picks the wrong cell or the wrong axis misses the hand-computed interpolation.
"""
from __future__ import annotations

import io
import json
import math
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_profile_import import _csv, write_fake_package  # noqa: E402

from pdsim.__main__ import main  # noqa: E402
from pdsim.costmodel import RooflineCost  # noqa: E402
from pdsim.devices import get_device, load_profile_file  # noqa: E402
from pdsim.models import get_model  # noqa: E402

REL = 1e-3          # the importer keeps 4 significant digits

MLA_HEADS = (16, 128)                     # DeepSeek-V3 at tp 8 and under DP attention (or tp 1)
CTX_B, CTX_S = (1, 4), (128, 512, 2048)
GEN_B, GEN_STEP = (1, 4, 16), (127, 511, 2047)          # context = isl (1) + step
LL_T, HT_T = (1, 16, 64, 256), (16, 256, 4096)


def ctx_ms(h, b, s, kv):
    return (0.01 + 1e-7 * h * b * s * s ** 0.5) * (0.9 if kv == "fp8" else 1.0)


def gen_ms(h, b, c, kv):
    return (0.012 + 3e-8 * h * b * c + 1e-6 * b) * (0.6 if kv == "fp8" else 1.0)


def a2a_us(backend, phase, dtype, t):
    base = 60.0 if backend == "ll" else 40.0
    return (base + (0.2 if phase == "combine" else 0.1) * t + 3.0 * math.sqrt(t)) * (0.8 if dtype == "fp8" else 1.0)


def write_mla_a2a(sysdir: Path, version: str = "1.0.0") -> None:
    d = sysdir / "data" / "tsys"
    common = {"framework": "TRTLLM", "version": version, "device": "Fake GPU", "kernel_source": "default"}
    rows = [{**common, "op_name": "mla_context", "mla_dtype": md, "kv_cache_dtype": kv, "num_heads": h,
             "batch_size": b, "isl": s, "tp_size": 128 // h, "step": 0, "latency": ctx_ms(h, b, s, kv) * f}
            for h in MLA_HEADS for kv in ("bfloat16", "fp8") for b in CTX_B for s in CTX_S
            for md, f in (("bfloat16", 1.0), ("fp8", 0.1))          # fp8 MLA compute: not measured, not imported
            if b * s <= 4096]                                        # ragged: 4 x 2048 missing
    _csv(d / "mla" / "trtllm" / version / "context_mla_perf.csv", rows)
    rows = [{**common, "op_name": "mla_generation", "mla_dtype": "bfloat16", "kv_cache_dtype": kv, "num_heads": h,
             "batch_size": b, "isl": 1, "tp_size": 128 // h, "step": st, "latency": gen_ms(h, b, st + 1, kv)}
            for h in MLA_HEADS for kv in ("bfloat16", "fp8") for b in GEN_B for st in GEN_STEP
            if b * (st + 1) <= 8192]                                  # ragged: 16 x 2048 missing
    _csv(d / "mla" / "trtllm" / version / "generation_mla_perf.csv", rows)
    shape = {"ep_size": 8, "hidden_size": 7168, "topk": 8, "num_experts": 256, "sms": 0, "notify_us": 0.0}
    rows = []
    for be, dtypes, toks in (("trtllm_deepep_ll", ("bfloat16", "fp8"), LL_T), ("trtllm_deepep_ht", ("bfloat16",), HT_T)):
        short = be.rsplit("_", 1)[1]
        for dt in dtypes:
            for ph in ("dispatch", "combine"):
                for nodes in (1, 2):          # two nodes: not the cost model's one NVLink domain, dropped
                    rows += [{**common, **shape, "op_name": "moe_a2a", "kernel_source": "deepep", "comm_backend": be,
                              "phase": ph, "comm_dtype": dt, "node_num": nodes, "num_tokens": t,
                              "transmit_us": a2a_us(short, ph, dt, t) * nodes, "latency": a2a_us(short, ph, dt, t) * nodes}
                             for t in toks]
    _csv(d / "comm" / "trtllm" / version / "moe_a2a_perf.csv", rows)


@pytest.fixture(scope="module")
def prof(tmp_path_factory):
    sysdir = write_fake_package(tmp_path_factory.mktemp("aicmla"))
    write_mla_a2a(sysdir)
    out = tmp_path_factory.mktemp("prof") / "tsys.yaml"
    assert main(["profile", "import", "aiconfigurator", "--system", "tsys", "--backend", "trtllm",
                 "--data-dir", str(sysdir), "--out", str(out)]) == 0
    return out, load_profile_file(out)


DS = get_model("deepseek-v3")


# --- import ------------------------------------------------------------------------------------------
def test_import_keeps_mla_grids_per_gpu_heads_and_a2a_curves_in_seconds(prof):
    _, dev = prof
    meas, meta = dev.spec.measured, dev.spec.model_dump()["meta"]
    pre = {(t.heads, t.dtype, t.batch): t for t in meas.mla_prefill}
    assert set(pre) == {(h, kv, b) for h in MLA_HEADS for kv in ("bf16", "fp8") for b in CTX_B}
    t = pre[(16, "fp8", 4)]
    assert t.seq_len == [128, 512] and (t.kv_lora_rank, t.qk_rope_head_dim, t.qk_nope_head_dim) == (512, 64, 128)
    assert t.time_s == pytest.approx([ctx_ms(16, 4, s, "fp8") * 1e-3 for s in (128, 512)], rel=REL)   # not the fp8-MLA rows
    assert meta["details"]["mla_prefill"]["rows_dropped"] == {"mla_dtype not in ('bfloat16',)": 20}
    dec = {(t.heads, t.dtype): t for t in meas.mla_decode}
    g = dec[(128, "bf16")]
    assert g.batch == list(GEN_B) and g.context == [128, 512, 2048]          # isl + step
    assert g.time_s[2][2] is None                                            # ragged cell stays missing
    assert g.time_s[1][0] == pytest.approx(gen_ms(128, 4, 128, "bfloat16") * 1e-3, rel=REL)
    a2a = {(t.backend, t.phase, t.dtype): t for t in meas.alltoall}
    assert set(a2a) == {("ll", p, d) for p in ("dispatch", "combine") for d in ("bf16", "fp8")} | \
        {("ht", "dispatch", "bf16"), ("ht", "combine", "bf16")}
    x = a2a[("ll", "combine", "fp8")]
    assert (x.ep, x.hidden, x.topk, x.experts, x.tokens) == (8, 7168, 8, 256, list(LL_T))
    assert x.time_s == pytest.approx([a2a_us("ll", "combine", "fp8", t) * 1e-6 for t in LL_T], rel=REL)   # us -> s
    assert meta["details"]["alltoall"]["rows_dropped"] == {"node_num!=1": 22}
    assert "mla_prefill" in meta["imported_from"]["tables"] and "alltoall" in meta["imported_from"]["tables"]


# --- MLA in the cost model ---------------------------------------------------------------------------
def _attn(cm, b, c, prefill=False):
    args = (b, float(b * c), b * (c + 1), b, False) if not prefill else (c, c * c / 2.0, c, 1, True)
    return cm.op_time(cm._attention_op(*args))


def _lerp_log(x, x0, x1, y0, y1):
    w = math.log(x / x0) / math.log(x1 / x0)
    return math.exp(math.log(y0) * (1 - w) + math.log(y1) * w)


def test_mla_decode_is_the_tables_bilinear_log_interpolation_by_hand(prof):
    _, dev = prof
    cm = RooflineCost(DS, dev, 8, "fp8", "fp8", mla_tables=True)          # 128 / 8 = 16 heads per GPU
    b, c = 2, 255                      # batch between 1 and 4; decode context c + 1 = 256 between 128 and 512
    t, code = _attn(cm, b, c)
    corner = {(bb, cc): round(gen_ms(16, bb, cc, "fp8"), 10) * 1e-3 for bb in (1, 4) for cc in (128, 512)}
    hand = _lerp_log(b, 1, 4, _lerp_log(256, 128, 512, corner[1, 128], corner[1, 512]),
                     _lerp_log(256, 128, 512, corner[4, 128], corner[4, 512]))
    assert t == pytest.approx(hand, rel=2 * REL) and code == 1            # interpolated
    assert _attn(cm, 4, 511) == (pytest.approx(gen_ms(16, 4, 512, "fp8") * 1e-3, rel=REL), 0)     # exact: a grid point
    # k decode steps (the simulator's fast path) agree with one step at a time
    steps = cm.decode_steps(b, float(b * c), b * (c + 1), 5)[0]
    one = [cm.step(b, float(b * (c + i)), b * (c + 1 + i), b, b).time_s for i in range(5)]
    assert steps == pytest.approx(one, rel=1e-12)


def test_mla_prefill_from_the_table_and_kv_dtype_picks_the_table(prof):
    _, dev = prof
    bf = RooflineCost(DS, dev, 1, "fp8", "bf16", mla_tables=True)          # 128 heads on one GPU
    t, code = _attn(bf, 1, 512, prefill=True)
    assert (t, code) == (pytest.approx(ctx_ms(128, 1, 512, "bf16") * 1e-3, rel=REL), 0)
    t, code = _attn(bf, 1, 1024, prefill=True)
    assert code == 1 and t == pytest.approx(_lerp_log(1024, 512, 2048, ctx_ms(128, 1, 512, "bf16") * 1e-3,
                                                      ctx_ms(128, 1, 2048, "bf16") * 1e-3), rel=2 * REL)
    fp8 = RooflineCost(DS, dev, 1, "fp8", "fp8", mla_tables=True)
    assert _attn(fp8, 1, 512, prefill=True)[0] == pytest.approx(ctx_ms(128, 1, 512, "fp8") * 1e-3, rel=REL)


def test_mla_shapes_without_a_table_and_the_default_are_the_roofline(prof):
    _, dev = prof
    roof = RooflineCost(DS, dev, 4, "fp8", "fp8", mla_tables=False)        # 32 heads per GPU: not in the tables
    cm = RooflineCost(DS, dev, 4, "fp8", "fp8")                            # mla_tables: on by default
    for prefill in (False, True):
        assert _attn(cm, 8, 1000, prefill) == _attn(roof, 8, 1000, prefill)
        assert _attn(cm, 8, 1000, prefill)[1] == 3                          # roofline
    assert cm.table_notes and "32 heads per GPU" in cm.table_notes[0]
    off = RooflineCost(DS, dev, 8, "fp8", "fp8", mla_tables=False)         # a table exists but the flag is off
    assert _attn(off, 2, 255)[1] == 3 and not off.table_notes
    assert _attn(RooflineCost(DS, dev, 8, "fp8", "fp8"), 2, 255)[1] == 1    # the default: the table
    # outside the grid (batch above 16): the MLA roofline anchored at the table's edge, not GQA's
    cm8 = RooflineCost(DS, dev, 8, "fp8", "fp8", mla_tables=True)
    roof8 = RooflineCost(DS, dev, 8, "fp8", "fp8", mla_tables=False)
    t, code = _attn(cm8, 64, 511)
    edge = gen_ms(16, 16, 512, "fp8") * 1e-3
    assert code == 2 and t == pytest.approx(edge * _attn(roof8, 64, 511)[0] / _attn(roof8, 16, 511)[0], rel=REL)


# --- all-to-all --------------------------------------------------------------------------------------
def _a2a(cm, tokens):
    op = next(o for o in cm._static_ops(tokens, tokens) if o.kind == "alltoall")
    return cm.op_time(op)


def test_alltoall_is_the_mean_of_dispatch_and_combine_low_latency_then_high_throughput(prof):
    _, dev = prof
    fp8 = RooflineCost(DS, dev, 8, "fp8", "fp8", ep=8, a2a_tables=True, dp_attention=True)
    # 64 tokens on a GPU: DeepEP low-latency (measured up to 256 tokens), fp8 on the wire for fp8 weights
    t, code = _a2a(fp8, 64)
    assert code == 0 and t == pytest.approx(0.5e-6 * (a2a_us("ll", "dispatch", "fp8", 64)
                                                      + a2a_us("ll", "combine", "fp8", 64)), rel=REL)
    bf = RooflineCost(DS, dev, 8, "bf16", "bf16", ep=8, a2a_tables=True, dp_attention=True)
    assert _a2a(bf, 64)[0] == pytest.approx(0.5e-6 * (a2a_us("ll", "dispatch", "bf16", 64)
                                                      + a2a_us("ll", "combine", "bf16", 64)), rel=REL)
    # between 16 and 64: log-log in each phase, then the mean
    t, code = _a2a(fp8, 32)
    hand = 0.5e-6 * sum(_lerp_log(32, 16, 64, a2a_us("ll", p, "fp8", 16), a2a_us("ll", p, "fp8", 64))
                        for p in ("dispatch", "combine"))
    assert code == 1 and t == pytest.approx(hand, rel=2 * REL)
    # 1024 tokens: beyond the low-latency table, the high-throughput one (bf16 on the wire), interpolated
    t, code = _a2a(fp8, 1024)
    hand = 0.5e-6 * sum(_lerp_log(1024, 256, 4096, a2a_us("ht", p, "bf16", 256), a2a_us("ht", p, "bf16", 4096))
                        for p in ("dispatch", "combine"))
    assert code == 1 and t == pytest.approx(hand, rel=2 * REL)
    t, code = _a2a(fp8, 8192)          # beyond it: scaled by tokens
    assert code == 2 and t == pytest.approx(0.5e-6 * sum(a2a_us("ht", p, "bf16", 4096) for p in ("dispatch", "combine"))
                                            * 2, rel=REL)


def test_alltoall_without_a_matching_table_is_the_roofline(prof):
    _, dev = prof
    q = get_model("qwen3-235b-a22b")                  # hidden 4096, 128 experts: not measured
    dp = {"ep": 8, "dp_attention": True}
    for cm, roof in ((RooflineCost(q, dev, 8, "fp8", "fp8", a2a_tables=True, **dp), RooflineCost(q, dev, 8, "fp8", "fp8", **dp)),
                     (RooflineCost(DS, dev, 8, "fp8", "fp8", **dp), RooflineCost(DS, dev, 8, "fp8", "fp8", **dp))):
        assert _a2a(cm, 64) == _a2a(roof, 64) and _a2a(cm, 64)[1] == 3
    assert "alltoall: roofline" in RooflineCost(q, dev, 8, "fp8", "fp8", a2a_tables=True, **dp).table_notes[0]
    # a datasheet preset has no tables at all
    cm = RooflineCost(DS, get_device("h200"), 8, "fp8", "fp8", a2a_tables=True, mla_tables=True, **dp)
    assert _a2a(cm, 64)[1] == 3 and _attn(cm, 2, 255)[1] == 3


def test_tp_attention_has_no_alltoall_to_price_even_with_the_tables_on(prof):
    # under TP attention every GPU holds every token: expert parallelism dispatches nothing, so the DeepEP
    # tables price nothing and no note blames a missing one
    _, dev = prof
    cm = RooflineCost(DS, dev, 8, "fp8", "fp8", ep=8, a2a_tables=True)
    assert not any(o.kind == "alltoall" for o in cm._static_ops(64, 64))
    assert cm.a2a_keys is None and not any(n.startswith("alltoall") for n in cm.table_notes)


# --- pdsim estimate ----------------------------------------------------------------------------------
def _estimate(*args) -> dict:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["estimate", "--model", "deepseek-v3", "--tp", "8", "--weight-dtype", "fp8", "--kv-dtype", "fp8",
                     "--json", *args]) == 0
    return json.loads(buf.getvalue())


def test_estimate_names_the_tables_source_and_says_when_they_do_not_serve(prof):
    path, _ = prof
    # DP attention over 8 ranks, decode batch 128: 16 requests (16 tokens) on the busiest rank, a measured
    # all-to-all point; 128 heads per GPU at batch 16 and context 256, between two measured contexts
    res = _estimate("--device", str(path), "--ep", "8", "--dp-attention", "--decode-batch", "128", "--context", "255",
                    "--mla-tables", "--a2a-tables")
    assert res["ops"]["attention"]["source"] == "interpolated" and res["ops"]["alltoall"]["source"] == "exact"
    assert res["table_notes"] == []
    res = _estimate("--device", str(path), "--ep", "8", "--dp-attention", "--decode-batch", "16", "--context", "255")
    assert res["ops"]["attention"]["source"] == "interpolated" and res["ops"]["alltoall"]["source"] == "roofline"
    res = _estimate("--device", str(path), "--ep", "8", "--decode-batch", "2", "--context", "255")   # TP attention
    assert res["ops"]["attention"]["source"] == "interpolated" and "alltoall" not in res["ops"]
    res = _estimate("--device", str(path), "--ep", "8", "--decode-batch", "2", "--context", "255", "--no-mla-tables")
    assert res["ops"]["attention"]["source"] == "roofline"
    # tp 4: 32 heads per GPU, not in the tables: the roofline, and a note says why (no all-to-all under TP attention)
    res = _estimate("--device", str(path), "--tp", "4", "--ep", "4", "--decode-batch", "2", "--a2a-tables")
    assert res["ops"]["attention"]["source"] == "roofline" and "alltoall" not in res["ops"]
    assert any(n.startswith("MLA prefill and decode attention: roofline") for n in res["table_notes"])
    # ep 4 under DP attention: no DeepEP table for ep 4, and a note says so
    res = _estimate("--device", str(path), "--tp", "4", "--ep", "4", "--dp-attention", "--decode-batch", "2",
                    "--a2a-tables")
    assert res["ops"]["alltoall"]["source"] == "roofline"
    assert any(n.startswith("alltoall: roofline") for n in res["table_notes"])
    buf = io.StringIO()                     # the table output says it too
    with redirect_stdout(buf):
        main(["estimate", "--model", "deepseek-v3", "--tp", "4", "--device", str(path), "--decode-batch", "2"])
    assert "note: MLA prefill and decode attention: roofline (no measured table for 32 heads per GPU" in buf.getvalue()
    # a datasheet preset has no tables at all: asking for them says so, once; not asking says nothing
    res = _estimate("--device", "h200", "--ep", "8", "--decode-batch", "2", "--moe-tables", "--a2a-tables")
    assert res["table_notes"] == ["moe/a2a tables asked for, but h200 is a profile without measured tables (a "
                                  "datasheet preset): every op is the roofline"]
    assert _estimate("--device", "h200", "--ep", "8", "--decode-batch", "2")["table_notes"] == []
    # a datasheet preset: every op is the roofline and says so in its source; an opt-in flag gets the one note
    res = _estimate("--device", "h200", "--ep", "8", "--decode-batch", "2", "--a2a-tables")
    assert res["ops"]["attention"]["source"] == "roofline" and res["table_notes"] == [
        "a2a tables asked for, but h200 is a profile without measured tables (a datasheet preset): every op is the "
        "roofline"]


def test_a_scenarios_pool_gets_the_tables_defaults_and_its_own_choice(prof):
    from pdsim import config
    from pdsim.topology import make_cost
    path, _ = prof

    def pool_cost(cm_keys):
        sc = config.parse({"seed": 0, "model": "deepseek-v3", "weight_dtype": "fp8", "kv_dtype": "fp8",
                           "workload": {"arrival": "poisson", "rate": 1.0, "num_requests": 2, "prompt_tokens": 10,
                                        "output_tokens": 2},
                           "topologies": {"t": {"kind": "colocated", "replicas": 1, "tp": 8, "ep": 8, "device": str(path),
                                                "dp_attention": True, "cost_model": {"kind": "roofline", **cm_keys}}}}, "t.yaml")
        return make_cost(sc.topologies["t"], DS, "fp8", "fp8", None, "topologies.t")
    cm = pool_cost({})                                       # defaults: MLA table on, all-to-all table off
    assert _attn(cm, 2, 255)[1] == 1 and _a2a(cm, 16)[1] == 3
    cm = pool_cost({"mla_tables": False, "a2a_tables": True})
    assert _attn(cm, 2, 255)[1] == 3 and _a2a(cm, 16)[1] == 0
