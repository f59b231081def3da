"""Check the datasheet cost model's linear layers against Vidur's measured per-layer GEMM times.

Vidur (MIT; ../shared/reference/vidur) timed attn_pre_proj (QKV), attn_post_proj (O), mlp_up_proj
(gate+up) and mlp_down_proj per layer, fp16, one GPU, over num_tokens.  This prints, per GPU and
model at tp=1, the median and p90 absolute percentage error of pdsim's prediction and a few rows.
Run: .venv/bin/python benchmarks/check_vidur_linear.py
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

ROOT = REPO.parent / "shared" / "reference" / "vidur" / "measured" / "data" / "profiling" / "compute"
CASES = [("a100", "a100-80gb-sxm", "meta-llama/Meta-Llama-3-8B", "llama-3.1-8b"),
         ("a100", "a100-80gb-sxm", "meta-llama/Llama-2-7b-hf", "llama-2-7b"),
         ("h100", "h100-sxm", "meta-llama/Llama-2-7b-hf", "llama-2-7b"),
         ("h100", "h100-sxm", "meta-llama/Llama-2-70b-hf", "llama-2-70b")]
OPS = {"qkv": "attn_pre_proj", "attn_out": "attn_post_proj", "gate_up": "mlp_up_proj", "down": "mlp_down_proj"}

if not ROOT.is_dir():
    sys.exit(f"reference data not found at {ROOT}")
for gpu, dev_name, path, model_name in CASES:
    df = pd.read_csv(ROOT / gpu / path / "mlp.csv")
    df = df[df.num_tensor_parallel_workers == 1].drop_duplicates("num_tokens").sort_values("num_tokens")
    cm = RooflineCost(get_model(model_name), get_device(dev_name), 1, "fp16", "fp16")
    L = cm.model.layers
    measured = sum(df[f"time_stats.{v}.median"].to_numpy() for v in OPS.values()) * 1e-3   # ms -> s per layer
    pred = np.array([sum(cm.breakdown(int(t), 0.0, 0, 0, 1)[k]["time_s"] for k in OPS) / L
                     for t in df.num_tokens])
    ape = np.abs(pred - measured) / measured * 100
    print(f"{dev_name:14s} {model_name:12s} rows {len(df):4d}  linear-layer APE median {np.median(ape):5.1f}%  "
          f"p90 {np.percentile(ape, 90):5.1f}%  (pred/measured at T=1: {pred[0] / measured[0]:.2f}, "
          f"T=max {df.num_tokens.iloc[-1]}: {pred[-1] / measured[-1]:.2f})")
