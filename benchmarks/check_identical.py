"""Byte-identical outputs of two pdsim checkouts: the guard for speed work that must change no result.

For each case (a scenario and its --set overrides) runs ``pdsim run SCENARIO --no-report --quiet`` (table
stdout) and ``--format json`` with each checkout's pdsim (``PYTHONPATH``) and compares requests.csv,
timeseries.csv and stdout byte for byte, and summary.json with its wall-clock fields (any key named
``wall_s``) dropped.  The base checkout is typically ``git archive <commit> | tar -x -C DIR``.
Run: .venv/bin/python benchmarks/check_identical.py --base DIR [--head DIR] [--only NAME ...]
Exit status 1 if anything differs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (name, scenario, --set overrides and flags): paths that differ (engine presets, chunked and whole prefill, PD transfers,
# prefix caching, speculative decoding, DP attention and MLA, pipeline parallelism, faults, a trace, closed loop)
CASES = [
    ("quickstart", "scenarios/quickstart.yaml", []),
    ("prefix-synthetic", "scenarios/prefix_synthetic_chat.yaml", ["workload.num_requests=600"]),
    ("spec-decode", "scenarios/spec-decode.yaml", ["workload.num_requests=200"]),
    ("moe-dp-attention", "scenarios/moe-deepseek-dp-attention.yaml", ["workload.num_requests=150"]),
    ("moe-pd", "scenarios/moe-deepseek-pd.yaml", ["workload.num_requests=150"]),
    ("faults-link-down", "scenarios/faults-link-down.yaml", []),
    ("pp-llama70b", "scenarios/pp-llama70b-a100.yaml", ["workload.num_requests=200"]),
    ("engines-closed-loop", "scenarios/engines-closed-loop.yaml", []),
    ("disagg-azure-code", "scenarios/disagg_azure_code.yaml", []),
    # the one-event-per-step loop (no fast-path windows), which prices every step through CostModel.step
    ("quickstart-step-by-step", "scenarios/quickstart.yaml", ["workload.num_requests=400", "--step-by-step"]),
]


def _drop_wall(x):
    if isinstance(x, dict):
        return {k: _drop_wall(v) for k, v in x.items() if k != "wall_s"}
    if isinstance(x, list):
        return [_drop_wall(v) for v in x]
    return x


def run(root: Path, scenario: str, sets: list[str], out: Path, fmt: str) -> bytes:
    env = dict(os.environ, PYTHONPATH=str(root))
    cmd = [sys.executable, "-m", "pdsim", "run", str(REPO / scenario), "--no-report", "--quiet", "--out", str(out),
           "--format", fmt]
    for s in sets:
        cmd += [s] if s.startswith("--") else ["--set", s]
    return subprocess.run(cmd, env=env, cwd=root, check=True, capture_output=True).stdout


def compare(base: Path, head: Path, name: str, scenario: str, sets: list[str]) -> list[str]:
    diffs = []
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("table", "json"):
            outs = {}
            for label, root in (("base", base), ("head", head)):
                out = Path(tmp) / f"{label}-{fmt}"
                outs[label] = (out, run(root, scenario, sets, out, fmt))
            (ob, sb), (oh, sh) = outs["base"], outs["head"]
            if sb != sh:
                diffs.append(f"stdout ({fmt})")
            if fmt == "json":
                continue      # the files of the json run are the table run's
            for f in ("requests.csv", "timeseries.csv"):
                if (ob / f).read_bytes() != (oh / f).read_bytes():
                    diffs.append(f)
            jb = _drop_wall(json.loads((ob / "summary.json").read_text()))
            jh = _drop_wall(json.loads((oh / "summary.json").read_text()))
            if json.dumps(jb, sort_keys=True) != json.dumps(jh, sort_keys=True):
                diffs.append("summary.json")
    return diffs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the reference checkout (its pdsim/ is run)")
    ap.add_argument("--head", default=str(REPO), help="the checkout under test (default: this one)")
    ap.add_argument("--only", nargs="*", help="case names to run (default: all)")
    a = ap.parse_args()
    bad = 0
    for name, scenario, sets in CASES:
        if a.only and name not in a.only:
            continue
        diffs = compare(Path(a.base).resolve(), Path(a.head).resolve(), name, scenario, sets)
        print(f"{name:22s} {'IDENTICAL' if not diffs else 'DIFFERS: ' + ', '.join(diffs)}", flush=True)
        bad += bool(diffs)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
