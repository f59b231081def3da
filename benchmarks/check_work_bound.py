"""How much linear-layer work per second do the measured silicon rows imply?  pdsim validate's work bound.

For every usable row of NVIDIA's silicon sample (aiconfigurator-core; install it with ``pip install
'.[aic]'``): requests per second by Little's law at the measured concurrency (an estimate: it overstates a
short run's rate) x the linear layers' FLOPs per request, over the GPUs at pdsim's GEMM ceiling for them
(:func:`pdsim.validate.implied_gemm_util`: datasheet peak x gemm_max x the fp8 fraction; above 1 pdsim's
kernels cannot serve that rate) and at their datasheet peak (:func:`pdsim.validate.implied_peak_share`; above
1 no GPU can).  Prints, per engine | GPU | model | precision | harness, the rows, the median and largest
ceiling share, how many exceed 1, and the largest peak share.

``--simulate ENGINE|GPU|MODEL`` (e.g. ``vllm-v1|h200|llama-3.1-8b``; every precision and harness of it) then
simulates those rows three ways, fresh prompts (what pdsim validate assumes), the first ``--shared`` tokens
of every prompt the same, and every prompt identical, the last two with prefix caching on (``pdsim validate
--shared-prefix-tokens``), and prints measured against simulated mean TTFT / TPOT per row and the MAPE of
each way (``--requests-per-client``, default 10 as pdsim validate; more for steadier means)::

    .venv/bin/python benchmarks/check_work_bound.py
    .venv/bin/python benchmarks/check_work_bound.py --simulate 'vllm-v1|h200|llama-3.1-8b' --shared 512
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from pdsim.validate import implied_gemm_util, implied_peak_share, read_measured, silicon_sample_path, simulate_row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", help="silicon CSV (default: the installed aiconfigurator-core's)")
    ap.add_argument("--simulate", metavar="ENGINE|GPU|MODEL", help="simulate this group's rows three ways")
    ap.add_argument("--shared", type=int, default=512, help="shared prefix tokens of the middle way (default 512)")
    ap.add_argument("--requests-per-client", type=int, default=10, help="closed-loop requests per client (default 10)")
    args = ap.parse_args()
    rows = [r for r, why in read_measured(args.csv or silicon_sample_path()) if why is None]
    groups = defaultdict(list)
    for r in rows:
        r["implied_gemm_util"] = implied_gemm_util(r)
        r["implied_peak_share"] = implied_peak_share(r)
        groups[(r["engine"], r["device"], r["model"], r["weight_dtype"], r.get("harness", ""))].append(r)
    print(f"{len(rows)} usable rows; requests/s (Little's law) x linear FLOPs per request, over the GPUs at "
          f"pdsim's GEMM ceiling (median, max, rows > 1) and at the datasheet peak (max)")
    print(f"{'engine|GPU|model|precision|harness':58s} {'rows':>5s} {'median':>7s} {'max':>6s} {'>1':>4s} "
          f"{'peak max':>9s}")
    for key, rs in sorted(groups.items(), key=lambda kv: -max(r["implied_gemm_util"] or 0 for r in kv[1])):
        u = np.array([r["implied_gemm_util"] for r in rs if r["implied_gemm_util"] is not None])
        p = max(r["implied_peak_share"] or 0.0 for r in rs)
        print(f"{'|'.join(key):58s} {len(rs):5d} {np.median(u):7.2f} {u.max():6.2f} {int((u > 1).sum()):4d} "
              f"{p:9.2f}")
    if not args.simulate:
        return
    eng, gpu, model = args.simulate.split("|")
    mine = [r for r in rows if (r["engine"], r["device"], r["model"]) == (eng, gpu, model)]
    if not mine:
        raise SystemExit(f"no usable rows of {args.simulate}")
    print(f"\n{args.simulate}: {len(mine)} rows, measured vs simulated mean TTFT / TPOT (ms), "
          f"{args.requests_per_client} requests per client; fresh prompts, {args.shared} shared tokens (prefix "
          f"cache on), every prompt identical (prefix cache on)")
    ways = {"fresh": lambda r: 0, f"shared {args.shared}": lambda r: args.shared, "identical": lambda r: r["isl"]}
    ape = {w: ([], []) for w in ways}
    t0 = time.perf_counter()
    for r in mine:
        line = (f"tp{r['tp']} {r['isl']}x{r['osl']} c{r['concurrency']:<4d} u={r['implied_gemm_util']:.2f} "
                f"measured {r['ttft_ms']:7.1f} / {r['tpot_ms']:6.2f}")
        for w, shared in ways.items():
            s = simulate_row(r, requests_per_client=args.requests_per_client, shared_prefix=shared(r))
            ape[w][0].append(abs(s["sim_ttft_ms"] / r["ttft_ms"] - 1) * 100)
            ape[w][1].append(abs(s["sim_tpot_ms"] / r["tpot_ms"] - 1) * 100)
            line += f" | {w} {s['sim_ttft_ms']:7.1f} / {s['sim_tpot_ms']:6.2f}"
        print(line, flush=True)
    for w, (a, b) in ape.items():
        print(f"{w:>12s}: TTFT MAPE {np.mean(a):6.1f}%  TPOT MAPE {np.mean(b):6.1f}%")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
