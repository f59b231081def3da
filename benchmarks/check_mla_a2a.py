"""Measured MLA attention and DeepEP all-to-all tables of an imported profile: how well the lookups
interpolate, and how far the roofline is from them.  Nothing here is fitted.

(a) Interpolation, held out: every odd interior point of every curve is predicted from the curve
    without those points by pdsim's own lookup code (MeasuredTables built from the thinned tables):
    MLA prefill curves over prompt length (per heads, KV dtype, batch), MLA decode grids along context
    (whole odd interior context columns removed) and along batch (odd interior batch rows removed), and
    all-to-all curves over tokens.  Median / p90 absolute percentage error and the number of points.
(b) DeepSeek-V3 shapes: one layer's MLA attention and one all-to-all kernel by the cost model with the
    tables (what they say) and without (the profile's roofline, and the datasheet preset's).

    .venv/bin/python benchmarks/check_mla_a2a.py [calibration/profiles/h200_sxm-trtllm-aic.yaml ...]
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pdsim.costmodel import RooflineCost  # noqa: E402
from pdsim.devices import ProfileSpec, get_device, load_profile_file  # noqa: E402
from pdsim.models import get_model  # noqa: E402
from pdsim.profile_tables import MeasuredTables, mla_keys  # noqa: E402

PRESET = {"a100_sxm": "a100-80gb-sxm", "h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}


def _ape(pred, meas) -> float:
    return abs(pred / meas - 1.0) * 100.0


def _summary(name: str, errs: list[float]) -> None:
    e = np.asarray(errs)
    if len(e) == 0:
        print(f"  {name:44s} no interior points")
        return
    print(f"  {name:44s} median APE {np.median(e):5.1f}%  p90 {np.percentile(e, 90):5.1f}%  max {e.max():6.1f}%"
          f"  ({len(e)} points)")


def _odd_interior(n: int) -> list[int]:
    return [i for i in range(1, n - 1) if i % 2 == 1]


def holdout(spec: ProfileSpec) -> None:
    meas = spec.measured
    print("(a) held out: every odd interior point predicted by the lookup from the rest")
    # MLA prefill: each (heads, dtype, batch) curve over seq_len
    errs = []
    for t in meas.mla_prefill:
        drop = set(_odd_interior(len(t.seq_len)))
        if not drop:
            continue
        thin = copy.deepcopy(t)
        thin.seq_len = [x for i, x in enumerate(t.seq_len) if i not in drop]
        thin.time_s = [x for i, x in enumerate(t.time_s) if i not in drop]
        tabs = MeasuredTables.from_profile(_only(meas, mla_prefill=[thin]))
        key = mla_keys(t.heads, t.kv_lora_rank, t.qk_rope_head_dim, t.qk_nope_head_dim, t.v_head_dim, t.dtype)[0]
        for i in drop:
            s = t.seq_len[i]
            r = tabs.attention_lookup(True, (t.batch * s, t.batch * s * s / 2.0, t.batch * s, t.batch, *key[:3]),
                                      key[3])
            errs.append(_ape(r.time_s, t.time_s[i]))
    _summary("MLA prefill, over prompt length", errs)
    # MLA decode grids: along context (odd interior columns out), along batch (odd interior rows out)
    for axis in ("context", "batch"):
        errs = []
        for t in meas.mla_decode:
            xs = getattr(t, axis)
            drop = set(_odd_interior(len(xs)))
            thin = copy.deepcopy(t)
            if axis == "context":
                thin.context = [c for j, c in enumerate(t.context) if j not in drop]
                thin.time_s = [[v for j, v in enumerate(row) if j not in drop] for row in t.time_s]
            else:
                thin.batch = [b for i, b in enumerate(t.batch) if i not in drop]
                thin.time_s = [row for i, row in enumerate(t.time_s) if i not in drop]
            if all(v is None for row in thin.time_s for v in row):
                continue
            tabs = MeasuredTables.from_profile(_only(meas, mla_decode=[thin]))
            key = mla_keys(t.heads, t.kv_lora_rank, t.qk_rope_head_dim, t.qk_nope_head_dim, t.v_head_dim,
                           t.dtype)[1]
            for i, b in enumerate(t.batch):
                for j, c in enumerate(t.context):
                    held = (j if axis == "context" else i) in drop
                    if not held or t.time_s[i][j] is None:
                        continue
                    r = tabs.attention_lookup(False, (b, b * c, b * c, b, *key[:3]), key[3])
                    if r is not None and r.how == "interpolated":
                        errs.append(_ape(r.time_s, t.time_s[i][j]))
        _summary(f"MLA decode, along {axis}", errs)
    errs = []
    by_be: dict = {}
    for t in meas.alltoall:
        drop = set(_odd_interior(len(t.tokens)))
        xs = [x for i, x in enumerate(t.tokens) if i not in drop]
        ys = [y for i, y in enumerate(t.time_s) if i not in drop]
        thin = copy.deepcopy(t)
        thin.tokens, thin.time_s = xs, ys
        tabs = MeasuredTables.from_profile(_only(meas, alltoall=[thin]))
        key = (t.backend, t.phase, t.dtype, t.ep, t.hidden, t.topk, t.experts)
        for i in drop:
            r = tabs.alltoall_lookup(t.tokens[i], key)
            e = _ape(r.time_s, t.time_s[i])
            errs.append(e)
            by_be.setdefault(t.backend, []).append(e)
    _summary("all-to-all, over tokens (all)", errs)
    for be, e in sorted(by_be.items()):
        _summary(f"all-to-all, over tokens ({be})", e)


def _only(meas, **tables):
    """A measured section with only the given tables (fast to build)."""
    m = meas.model_copy()
    for name in ("gemm", "attention_prefill", "attention_decode", "transfers", "moe", "mla_prefill", "mla_decode",
                 "alltoall"):
        setattr(m, name, tables.get(name, []))
    return m


def shapes(path: Path) -> None:
    dev = load_profile_file(path)
    system = path.name.split("-")[0]
    preset = get_device(PRESET[system]) if system in PRESET else None
    ds = get_model("deepseek-v3")
    print(f"(b) DeepSeek-V3 fp8 weights on {path.name}: per layer (attention) / per kernel (all-to-all), us")
    for kvd in ("bf16", "fp8"):
        for tp, dpa in ((8, False), (8, True)):
            kw = dict(ep=8, dp_attention=dpa)
            tab = RooflineCost(ds, dev, tp, "fp8", kvd, mla_tables=True, a2a_tables=True, **kw)
            # the tables are on by default (MLA): the roofline columns turn them off
            roof = RooflineCost(ds, dev, tp, "fp8", kvd, mla_tables=False, **kw)
            pre = RooflineCost(ds, preset, tp, "fp8", kvd, mla_tables=False, **kw) if preset else None
            heads = tab.q_heads
            print(f"  kv {kvd}, {'DP attention' if dpa else 'TP8'} ({heads} heads per GPU): "
                  "table (source) | profile roofline | preset roofline")
            for b, c in ((1, 1024), (8, 4096), (64, 4096), (256, 4096), (64, 16384)):
                args = (b, float(b * c), b * (c + 1), b, False)
                row = [tab.op_time(tab._attention_op(*args)), roof.op_time(roof._attention_op(*args))]
                if pre:
                    row.append(pre.op_time(pre._attention_op(*args)))
                print(f"    decode b{b:<4d} ctx {c:<6d} {_fmt(row)}")
            for s in (1024, 4096, 16384):
                args = (s, s * s / 2.0, s, 1, True)
                row = [tab.op_time(tab._attention_op(*args)), roof.op_time(roof._attention_op(*args))]
                if pre:
                    row.append(pre.op_time(pre._attention_op(*args)))
                print(f"    prefill {s:<6d} tokens  {_fmt(row)}")
    # the all-to-all exists only under DP attention (under TP attention every GPU holds every token)
    tab = RooflineCost(ds, dev, 8, "fp8", "fp8", ep=8, dp_attention=True, a2a_tables=True)
    roof = RooflineCost(ds, dev, 8, "fp8", "fp8", ep=8, dp_attention=True)
    print("  all-to-all kernel (mean of dispatch and combine), ep 8 DP attention, by tokens on a GPU: "
          "table (source) | roofline")
    for tokens in (1, 8, 64, 256, 1024, 4096, 16384):
        ops = [o for o in tab._static_ops(tokens, tokens) if o.kind == "alltoall"]
        ops_r = [o for o in roof._static_ops(tokens, tokens) if o.kind == "alltoall"]
        print(f"    {tokens:<6d} {_fmt([tab.op_time(ops[0]), roof.op_time(ops_r[0])])}")


def _fmt(row) -> str:
    from pdsim.kernels import source_name
    t0, c0 = row[0]
    out = f"{float(t0) * 1e6:9.1f} ({source_name(c0)[:6]:6s})"
    for t, _ in row[1:]:
        out += f" | {float(t) * 1e6:9.1f}"
    return out


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or [Path("calibration/profiles/h200_sxm-trtllm-aic.yaml")]
    for p in paths:
        print(f"== {p}")
        holdout(load_profile_file(p).spec)
        shapes(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
