"""Check the datasheet cost model's attention and engine overhead against Vidur's measurements.

Attention: ../shared/reference/vidur/measured/data/profiling/a100/attention.csv (A100, FlashAttention
over a paged KV cache, hidden 8192, 64 q / 8 kv heads at TP2 = Llama-2-70B's shape, per layer, ms).
Prefill rows: one sequence, ``prefill_chunk_size`` new tokens after ``kv_cache_size`` cached ones;
decode rows: ``batch_size`` sequences with ``kv_cache_size`` cached tokens each.
Engine overhead: cpu_overheads.csv (schedule + prepare inputs + sampler + output processing, median
ms per step) against the profile's ``step_overhead_us``.
Prints median and p90 absolute percentage error of pdsim's per-layer prediction, by phase and range.
Run: .venv/bin/python benchmarks/check_vidur_attention.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from pdsim.costmodel import RooflineCost  # noqa: E402
from pdsim.devices import get_device  # noqa: E402
from pdsim.models import get_model  # noqa: E402

ROOT = REPO.parent / "shared" / "reference" / "vidur" / "measured" / "data" / "profiling" / "a100"
if not ROOT.is_dir():
    sys.exit(f"reference data not found at {ROOT}")

dev = get_device("a100-80gb-sxm")
cm = RooflineCost(get_model("llama-2-70b"), dev, tp=2, weight_dtype="fp16", kv_dtype="fp16")
L = cm.model.layers
att = pd.read_csv(ROOT / "attention.csv")


def per_layer(tokens, work, kv, batch, prefill):
    return float(cm.op_time(cm._attention_op(tokens, work, kv, batch, prefill))[0]) * 1e3   # ms, one layer


def ape_table(rows, label):
    e = np.abs(np.array([p for p, _ in rows]) / np.array([m for _, m in rows]) - 1) * 100
    print(f"  {label:44s} n={len(e):5d}  median APE {np.median(e):6.1f}%  p90 {np.percentile(e, 90):6.1f}%")
    return e


print(f"{dev.name} ({dev.source[:60]}...), Llama-2-70B shape at TP2, per-layer attention")
pre = att[att.is_prefill == True]  # noqa: E712
dec = att[att.is_prefill == False]  # noqa: E712
rows_p = []
for c, k, t in zip(pre.prefill_chunk_size, pre.kv_cache_size, pre["time_stats.attn_prefill.median"]):
    rows_p.append((per_layer(int(c), c * (k + c / 2.0), int(k + c), 1, True), t, c, k))
rows_d = []
for b, k, t in zip(dec.batch_size, dec.kv_cache_size, dec["time_stats.attn_decode.median"]):
    rows_d.append((per_layer(int(b), float(b * k), int(b * (k + 1)), int(b), False), t, b, k))
ape_table([(p, m) for p, m, *_ in rows_p], "prefill, all")
ape_table([(p, m) for p, m, c, _ in rows_p if c >= 512], "prefill, chunk >= 512")
ape_table([(p, m) for p, m, *_ in rows_d], "decode, all")
ape_table([(p, m) for p, m, b, k in rows_d if b * k >= 32 * 1024], "decode, batch x context >= 32k tokens")
ape_table([(p, m) for p, m, b, k in rows_d if b * k < 32 * 1024], "decode, batch x context < 32k tokens")
print("  examples (pdsim ms vs Vidur ms):")
for p, m, c, k in rows_p[::900][:5]:
    print(f"    prefill chunk {int(c):5d} after {int(k):5d}: {p:7.3f} vs {m:7.3f}")
for p, m, b, k in rows_d[::2000][:5]:
    print(f"    decode batch {int(b):4d} x ctx {int(k):5d}: {p:7.3f} vs {m:7.3f}")

cpu = pd.read_csv(ROOT / "cpu_overheads.csv")
parts = ["schedule_median", "prepare_inputs_e2e_median", "sampler_e2e_median", "process_model_outputs_median"]
cpu["step_ms"] = cpu[parts].sum(axis=1)
print(f"\nengine overhead per step: profile step_overhead_us = {dev.spec.efficiency.step_overhead_us:.0f} us; "
      f"Vidur A100 median {cpu.step_ms.median() * 1e3:.0f} us "
      f"(range {cpu.step_ms.min() * 1e3:.0f}-{cpu.step_ms.max() * 1e3:.0f} us over models, batch 1-128, tp 1-8)")

# What prefill-attention efficiency would fit?  Fit on even rows, report on odd rows (held out).
from dataclasses import replace  # noqa: E402

from pdsim.devices import DeviceProfile  # noqa: E402

pre_rows = [(int(c), float(k), t) for c, k, t in zip(pre.prefill_chunk_size, pre.kv_cache_size,
                                                     pre["time_stats.attn_prefill.median"])]


def errors(eff, rows):
    spec = dev.spec.model_copy(deep=True)
    spec.efficiency.attention_prefill = eff
    m = replace(cm, device=DeviceProfile(spec))
    m.__post_init__()
    pred = np.array([float(m.op_time(m._attention_op(c, c * (k + c / 2.0), int(k + c), 1, True))[0]) * 1e3
                     for c, k, _ in rows])
    return np.log(pred / np.array([t for *_, t in rows]))


grid = np.linspace(0.05, 0.8, 76)
train, test = pre_rows[0::2], pre_rows[1::2]
best = min(grid, key=lambda e: np.median(np.abs(errors(e, train))))
e_test = np.abs(np.exp(errors(best, test)) - 1) * 100
print(f"\nprefill attention efficiency fitted on half the rows: {best:.2f} of peak "
      f"(profile has {dev.spec.efficiency.attention_prefill}); held-out median APE {np.median(e_test):.1f}%, "
      f"p90 {np.percentile(e_test, 90):.1f}%")
