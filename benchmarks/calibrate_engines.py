"""Engine calibration on the public silicon runs: `pdsim calibrate --from-benchmark`'s fit, with whole
models held out (issue #13: "fit on some models, report the others").

Rows: the dense aggregated rows of aiconfigurator-core's silicon sample that pdsim expresses (Llama-3.1-8B/70B,
Qwen3-32B on H100/H200; the installed package's systems/silicon_sample.csv).  Split: by model name (CRC32
hash, ``--holdout``), so no row of a held-out model is seen by the fit.  A seeded sample of ``--per-engine``
fit rows and as many held-out rows per engine keeps the run in minutes (each fit pass simulates every fit
row; a fit takes ~20 passes).  Prints, per engine, the fitted step overhead and TTFT/TPOT MAPE of the preset
and of the fit on the fit rows and on the held-out models' rows.

Run: nice .venv/bin/python benchmarks/calibrate_engines.py [--per-engine 16] [--rounds 1] [--out FILE]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdsim.engine_fit import calibrate_rows, is_held_out, print_result, write_result  # noqa: E402
from pdsim.validate import MOE_MODELS, read_measured, silicon_sample_path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-engine", type=int, default=16, help="fit rows and held-out rows per engine (sampled)")
    ap.add_argument("--holdout", type=float, default=0.5)
    ap.add_argument("--split-by", choices=["row", "model"], default="model")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--requests-per-client", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the fitted engines YAML here")
    args = ap.parse_args()
    path = silicon_sample_path()
    rows = [(r, w) for r, w in read_measured(path) if w is None and r["model"] not in MOE_MODELS.values()
            and r["device"] in ("h100-sxm", "h200")]
    rng = np.random.default_rng(args.seed)
    picked = []
    for eng in sorted({r["engine"] for r, _ in rows}):
        for held in (False, True):
            part = [x for x in rows if x[0]["engine"] == eng and is_held_out(x[0], args.holdout, args.split_by) == held]
            if len(part) > args.per_engine:
                part = [part[i] for i in sorted(rng.choice(len(part), args.per_engine, replace=False).tolist())]
            picked += part
    models = sorted({r["model"] for r, _ in rows})
    held_models = [m for m in models if is_held_out({"model": m, "id": m}, args.holdout, args.split_by)]
    print(f"{path.name}: {len(rows)} dense H100/H200 rows; split by {args.split_by} "
          f"({'held-out models: ' + ', '.join(held_models) if args.split_by == 'model' else f'{args.holdout:.0%}'}); "
          f"simulating a sample of {len(picked)} ({args.per_engine} fit + {args.per_engine} held out per engine at "
          f"most, seed {args.seed}), {args.rounds} round(s), {args.requests_per_client} requests per client")
    t0 = time.perf_counter()
    res = calibrate_rows(picked, f"{path.name} (dense H100/H200 sample)", args.holdout, args.split_by,
                         args.rounds, "both", args.requests_per_client, None, progress=False)
    print_result(res)
    print(f"wall {time.perf_counter() - t0:.0f} s")
    if args.out:
        write_result(res, args.out)


if __name__ == "__main__":
    main()
