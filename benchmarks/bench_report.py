"""Report building must not dominate a run.  Times, for the quickstart scenario (3 topologies) at N requests:

  simulate            the three simulations
  write (no report)   requests.csv, timeseries.csv, summary.json
  report (in run)     build_report on the frames already in memory, as `pdsim run` does now
  report (from files) `pdsim report DIR`: re-reading the CSVs first
  import              `import pdsim.report` in a fresh interpreter
  before              the report of commit dc1ac20 (matplotlib PNGs, from files, import included) in a fresh
                      interpreter, when git can show that commit

Run: .venv/bin/python benchmarks/bench_report.py [N ...]   (default 1500 10000)
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdsim import config, metrics  # noqa: E402
from pdsim.output import write_outputs  # noqa: E402
from pdsim.simulation import simulate  # noqa: E402

BEFORE = "dc1ac20"


def _fresh(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def _old_report(tmp: Path) -> Path | None:
    """The report module and template of BEFORE, as a stand-alone package in tmp (None without git)."""
    pkg = tmp / "oldreport"
    (pkg / "templates").mkdir(parents=True, exist_ok=True)
    try:
        for src, dst in (("pdsim/report.py", pkg / "report.py"),
                         ("pdsim/templates/report.html.j2", pkg / "templates" / "report.html.j2")):
            dst.write_bytes(subprocess.run(["git", "show", f"{BEFORE}:{src}"], cwd=REPO, capture_output=True,
                                           check=True).stdout)
    except (OSError, subprocess.CalledProcessError):
        return None
    (pkg / "__init__.py").write_text("")
    return pkg


def main(sizes: list[int]) -> None:
    print(f"{'requests':>8} {'rows':>7} {'simulate s':>10} {'write s':>8} {'report s':>9} {'from files s':>12} "
          f"{'import s':>8} {'before s':>8} {'KiB':>6}")
    for n in sizes:
        sc = config.load(REPO / "scenarios/quickstart.yaml", [f"workload.num_requests={n}"])
        t0 = time.perf_counter()
        res = simulate(sc)
        t_sim = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "run"
            t0 = time.perf_counter()
            summary = write_outputs(res, sc, out, report=False)
            t_write = time.perf_counter() - t0
            df, ts = metrics.requests_frame(res), metrics.timeseries_frame(res)
            from pdsim.report import build_report
            build_report(out, progress=False, df=df, summary=summary, ts=ts)       # warm: imports done
            t0 = time.perf_counter()
            build_report(out, progress=False, df=df, summary=summary, ts=ts)
            t_rep = time.perf_counter() - t0
            t0 = time.perf_counter()
            build_report(out, progress=False)
            t_files = time.perf_counter() - t0
            kib = (out / "report.html").stat().st_size / 1024
            t_imp = _fresh("import time; t = time.perf_counter(); import pdsim.report; "
                           "print(time.perf_counter() - t)")
            pkg = _old_report(Path(d))
            t_before = float("nan")
            if pkg is not None:
                t_before = _fresh(f"import sys, time; sys.path.insert(0, {str(pkg.parent)!r}); "
                                  f"t = time.perf_counter(); from oldreport.report import build_report; "
                                  f"build_report({str(out)!r}, progress=False); print(time.perf_counter() - t)")
        print(f"{n:>8} {len(df):>7} {t_sim:>10.2f} {t_write:>8.2f} {t_rep:>9.2f} {t_files:>12.2f} {t_imp:>8.2f} "
              f"{t_before:>8.2f} {kib:>6.0f}", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1500, 10000])
