"""Cross-check two independent public measurements of the same GPU SKU: GEMM times of the
imported aiconfigurator profile (TRT-LLM's GEMMs, interpolated on its (m, n, k) grid) against
Vidur's (Sarathi-Serve linear layers, exact model shapes), at the shapes Vidur measured.

    python benchmarks/check_aic_vs_vidur.py
"""
import statistics
import time
from pathlib import Path

from pdsim.devices import load_profile_file

PROFILES = Path(__file__).resolve().parents[1] / "calibration" / "profiles"
M_VALUES = (1, 8, 64, 256, 1024, 4096)


def compare(aic: str, vidur: str) -> tuple[list[float], dict]:
    a, v = load_profile_file(PROFILES / f"{aic}.yaml"), load_profile_file(PROFILES / f"{vidur}.yaml")
    ratios, sources = [], {}
    for t in v.spec.measured.gemm:
        for m, tv in zip(t.m, t.time_s):
            if m in M_VALUES:
                r = a.gemm_lookup(m, t.n, t.k, 2.0)
                sources[r.source] = sources.get(r.source, 0) + 1
                if r.source != "roofline":
                    ratios.append(r.time_s / tv)
    return ratios, sources


if __name__ == "__main__":
    t0 = time.perf_counter()
    for gpu, aic, vid in (("A100", "a100_sxm-trtllm-aic", "a100-vidur"), ("H100", "h100_sxm-trtllm-aic", "h100-vidur")):
        ratios, sources = compare(aic, vid)
        q = statistics.quantiles(ratios, n=10)
        print(f"{gpu}: {len(ratios)} GEMM points (m in {M_VALUES}); aiconfigurator / Vidur time: median "
              f"{statistics.median(ratios):.2f}, p10 {q[0]:.2f}, p90 {q[-1]:.2f}; aiconfigurator lookups {sources}")
    print(f"{time.perf_counter() - t0:.1f} s")
