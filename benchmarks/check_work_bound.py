"""Which measured silicon rows could a GPU have produced?  The work bound of pdsim validate, per group.

For every usable row of NVIDIA's silicon sample (aiconfigurator-core; install it with ``pip install
'.[aic]'``), :func:`pdsim.validate.implied_gemm_util`: requests per second by Little's law at the measured
concurrency x the linear layers' FLOPs per request, over the GPUs' best GEMM rate (datasheet peak x
gemm_max x the fp8 fraction).  Above 1 no schedule does that work in that time.  Prints, per engine | GPU |
model | precision | harness, the rows, the median and largest value and how many exceed 1.

``--simulate GROUP`` (e.g. ``vllm-v1|h200|llama-3.1-8b``) then simulates that group's rows three ways, fresh
prompts (what pdsim validate assumes), the first ``--shared`` tokens of every prompt the same, and every
prompt identical, the last two with prefix caching on (``pdsim validate --shared-prefix-tokens``), and prints
measured against simulated mean TTFT / TPOT per row and the MAPE of each way::

    .venv/bin/python benchmarks/check_work_bound.py
    .venv/bin/python benchmarks/check_work_bound.py --simulate 'vllm-v1|h200|llama-3.1-8b' --shared 512
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from pdsim.validate import implied_gemm_util, read_measured, silicon_sample_path, simulate_row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", help="silicon CSV (default: the installed aiconfigurator-core's)")
    ap.add_argument("--simulate", metavar="ENGINE|GPU|MODEL", help="simulate this group's rows three ways")
    ap.add_argument("--shared", type=int, default=512, help="shared prefix tokens of the middle way (default 512)")
    args = ap.parse_args()
    rows = [r for r, why in read_measured(args.csv or silicon_sample_path()) if why is None]
    groups = defaultdict(list)
    for r in rows:
        r["implied_gemm_util"] = implied_gemm_util(r)
        groups[(r["engine"], r["device"], r["model"], r["weight_dtype"], r.get("harness", ""))].append(r)
    print(f"{len(rows)} usable rows; implied GEMM use = requests/s x linear FLOPs per request / (GPUs x best GEMM "
          f"FLOP/s)")
    print(f"{'engine|GPU|model|precision|harness':58s} {'rows':>5s} {'median':>7s} {'max':>6s} {'>1':>4s}")
    for key, rs in sorted(groups.items(), key=lambda kv: -max(r["implied_gemm_util"] or 0 for r in kv[1])):
        u = np.array([r["implied_gemm_util"] for r in rs if r["implied_gemm_util"] is not None])
        print(f"{'|'.join(key):58s} {len(rs):5d} {np.median(u):7.2f} {u.max():6.2f} {int((u > 1).sum()):4d}")
    if not args.simulate:
        return
    eng, gpu, model = args.simulate.split("|")
    mine = [r for r in rows if (r["engine"], r["device"], r["model"]) == (eng, gpu, model)]
    if not mine:
        raise SystemExit(f"no usable rows of {args.simulate}")
    print(f"\n{args.simulate}: {len(mine)} rows, measured vs simulated mean TTFT / TPOT (ms); fresh prompts, "
          f"{args.shared} shared tokens (prefix cache on), every prompt identical (prefix cache on)")
    ways = {"fresh": lambda r: 0, f"shared {args.shared}": lambda r: args.shared, "identical": lambda r: r["isl"]}
    ape = {w: ([], []) for w in ways}
    t0 = time.perf_counter()
    for r in mine:
        line = (f"tp{r['tp']} {r['isl']}x{r['osl']} c{r['concurrency']:<4d} u={r['implied_gemm_util']:.2f} "
                f"measured {r['ttft_ms']:7.1f} / {r['tpot_ms']:6.2f}")
        for w, shared in ways.items():
            s = simulate_row(r, shared_prefix=shared(r))
            ape[w][0].append(abs(s["sim_ttft_ms"] / r["ttft_ms"] - 1) * 100)
            ape[w][1].append(abs(s["sim_tpot_ms"] / r["tpot_ms"] - 1) * 100)
            line += f" | {w} {s['sim_ttft_ms']:7.1f} / {s['sim_tpot_ms']:6.2f}"
        print(line, flush=True)
    for w, (a, b) in ape.items():
        print(f"{w:>12s}: TTFT MAPE {np.mean(a):6.1f}%  TPOT MAPE {np.mean(b):6.1f}%")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
