"""Where the time goes: cProfile's top self-time entries (a text flame graph) for

  quickstart   `pdsim run scenarios/quickstart.yaml --no-report` as a whole process (imports, simulation,
               outputs), in a fresh interpreter;
  colocated-4  the full Azure conversation trace on 4 colocated H100 replicas (simulate() only);
  3p1d         the same trace on 3 prefill + 1 decode H100s (simulate() only).

cProfile adds a fixed cost per Python call, so call-heavy code looks heavier than it is: read the
ranking and the call counts, take wall figures from bench_speed.py / bench_start.py.
Run: .venv/bin/python benchmarks/profile_speed.py [quickstart|colocated-4|3p1d ...] [--top N]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FULL = REPO.parent / "shared" / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
TRACE = FULL if FULL.is_file() else REPO / "scenarios" / "traces" / "azure_conv_10min.csv"
TOPOS = {"colocated-4": {"kind": "colocated", "replicas": 4, "device": "h100-sxm"},
         "3p1d": {"kind": "disaggregated", "prefill": {"instances": 3, "device": "h100-sxm"},
                  "decode": {"instances": 1, "device": "h100-sxm"}, "kv_link": {"preset": "infiniband"}}}


def show(stats: pstats.Stats, top: int, title: str) -> None:
    out = io.StringIO()
    stats.stream = out
    stats.sort_stats("tottime").print_stats(top)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    total = next((ln for ln in lines if "function calls" in ln), "")
    print(f"## {title}: {total.strip()}")
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    for ln in lines[start:]:
        print(ln.replace(str(REPO) + "/", "").replace(sys.prefix + "/lib/python3.11/site-packages/", ""))
    print()


def quickstart(top: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        prof, out = os.path.join(tmp, "q.prof"), os.path.join(tmp, "out")
        subprocess.run([sys.executable, "-m", "cProfile", "-o", prof, "-m", "pdsim", "run",
                        str(REPO / "scenarios" / "quickstart.yaml"), "--no-report", "--quiet", "--out", out],
                       check=True, stdout=subprocess.DEVNULL, cwd=REPO)
        show(pstats.Stats(prof), top, "pdsim run scenarios/quickstart.yaml --no-report (whole process)")


def trace_run(name: str, top: int) -> None:
    sys.path.insert(0, str(REPO))
    from pdsim import config
    from pdsim.simulation import simulate
    sc = config.parse({"model": "llama-3.1-8b", "workload": {"arrival": "trace", "trace": {"path": str(TRACE)}},
                       "topologies": {name: TOPOS[name]}}, "profile")
    pr = cProfile.Profile()
    pr.enable()
    simulate(sc)
    pr.disable()
    show(pstats.Stats(pr), top, f"simulate(): {TRACE.name}, {name}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="*", default=["quickstart", "colocated-4", "3p1d"],
                    choices=["quickstart", "colocated-4", "3p1d"])
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    for w in a.what:
        quickstart(a.top) if w == "quickstart" else trace_run(w, a.top)
